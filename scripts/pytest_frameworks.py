"""pytest in a process that imported PyTorch and JAX before anything of raggedattn.

A training job imports its framework first; the library's native code then loads into a process
that already holds the framework's C++ and CUDA runtimes. The GPU machine's test runs go through
here so that they see what such a job sees. Arguments are pytest's.
"""

import importlib.util
import sys

for framework in ("torch", "jax"):
    if importlib.util.find_spec(framework) is not None:
        __import__(framework)

import pytest  # noqa: E402  (after the frameworks, on purpose)

if __name__ == "__main__":
    loaded = [name for name in ("torch", "jax") if name in sys.modules]
    print(f"pytest_frameworks: imported {', '.join(loaded) or 'no framework'} first", flush=True)
    sys.exit(pytest.main(sys.argv[1:]))

"""pytest in a process that imported PyTorch and JAX before anything of raggedattn.

A training job imports its framework first; the library's native code then loads into a process
that already holds the framework's C++ and CUDA runtimes. The GPU machine's test runs go through
here so that they see what such a job sees. Arguments are pytest's; with pytest-xdist's `-n N`
each worker imports the frameworks first too (tests/python/conftest.py, through
RATTN_PYTEST_PRELOAD).
"""

import importlib.util
import os
import sys

os.environ["RATTN_PYTEST_PRELOAD"] = "1"  # for worker processes (tests/python/conftest.py)

for framework in ("torch", "jax"):
    if importlib.util.find_spec(framework) is not None:
        __import__(framework)

import pytest  # noqa: E402  (after the frameworks, on purpose)

if __name__ == "__main__":
    loaded = [name for name in ("torch", "jax") if name in sys.modules]
    print(f"pytest_frameworks: imported {', '.join(loaded) or 'no framework'} first", flush=True)
    sys.exit(pytest.main(sys.argv[1:]))

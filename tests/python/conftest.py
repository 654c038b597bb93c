"""Where scripts/pytest_frameworks.py started the run (it sets RATTN_PYTEST_PRELOAD), every test
process imports PyTorch and JAX before anything of raggedattn, pytest-xdist's workers included:
the library's native code then loads beside the frameworks' runtimes, as in a training job."""

import importlib.util
import os

if os.environ.get("RATTN_PYTEST_PRELOAD") == "1":
    for _framework in ("torch", "jax"):
        if importlib.util.find_spec(_framework) is not None:
            __import__(_framework)

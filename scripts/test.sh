#!/usr/bin/env bash
# Every test: C++ (CTest: CPU tests, and GPU tests that skip where there is no GPU) and Python
# (pytest: JAX on the CPU everywhere; PyTorch and GPU tests where those are present).
# Run scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
ctest --test-dir build --output-on-failure -j "$(nproc)"
.venv/bin/python -m pytest tests/python -q

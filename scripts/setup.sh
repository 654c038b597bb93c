#!/usr/bin/env bash
# Everything a fresh machine needs, from the project's own files: Debian packages (build tools,
# GoogleTest), the C++/CUDA build (CUDA where nvcc exists), and a Python environment (.venv, from
# PyPI) with the package installed over the library just built. Safe to run again.
#
#   RATTN_PRESET=default|ci|cpu   CMake preset (default: default; ci adds -Werror)
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${RATTN_PRESET:-default}

missing=()
for pkg in cmake ninja-build g++ libgtest-dev libgmock-dev python3-dev python3-venv python3-pip; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "setup: installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# nvcc is looked for where the CUDA toolkit installs it.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

echo "setup: building (preset $preset)"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"

echo "setup: Python environment .venv"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r python/requirements-dev.txt
# The package links the library built above (no second compile of the kernels).
RATTN_PYTHON_PREBUILT_LIBRARY="$PWD/build/src/libraggedattn.so" RATTN_CUDA=OFF \
  .venv/bin/python -m pip install -q --no-build-isolation --no-deps .
echo "setup: done"

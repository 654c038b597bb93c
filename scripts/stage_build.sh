#!/usr/bin/env bash
# Copies the binaries a GPU session needs out of a build into a small folder (the build folder
# itself, with its object files, is too large to ship to a remote machine).
#   scripts/stage_build.sh BUILD_DIR DEST [--lib-only]
# --lib-only: just libraggedattn.so, directly in DEST (another build to measure against with
# `gpu_session.sh ... ab`; the command and the tests load it through LD_LIBRARY_PATH).
set -eu
b=$1 d=$2
rm -rf "$d"
if [ "${3:-}" = "--lib-only" ]; then
  mkdir -p "$d"
  cp "$b/src/libraggedattn.so" "$d/"
  du -sh "$d"
  exit 0
fi
mkdir -p "$d/src" "$d/tools" "$d/tests/gpu"
cp "$b/src/libraggedattn.so" "$d/src/"
cp "$b/tools/raggedattn" "$d/tools/"
[ -f "$b/tests/gpu/raggedattn_gpu_tests" ] && cp "$b/tests/gpu/raggedattn_gpu_tests" "$d/tests/gpu/"
du -sh "$d"

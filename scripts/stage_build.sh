#!/usr/bin/env bash
# Copies the binaries a GPU session needs out of a build into a small folder (the build folder
# itself, with its object files, is too large to ship to a remote machine).
#   scripts/stage_build.sh BUILD_DIR DEST
set -eu
b=$1 d=$2
rm -rf "$d"
mkdir -p "$d/src" "$d/tools" "$d/tests/gpu"
cp "$b/src/libraggedattn.so" "$d/src/"
cp "$b/tools/raggedattn" "$d/tools/"
[ -f "$b/tests/gpu/raggedattn_gpu_tests" ] && cp "$b/tests/gpu/raggedattn_gpu_tests" "$d/tests/gpu/"
du -sh "$d"

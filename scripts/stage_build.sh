#!/usr/bin/env bash
# Copies the binaries a GPU session needs out of a build into a small folder (the build folder
# itself, with its object files, is too large to ship to a remote machine).
#   scripts/stage_build.sh BUILD_DIR DEST [--lib-only] [--xz]
# --lib-only: just libraggedattn.so, directly in DEST (another build to measure against with
# `gpu_session.sh ... ab`; the command and the tests load it through LD_LIBRARY_PATH).
# --xz: every staged file compressed to FILE.xz (a library of 18 MB becomes ~2 MB, so several
# builds fit what a remote call carries); gpu_session.sh and gpu_candidate.sh restore them
# (restore_staged.sh) before they start.
set -eu
b=$1 d=$2
shift 2
lib_only=0 xz=0
for opt in "$@"; do
  case $opt in
    --lib-only) lib_only=1 ;;
    --xz) xz=1 ;;
    *) echo "stage_build.sh: unknown option $opt" >&2; exit 2 ;;
  esac
done
rm -rf "$d"
if [ $lib_only = 1 ]; then
  mkdir -p "$d"
  cp "$b/src/libraggedattn.so" "$d/"
else
  mkdir -p "$d/src" "$d/tools" "$d/tests/gpu"
  cp "$b/src/libraggedattn.so" "$d/src/"
  cp "$b/tools/raggedattn" "$d/tools/"
  [ -f "$b/tests/gpu/raggedattn_gpu_tests" ] && cp "$b/tests/gpu/raggedattn_gpu_tests" "$d/tests/gpu/"
fi
[ $xz = 1 ] && find "$d" -type f ! -name '*.xz' -exec xz -T0 -6 {} +
du -sh "$d"

#!/usr/bin/env bash
# Restores the files staged with `stage_build.sh --xz` below each DIR (Python's lzma: no xz binary
# needed on the GPU machine), keeping their modes.
#   scripts/restore_staged.sh DIR ...
set -eu
find "$@" -name '*.xz' -print0 | xargs -0 -r python3 -c '
import lzma, os, shutil, sys
for f in sys.argv[1:]:
    with lzma.open(f) as src, open(f[:-3], "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(f[:-3], 0o755)
    os.remove(f)'

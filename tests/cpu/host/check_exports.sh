#!/bin/sh
# libraggedattn's dynamic symbol table holds its API alone (src/exports.map), and, where the C++
# runtime is linked in (RATTN_PRIVATE_CXX_RUNTIME), the library asks the loader for no C++ runtime.
#   check_exports.sh LIBRARY PRIVATE_RUNTIME(ON|OFF)
set -eu
lib=$1
status=0
others=$(nm -D --defined-only "$lib" | awk '{print $NF}' | c++filt |
         grep -v -E '^(rattn_[a-z_]+|raggedattn::.*)$' || true)
if [ -n "$others" ]; then
  echo "FAIL: $lib exports symbols outside its API:"
  echo "$others" | head -n 20
  status=1
fi
case $2 in
  ON|on|1|TRUE|true)
    needed=$(readelf -d "$lib" | grep NEEDED | grep -E 'libstdc\+\+|libgcc_s' || true)
    if [ -n "$needed" ]; then
      echo "FAIL: $lib loads a shared C++ runtime:"
      echo "$needed"
      status=1
    fi ;;
esac
[ $status -eq 0 ] && echo "PASS: $(nm -D --defined-only "$lib" | wc -l) exported symbols, all rattn_* or raggedattn::"
exit $status

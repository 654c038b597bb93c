#!/usr/bin/env bash
# Fails where ptxas serialized the wgmma instructions of a Hopper kernel ("wgmma.mma_async
# instructions are serialized due to ...": C7515 for accumulators defined, C7514 for accumulators
# read between a wgmma and its wait, C7512 for registers, and any other reason) or injected a
# warpgroup.wait of its own (C7517). That costs up to half the kernel's speed and no correctness
# test can see it (PERFORMANCE.md item 58: the forward at 382 instead of 689 TFLOP/s on
# one_doc_16k, every check passing; item 79: the backward 13% slower). The warpgroup.arrive that
# ptxas adds before a wgmma whose register operands were just written (C7519: the forward's last
# P V, whose k-steps are a run-time count) is counted, not failed. Recompiles each object of the
# sm_90a target with its own build command plus -Xptxas -v (into a scratch file) and reads
# ptxas's report; prints each kernel's spills too. Also fails where the forward's grid kernel
# (fwd_kernel) spills at all: how many of S's k-steps take Q from registers (fwd_q_reg_ksteps,
# core/sm90_shapes.hpp) is the most that fit without spilling, so a spill there means that choice, or
# the code around it, needs another look. Needs a Ninja build (CTest runs it as
# sm90.wgmma_not_serialized).
#   scripts/check_ptxas.sh BUILD_DIR
#   scripts/check_ptxas.sh --report LOG...   (reads saved ptxas -v reports only: no build needed;
#                                             tests/python/test_check_ptxas.py)
set -euo pipefail
status=0

# Reads one ptxas -v report (LOG), naming it NAME; sets status=1 where it fails the check.
read_report() {
  local log=$1 name=$2
  local serial_re='wgmma.mma_async instructions are serialized|warpgroup.wait is injected'
  local serialized arrives spills nonzero grid_spills
  serialized=$(grep -Ec "$serial_re" "$log" || true)
  arrives=$(grep -c 'warpgroup.arrive is injected' "$log" || true)
  spills=$(grep -c 'bytes spill stores' "$log" || true)
  nonzero=$(grep 'bytes spill stores' "$log" | grep -vc ' 0 bytes spill stores' || true)
  echo "$name: $spills kernels, $nonzero with spills, $serialized serialized wgmma or injected" \
    "waits, $arrives injected arrives"
  if [ "$serialized" -gt 0 ]; then
    grep -E "$serial_re" "$log" | sed -E \
      -e 's/.*\((C[0-9]+)\).* due to (.*) (in|for) the function (.*)/  \1 \4: \2/' \
      -e 's/.*\((C[0-9]+)\) (warpgroup.wait is injected).*function (.*)/  \1 \3: \2/' | sort -u
    status=1
  fi
  # Each function's spill line follows its "Function properties for NAME" line.
  grid_spills=$(awk '/Function properties for/ { f = $NF }
    /bytes spill stores/ && f ~ /sm9010fwd_kernel/ {
      for (i = 1; i <= NF; ++i) if ($i == "spill" && $(i + 1) == "stores,") n = $(i - 2)
      if (n + 0 > 0) print "  forward grid kernel spills " n " bytes: " f }' "$log")
  if [ -n "$grid_spills" ]; then
    echo "$grid_spills"
    echo "check_ptxas: the forward's grid kernel must not spill (see fwd_q_reg_ksteps)" >&2
    status=1
  fi
}

if [ "${1:-}" = "--report" ]; then
  shift
  [ $# -gt 0 ] || { echo "check_ptxas: --report needs LOG files" >&2; exit 2; }
  for log in "$@"; do
    [ -r "$log" ] || { echo "check_ptxas: cannot read $log" >&2; exit 2; }
    read_report "$log" "$log"
  done
  exit $status
fi

build=$(cd "${1:-build}" && pwd)
objs=$(ninja -C "$build" -t targets all |
  grep -o '^src/cuda/CMakeFiles/raggedattn_cuda_sm90\.dir/sm90/[A-Za-z0-9_]*\.cu\.o' | sort -u)
[ -n "$objs" ] || { echo "check_ptxas: no sm_90a objects in $build" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for o in $objs; do
  cmd=$(ninja -C "$build" -t commands "$o" | tail -1)
  [[ $cmd == *"-o $o"* ]] || { echo "check_ptxas: no '-o $o' in the build command" >&2; exit 2; }
  (cd "$build" && eval "${cmd/-o $o/-o $tmp/x.o} -Xptxas -v") >"$tmp/log" 2>&1 ||
    { cat "$tmp/log"; echo "check_ptxas: $o does not compile" >&2; exit 2; }
  read_report "$tmp/log" "$o"
done
exit $status

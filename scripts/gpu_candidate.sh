#!/usr/bin/env bash
# Decides a candidate library in one GPU call: is it correct, and is it faster than the base?
#
#   scripts/gpu_candidate.sh BUILD_DIR OUT_DIR TAG=LIB_DIR [TAG=LIB_DIR ...]
#
# BUILD_DIR: a staged build of the base (scripts/stage_build.sh: src/libraggedattn.so,
# tools/raggedattn, tests/gpu/raggedattn_gpu_tests). LIB_DIR: the candidate's libraggedattn.so
# (stage_build.sh --lib-only; the base's command and tests run it through LD_LIBRARY_PATH, so the
# candidate may change the library only). Further TAG=LIB_DIR builds are timed beside it in parts
# 2 and 3 (say, a change alone and with the next one) but not verified: only the first is.
# Files staged with --xz are restored first.
#
# 1. Correctness, side by side (nothing here is timed): gpu_session.sh's check, tests, sanitize
#    and python steps (and peer_fa where PEER_FA_DIR is set), each a session of its own, with the
#    Hopper path's fp16 and random checks beside them, all on the candidate.
# 2. The candidates against the base, one standard workload at a time (bench/run.py --processes
#    PROCESSES, default 2), so the workloads timed before the limit keep their results.
# 3. FlashAttention-3 on the same workloads where ANCHORS_DIR holds anchors_fa3_jax.py and its
#    wheel imports, then head dims 64 and 256 for every build (bench/head_dims.py).
# Part 1 ends CORRECTNESS_S seconds (default 300) after the start, whatever its steps' own limits
# (gpu_session.sh's DEADLINE); each later part runs only while TOTAL seconds (default 540) leave it
# room: set TOTAL to the call's limit less a margin. summary.txt under OUT_DIR has one line per
# step (a step cut at its limit shows rc=124).
set -u
build=$(cd "$1" && pwd)
out=$2
shift 2
libs=()  # bench/run.py's --lib options, the verified candidate first
dirs=()
for spec in "$@"; do
  dir=$(cd "${spec#*=}" && pwd) || exit 2
  libs+=(--lib "${spec%%=*}=$dir")
  dirs+=("$dir")
done
[ ${#dirs[@]} -gt 0 ] || { echo "usage: $0 BUILD_DIR OUT_DIR TAG=LIB_DIR [TAG=LIB_DIR ...]" >&2; exit 2; }
cand=${dirs[0]}
repo=$(cd "$(dirname "$0")/.." && pwd)
total=${TOTAL:-540}
t0=$SECONDS
mkdir -p "$out"
summary="$out/summary.txt"
bash "$repo/scripts/restore_staged.sh" "$build" "${dirs[@]}"
for dir in "${dirs[@]}"; do
  [ -f "$dir/libraggedattn.so" ] || { echo "$dir holds no libraggedattn.so" >&2; exit 2; }
done
# The base's command and tests over the candidate's library, as one build for gpu_session.sh.
mixed=$(mktemp -d)
mkdir -p "$mixed/src" "$mixed/tools" "$mixed/tests/gpu"
cp "$build/tools/raggedattn" "$mixed/tools/"
cp "$build/tests/gpu/raggedattn_gpu_tests" "$mixed/tests/gpu/"
cp "$cand/libraggedattn.so" "$mixed/src/"
cli="$mixed/tools/raggedattn"
left() { echo $((total - (SECONDS - t0))); }
verdict() {  # log: its last verdict line
  grep -E '^(PASS|FAIL) \(|passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY|tests ran' "$1" | tail -n 1
}
export DEADLINE=$(($(date +%s) + ${CORRECTNESS_S:-300}))
part() {  # name limit command...: one summary line (exit status, time, verdict), by DEADLINE
  local name=$1 limit=$2 room=$((DEADLINE - $(date +%s)))
  shift 2
  [ "$limit" -gt "$room" ] && limit=$room
  [ "$limit" -lt 5 ] && limit=5
  timeout -k 10 "$limit" "$@" >"$out/$name.txt" 2>&1
  echo "$name rc=$? at $((SECONDS - t0)) s: $(verdict "$out/$name.txt")" >>"$summary"
}
session() {  # step ...: one gpu_session.sh over the candidate, a summary line per step
  local steps="$*"
  local dir="$out/session_${steps// /_}"
  bash "$repo/scripts/gpu_session.sh" "$mixed" "$dir" "$@" >"$dir.txt" 2>&1
  awk '/^== /{n = $2; sub(":", "", n)} /^   rc=/{print n, $1}' "$dir.txt" |
    while read -r step rc; do
      echo "$step $rc at $((SECONDS - t0)) s: $(verdict "$dir/$step.txt")" >>"$summary"
    done
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv >"$out/info.txt" 2>&1
# 1. Correctness, side by side.
(
  export LD_LIBRARY_PATH="$mixed/src"
  session check &
  session tests &
  session sanitize &
  if [ -n "${PEER_FA_DIR:-}" ]; then session python peer_fa & else session python & fi
  { part check_sm90_fp16 200 "$cli" check --backend cuda_sm90 --dtype fp16
    part check_random 200 "$cli" check --backend cuda_sm90 --random 12 --seed "$RANDOM"; } &
  wait
)
echo "correctness done at $((SECONDS - t0)) s" >>"$summary"
export DEADLINE=$(($(date +%s) + $(left)))

# 2. The candidates against the base, workload by workload.
for w in one_doc_16k docs_mixed_32k_full docs_mixed_32k docs_short_32k; do
  [ "$(left)" -lt 70 ] && break
  part "bench_$w" $(($(left) - 5)) python3 "$repo/bench/run.py" --cli "$build/tools/raggedattn" \
    --no-anchors --processes "${PROCESSES:-2}" --variants raggedattn "${libs[@]}" \
    --workloads "$w" --out "$out/bench_$w"
  grep -A2 '^| workload' "$out/bench_$w/latest.md" 2>/dev/null | sed -n '1p;3p' >>"$summary"
done

# 3. FlashAttention-3 on the same workloads, then head dims.
if [ -n "${ANCHORS_DIR:-}" ] && [ "$(left)" -gt 60 ] && python3 -c 'import flash_attn3_jax' 2>/dev/null; then
  part fa3 $(($(left) - 5)) env OUT="$out" python3 "$ANCHORS_DIR/anchors_fa3_jax.py"
  grep -E '^(one_doc|docs_)' "$out/fa3.txt" >>"$summary"
fi
if [ "$(left)" -gt 60 ]; then
  part head_dims $(($(left) - 5)) python3 "$repo/bench/head_dims.py" --cli "$build/tools/raggedattn" \
    --dims 64,256 --workloads one_doc_16k --dq-accum fp32 "${libs[@]}" --out "$out/head_dims"
fi
cat "$summary"
rm -rf "$mixed"

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
# 1. Correctness, every part side by side (nothing here is timed): `raggedattn check` in every
#    mode, the GPU tests, compute-sanitizer, tests/python with torch and jax imported and, where
#    PEER_FA_DIR is set, FlashAttention-2's varlen tests, all on the candidate.
# 2. The candidates against the base, one standard workload at a time (bench/run.py --processes
#    PROCESSES, default 2), so the workloads timed before the limit keep their results.
# 3. FlashAttention-3 on the same workloads where ANCHORS_DIR holds anchors_fa3_jax.py and its
#    wheel imports, then head dims 64 and 256 for every build (bench/head_dims.py).
# Part 1 has CORRECTNESS_S seconds (default 280); each later part runs only while TOTAL seconds
# (default 540) leave it room: set TOTAL to the call's limit less a margin. summary.txt under
# OUT_DIR has one line per part (a part cut at its limit shows rc=124).
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
find "$build" "${dirs[@]}" -name '*.xz' -print0 | xargs -0 -r python3 -c '
import lzma, os, shutil, sys
for f in sys.argv[1:]:
    with lzma.open(f) as src, open(f[:-3], "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(f[:-3], 0o755)
    os.remove(f)'
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

# Part 1 ends by CORRECTNESS_S seconds (default 280) whatever its parts' own limits say.
deadline=$((t0 + ${CORRECTNESS_S:-280}))
part() {  # name limit command...: one line in the summary (exit status, time, verdict line)
  local name=$1 limit=$2
  shift 2
  [ "$limit" -gt $((deadline - SECONDS)) ] && limit=$((deadline - SECONDS))
  [ "$limit" -lt 5 ] && limit=5
  timeout -k 10 "$limit" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  echo "$name rc=$rc at $((SECONDS - t0)) s: $(grep -E '^(PASS|FAIL) \(|passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY|tests ran' "$out/$name.txt" | tail -n 1)" >>"$summary"
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv >"$out/info.txt" 2>&1
# 1. Correctness, side by side.
sanitize() {  # tool name check-options...
  local tool=$1 name=$2
  shift 2
  part "$name" 200 compute-sanitizer --tool "$tool" --error-exitcode 9 "$cli" check "$@"
}
(
  export LD_LIBRARY_PATH="$mixed/src"
  part check_fp32 200 "$cli" check --backend cuda &
  part check_bf16 200 "$cli" check --backend cuda --dq-accum bf16 &
  part check_deterministic 200 "$cli" check --backend cuda --deterministic &
  { part check_portable 240 "$cli" check --backend cuda_portable
    part check_portable_deterministic 240 "$cli" check --backend cuda_portable --deterministic; } &
  { part check_sm90_fp16 200 "$cli" check --backend cuda_sm90 --dtype fp16
    part check_random 200 "$cli" check --backend cuda_sm90 --random 12 --seed "$RANDOM"; } &
  part gpu_tests 240 "$mixed/tests/gpu/raggedattn_gpu_tests" --gtest_brief=1 &
  { sanitize memcheck memcheck_fp32 --heads 4/2 --backend cuda
    sanitize memcheck memcheck_deterministic --heads 4/2 --backend cuda --deterministic
    sanitize memcheck memcheck_portable --heads 4/2 --backend cuda_portable --deterministic; } &
  { sanitize racecheck racecheck --backend cuda --heads 2/1
    sanitize synccheck synccheck --backend cuda --heads 2/1; } &
  steps=python
  [ -n "${PEER_FA_DIR:-}" ] && steps="python peer_fa"
  part python_session 300 bash "$repo/scripts/gpu_session.sh" "$mixed" "$out/python" $steps &
  wait
)
echo "correctness done at $((SECONDS - t0)) s" >>"$summary"
deadline=$((t0 + total))

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

#!/usr/bin/env bash
# One GPU session's work over a build made elsewhere (the GPU machine's time is scarce; compile
# before, run here): verification, the GPU tests, compute-sanitizer, the benchmark.
#
#   scripts/gpu_session.sh BUILD_DIR OUT_DIR [STEP ...]
#
# STEPs: info check tests sanitize repeat profile profile_source percycle bench anchors head_dims
# python pip_full peer_fa train ab (default: info check tests sanitize bench). `repeat` runs `check` REPEAT times (10)
# under REPEAT_TOOL (a compute-sanitizer tool, default synccheck; `none`: no tool) with
# REPEAT_ARGS (default `--backend cuda --heads 2/1`), writes one line per run (verdict, seed, each
# case's worst rel/bound) to repeat_summary.txt, keeps every failing run's output, and reruns each
# failing run's seed without the tool: a case that fails there too is its bound's, one that
# passes there points at the tool's timing (a race).
# BUILD_DIR holds src/libraggedattn.so, tools/raggedattn and tests/gpu/raggedattn_gpu_tests.
# `anchors` needs ANCHORS_DIR (the anchor scripts) and runs `head_dims` after the table
# (bench/head_dims.py: every Hopper head dim on two workloads' segments, both dQ modes). `python` installs the package over BUILD_DIR's
# library (no compiler run, no network) and runs tests/python with torch and jax imported first;
# `pip_full` installs it the other way (pip builds everything) and reruns the bad-input and torch
# tests; `peer_fa` runs FlashAttention-2's varlen tests (PEER_FA_DIR); `train` then runs
# examples/train_packed with every run, the corruption experiment included. `ab` needs
# AB_LIBS="TAG=DIR ...": other builds of libraggedattn.so (a branch's, staged with
# `scripts/stage_build.sh BUILD DEST --lib-only`, or several with scripts/stage_branches.sh); it runs the Hopper and determinism suites on
# each, then one benchmark of this build and every other one side by side (AB_PROCESSES=N: each in
# N processes, the median reported; bench/run.py --processes).
# Each step's log goes to OUT_DIR/<step>.txt.
set -u
# Files staged with `stage_build.sh --xz`, below BUILD_DIR and the AB_LIBS folders, restored.
bash "$(dirname "$0")/restore_staged.sh" "$1" $(for spec in ${AB_LIBS:-}; do echo "${spec#*=}"; done)
build=$(cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$2
shift 2
steps=${*:-info check tests sanitize bench}
mkdir -p "$out"
cli="$build/tools/raggedattn"
status=0

# A standard workload's problem as `raggedattn bench` options (bench/workloads.py: segments, heads,
# head dim, mask), so every step below profiles the workloads' own shapes.
workload_args() {  # name
  python3 -c "import sys; sys.path.insert(0, '$repo/bench'); from workloads import WORKLOADS, HQ, HKV, D
lens, causal = WORKLOADS['$1']
print('--segments', ','.join(map(str, lens)), '--heads', f'{HQ}/{HKV}', '--dim', D, '--causal' if causal else '')"
}

# DEADLINE (seconds since the epoch, optional): no step runs past it, whatever its own limit, so a
# caller that runs several sessions side by side bounds them all (scripts/gpu_candidate.sh).
step() {  # name timeout_s command...  (STEP_SIGNAL=INT: interrupt at the limit, as for pytest)
  local name=$1 limit=$2
  shift 2
  if [ -n "${DEADLINE:-}" ]; then
    local room=$((DEADLINE - $(date +%s)))
    [ "$limit" -gt "$room" ] && limit=$room
    [ "$limit" -lt 5 ] && limit=5
  fi
  echo "== $name: $*"
  local t0=$SECONDS
  timeout ${STEP_SIGNAL:+-s "$STEP_SIGNAL" -k 20} "$limit" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0)) s; last lines:"
  tail -n 4 "$out/$name.txt" | sed 's/^/   /'
  [ $rc -eq 0 ] || status=1
}

for s in $steps; do
  case $s in
    info)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$out/info.txt" 2>&1
      "$cli" info --segments 100,80,76 >>"$out/info.txt" 2>&1
      cat "$out/info.txt" ;;
    check)
      # --backend cuda: the best path per configuration (Hopper where it takes it);
      # cuda_portable: the portable path for every configuration, also on Hopper.
      step check_dq_fp32 300 "$cli" check --backend cuda
      step check_dq_bf16 300 "$cli" check --backend cuda --dq-accum bf16
      step check_deterministic 300 "$cli" check --backend cuda --deterministic
      step check_portable 300 "$cli" check --backend cuda_portable
      step check_portable_deterministic 300 "$cli" check --backend cuda_portable --deterministic ;;
    tests)
      step gpu_tests 420 "$build/tests/gpu/raggedattn_gpu_tests" --gtest_brief=1 ;;
    sanitize)
      # Every named configuration (small head counts keep the tools fast), both dQ modes and the
      # deterministic mode under memcheck, racecheck on the shared-memory hand-offs.
      for mode in fp32 bf16 deterministic portable; do
        case $mode in
          fp32|bf16) args="--backend cuda --dq-accum $mode" ;;
          deterministic) args="--backend cuda --deterministic" ;;
          portable) args="--backend cuda_portable" ;;
        esac
        step "memcheck_$mode" 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
          "$cli" check --heads 4/2 $args
      done
      step racecheck 400 compute-sanitizer --tool racecheck --error-exitcode 9 \
        "$cli" check --backend cuda --heads 2/1
      step synccheck 300 compute-sanitizer --tool synccheck --error-exitcode 9 \
        "$cli" check --backend cuda --heads 2/1 ;;
    repeat)
      tool=${REPEAT_TOOL:-synccheck}
      args=${REPEAT_ARGS:---backend cuda --heads 2/1}
      fails=0
      for i in $(seq 1 "${REPEAT:-10}"); do
        if [ "$tool" = none ]; then
          step "repeat_${tool}_$i" 300 "$cli" check $args
        else
          step "repeat_${tool}_$i" 300 compute-sanitizer --tool "$tool" --error-exitcode 9 \
            "$cli" check $args
        fi
        log="$out/repeat_${tool}_$i.txt"
        seed=$(sed -n 's/^raggedattn .*, seed \([0-9]*\)$/\1/p' "$log" | head -n 1)
        # One line per run in repeat_summary.txt: its verdict, seed and every case's worst
        # rel/bound (the summary's lines), so the margins come back without the logs.
        echo "run $i seed ${seed:-?} $(grep -E '^(PASS|FAIL) \(' "$log" | tail -n 1)" \
          "$(grep -E '^[a-z0-9_]+ +(PASS|FAIL) ' "$log" | sort -u |
             sed -n 's/^\([a-z0-9_]*\) .*worst rel\/bound \([0-9.]*\).*/\1=\2/p' | tr '\n' ' ')" \
          >>"$out/repeat_summary.txt"
        if ! grep -q '^PASS (' "$log"; then
          fails=$((fails + 1))
          grep -E '^[a-z0-9_]+ +FAIL' "$log" | sed 's/^/   failed: /'
          [ -n "$seed" ] && step "repeat_${tool}_${i}_plain" 300 "$cli" check $args --seed "$seed"
        else
          rm -f "$log"  # a passing run's log: its line above is its record
        fi
      done
      echo "   repeat: $fails of ${REPEAT:-10} runs under $tool failed" ;;
    profile)
      # Nsight Compute on one forward and one backward launch of one_doc_16k (clocks untouched).
      for k in fwd_kernel bwd_kernel; do
        step "ncu_$k" 240 ncu --clock-control none --kernel-name "regex:$k" --launch-skip 1 \
          --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats \
          --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
          --section LaunchStats "$cli" bench $(workload_args one_doc_16k) --repeat 1
      done ;;
    profile_source)
      # Per-SASS stall samples (ncu --set full, clocks untouched) of the Hopper forward and
      # backward on PROFILE_WORKLOAD (default docs_short_32k), exported as CSV and summarized by
      # scripts/stall_summary.py (docs/PERFORMANCE.md item 47 was read this way).
      problem=$(workload_args "${PROFILE_WORKLOAD:-docs_short_32k}")
      for k in fwd bwd; do
        [ $k = fwd ] && name='fwd_(persistent_)?kernel' || name='bwd_kernel'
        step "ncu_source_$k" 240 ncu --clock-control none --kernel-name "regex:$name" \
          --launch-skip 1 --launch-count 1 --set full --import-source no -o "$out/source_$k" \
          "$cli" bench $problem --repeat 1
        ncu --import "$out/source_$k.ncu-rep" --page source --csv --print-source sass \
          >"$out/source_$k.csv" 2>/dev/null &&
          python3 "$repo/scripts/stall_summary.py" "$out/source_$k.csv" --regions \
            >"$out/stalls_$k.txt"
      done ;;
    percycle)
      # The same Nsight Compute metrics, one launch each (clocks untouched), for our Hopper
      # forward and backward on one_doc_16k, cuDNN's dense SDPA through PyTorch on its shape
      # (bench/cudnn_sdpa_probe.py) and, where its wheel imports, FlashAttention-3's varlen kernels
      # through JAX (bench/fa3_varlen_probe.py), tabled per cycle by scripts/ncu_percycle.py. The
      # main kernels run under `--set full` too: the second table's instructions, L2 and stalls.
      metrics=$(python3 "$repo/scripts/ncu_percycle.py" --metrics)
      ncu_one() {  # name timeout regex program...
        local name=$1 limit=$2 regex=$3
        shift 3
        step "$name" "$limit" ncu --clock-control none --set full --metrics "$metrics" \
          --kernel-name-base demangled --kernel-name "regex:$regex" --launch-skip 1 \
          --launch-count 1 --csv --page raw "$@"
      }
      for k in fwd bwd; do
        ncu_one "percycle_$k" 180 "${k}_kernel" "$cli" bench $(workload_args one_doc_16k) --repeat 1
      done
      files=("$out"/percycle_{fwd,bwd}.txt)
      if python3 -c "import flash_attn3_jax" 2>/dev/null; then
        for k in Fwd Bwd; do
          ncu_one "percycle_fa3_$k" 240 "FlashAttn${k}Sm90" python3 "$repo/bench/fa3_varlen_probe.py"
          files+=("$out/percycle_fa3_$k.txt")
        done
        # Every kernel of FA3's second backward (preprocess, main, postprocess), time only.
        step percycle_fa3_all 120 ncu --clock-control none --metrics gpu__time_duration.sum \
          --kernel-name-base demangled --kernel-name regex:flash --csv --page raw \
          python3 "$repo/bench/fa3_varlen_probe.py"
      fi
      step percycle_cudnn 240 ncu --clock-control none --metrics "$metrics" --kernel-name \
        regex:cudnn --csv --page raw python3 "$repo/bench/cudnn_sdpa_probe.py"
      python3 "$repo/scripts/ncu_percycle.py" "${files[@]}" "$out/percycle_cudnn.txt" \
        >"$out/percycle.md" && cat "$out/percycle.md" ;;
    bench)
      # BENCH_VARIANTS (bench/run.py --variants), e.g. raggedattn,raggedattn_sink for sinks' cost.
      step bench 300 python3 "$(dirname "$0")/../bench/run.py" --cli "$cli" --no-anchors \
        ${BENCH_VARIANTS:+--variants "$BENCH_VARIANTS"} --out "$out" ;;
    anchors)
      step bench_anchors 900 python3 "$(dirname "$0")/../bench/run.py" --cli "$cli" \
        --anchors "${ANCHORS_DIR:?set ANCHORS_DIR}" --out "$out"
      # Every table call times every head dim too (docs/PERFORMANCE.md item 115).
      step head_dims 300 python3 "$(dirname "$0")/../bench/head_dims.py" --cli "$cli" --out "$out" ;;
    head_dims)
      step head_dims 300 python3 "$(dirname "$0")/../bench/head_dims.py" --cli "$cli" --out "$out" ;;
    python)
      step pip_install 300 python3 -m pip install --no-build-isolation --no-deps "$repo" \
        -C cmake.define.RATTN_PYTHON_PREBUILT_LIBRARY="$build/src/libraggedattn.so" \
        -C cmake.define.RATTN_CUDA=OFF
      # The suite runs in a process that imported torch and jax before raggedattn, as a training
      # job does (scripts/pytest_frameworks.py): the library's own C++ runtime meets theirs.
      # PYTEST_ARGS (say -k "cuda or gpu") narrows the run. Each test's name is printed before it
      # runs (-v), and a test still running after 60 s dumps every thread's stack (pytest's
      # faulthandler_timeout), so a step that ends at its limit shows which test and where; the
      # limit interrupts pytest rather than killing it, so its failures and their tracebacks are
      # still printed (under xdist they come only at the end). Where pytest-xdist is installed the
      # suite runs on 6 workers (each imports the frameworks first too: tests/python/conftest.py),
      # the bad-input cases' children 3 at a time in each.
      xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 6")
      STEP_SIGNAL=INT step pytest 540 env -C /tmp RATTN_TEST_CHILDREN=3 python3 \
        "$repo/scripts/pytest_frameworks.py" -v -rfEs --tb=short $xdist \
        -o faulthandler_timeout=60 ${PYTEST_ARGS:-} "$repo/tests/python" ;;
    pip_full)
      # The other installation: pip builds the library (CUDA included) and the extension itself.
      step pip_install_full 480 python3 -m pip install --no-build-isolation --no-deps "$repo" \
        -C cmake.define.RATTN_CUDA=ON -C build-dir=/tmp/rattn-pip-build
      step pytest_full 300 env -C /tmp python3 "$repo/scripts/pytest_frameworks.py" -q \
        "$repo/tests/python/test_bad_inputs.py" "$repo/tests/python/test_torch.py" ;;
    peer_fa)
      # FlashAttention-2's own varlen tests through the shim (PEER_FA_DIR: a copy of
      # ../shared/peer_fa carried to the machine), every 7th case.
      step peer_fa 480 env PEER_FA_LOGDIR="$out" bash "${PEER_FA_DIR:?set PEER_FA_DIR}/run.sh" \
        --peer-quick --maxfail=40 -n 4 ;;
    ab)
      libs=""
      for spec in ${AB_LIBS:?set AB_LIBS}; do
        tag=${spec%%=*}
        dir=$(cd "${spec#*=}" && pwd)
        # A whole staged build (stage_build.sh without --lib-only) keeps the library under src/.
        [ ! -f "$dir/libraggedattn.so" ] && [ -f "$dir/src/libraggedattn.so" ] && dir=$dir/src
        # Without the library in DIR the loader falls back to BUILD_DIR's copy: refuse, or the
        # comparison would silently measure one build twice.
        [ -f "$dir/libraggedattn.so" ] || { echo "AB_LIBS: $dir holds no libraggedattn.so" >&2; exit 2; }
        step "gpu_tests_$tag" 300 env LD_LIBRARY_PATH="$dir" "$build/tests/gpu/raggedattn_gpu_tests" \
          --gtest_brief=1 --gtest_filter='Sm90*:HopperRandom*:Fixture*'
        libs="$libs --lib $tag=$dir"
      done
      step bench_ab 400 python3 "$(dirname "$0")/../bench/run.py" --cli "$cli" --no-anchors \
        --variants raggedattn,raggedattn_sm90 --repeat 10 --processes "${AB_PROCESSES:-1}" $libs \
        --out "$out/ab" ;;
    train)
      step train 540 python3 "$repo/examples/train_packed/train.py" --device cuda \
        --runs reference,raggedattn,raggedattn_dq_bf16,raggedattn_deterministic,raggedattn_dq_corrupt --out "$out/train" ;;
  esac
done
exit $status

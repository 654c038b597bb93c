"""bench/run.py's combination of several processes' runs of one variant (--processes)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import run  # noqa: E402


def _result(fwd_ms: float, bwd_ms: float) -> dict:
    flops_fwd, flops_bwd = 1.0e12, 2.5e12  # any fixed work: TFLOP/s = FLOPs / time
    return {"fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "fwd_tflops": flops_fwd / fwd_ms / 1e9,
            "bwd_tflops": flops_bwd / bwd_ms / 1e9, "path": "p"}


def test_median_time_and_its_rate():
    runs = [_result(2.0, 8.2), _result(1.0, 7.6), _result(4.0, 8.0)]
    r = run.combine_runs(runs)
    assert (r["fwd_ms"], r["bwd_ms"]) == (2.0, 8.0)
    assert r["fwd_tflops"] == pytest.approx(1.0e12 / 2.0 / 1e9)
    assert r["bwd_tflops"] == pytest.approx(2.5e12 / 8.0 / 1e9)
    assert r["fwd_ms_runs"] == [2.0, 1.0, 4.0] and r["bwd_ms_runs"] == [8.2, 7.6, 8.0]


def test_even_count_averages_the_middle_two():
    r = run.combine_runs([_result(1.0, 7.0), _result(3.0, 9.0)])
    assert (r["fwd_ms"], r["bwd_ms"]) == (2.0, 8.0)
    assert r["bwd_tflops"] == pytest.approx(2.5e12 / 8.0 / 1e9)


def test_one_run_is_itself_and_an_error_wins():
    one = _result(1.5, 6.0)
    assert run.combine_runs([one]) == one
    err = {"error": "make_plan: ..."}
    assert run.combine_runs([one, err, one]) == err


def test_table_shows_the_range_over_processes():
    several = run.combine_runs([_result(2.0, 8.2), _result(1.0, 7.6), _result(4.0, 8.0)])
    report = {"date": "d", "meta": {}, "workloads": {"w": {"ours": several,
                                                           "one": _result(2.0, 8.0)}}}
    row = [line for line in run.table(report).splitlines() if line.startswith("| w |")][0]
    # fwd: 1e12 FLOP over 2.0 ms (median), 4.0 and 1.0 ms (slowest, fastest process).
    assert "| 500 (250–1000) / 312 (305–329) |" in row
    assert row.endswith("| 500 / 312 |")


def test_gpu_readings_from_the_bench_report_and_per_process():
    bench = {"fwd_ms": 2.0, "bwd_ms": 8.0, "path": "p", "fwd_sm_mhz": 1980, "bwd_sm_mhz": 1755,
             "fwd_watts": 650.5, "bwd_watts": 690.0, "fwd_sm_mhz_samples": [1980, 1980]}
    r = run.result_from_bench(bench, [100, 80], True)
    assert (r["fwd_sm_mhz"], r["bwd_sm_mhz"], r["fwd_watts"], r["bwd_watts"]) == (
        1980, 1755, 650.5, 690.0)
    assert "fwd_sm_mhz_samples" not in r  # the samples stay in the command's own report
    timed = run.result_from_bench(dict(bench, fwd_calls=400, bwd_calls=18), [100, 80], True)
    assert (timed["fwd_calls"], timed["bwd_calls"]) == (400, 18)  # do_bench's regime: counts
    assert r["fwd_ms"] == 2.0 and r["path"] == "p"
    other = dict(r, fwd_sm_mhz=1830, bwd_watts=700.0)
    both = run.combine_runs([r, other])
    assert both["fwd_sm_mhz_runs"] == [1980, 1830] and both["bwd_watts_runs"] == [690.0, 700.0]
    # Without readings in every process, no per-process list.
    plain = run.result_from_bench({"fwd_ms": 2.0, "bwd_ms": 8.0}, [100, 80], True)
    assert "fwd_sm_mhz" not in plain
    assert "fwd_sm_mhz_runs" not in run.combine_runs([r, plain])


def test_the_report_says_how_our_processes_timed():
    class Args:
        warmup_ms, min_ms, repeat, l2_flush_mb, pause_ms = 50, 200, 10, 256, 0
    assert run.regime_str(Args) == ("warm-up 50 ms, timed >= 200 ms and >= 10 calls, "
                                    "256 MiB zeroed before each call")
    Args.warmup_ms = Args.min_ms = Args.l2_flush_mb = 0
    assert run.regime_str(Args) == "1 warm-up call, 10 timed calls"
    report = {"date": "d", "meta": {"regime": run.regime_str(Args)},
              "workloads": {"w": {"ours": _result(2.0, 8.0)}}}
    assert "raggedattn timed: 1 warm-up call, 10 timed calls." in run.table(report)


def test_timing_options_default_to_the_anchors_regime():
    import argparse
    ap = argparse.ArgumentParser()
    run.add_timing_args(ap)
    args = ap.parse_args([])
    assert run.timing_kwargs(args) == dict(pause_ms=0, warmup_ms=50, min_ms=200, l2_flush_mb=256)
    short = ap.parse_args(["--warmup-ms", "0", "--min-ms", "0", "--l2-flush-mb", "0"])
    assert run.regime_str(short) == "1 warm-up call, 10 timed calls"


def test_a_time_that_is_not_positive_is_no_rate():
    # The JAX anchors take the backward's time as (forward + backward) - forward by wall clock,
    # which a tiny workload can make negative: 2026-12-03's table printed 459 407 TFLOP/s for it.
    anchor = {"fwd_ms": 0.30, "bwd_ms": -0.05, "fwd_tflops": 0.61, "bwd_tflops": 459407.4}
    report = {"date": "d", "meta": {}, "workloads": {"w": {"anchor": anchor,
                                                           "ours": _result(2.0, 8.0)}}}
    md = run.table(report)
    row = [line for line in md.splitlines() if line.startswith("| w |")][0]
    assert row == "| w | 1 / n/a | 500 / 312 |"
    assert "n/a: the implementation reported a time <= 0" in md
    assert run.timed(anchor, "fwd") and not run.timed(anchor, "bwd")
    assert run.timed({"bwd_tflops": 3.0}, "bwd")  # a rate without a time is taken as given


def test_anchor_scripts_find_the_workloads_beside_run_py(tmp_path):
    # An anchor script copied alone into a folder (as onto a GPU machine) imports workloads.py.
    (tmp_path / "probe.py").write_text(
        "import json, os\nfrom workloads import WORKLOADS\n"
        "json.dump({'workloads': {n: {} for n in WORKLOADS}},"
        " open(os.path.join(os.environ['OUT'], 'r.json'), 'w'))\n")
    data = run.run_anchor(str(tmp_path / "probe.py"), timeout=60)
    assert set(data["workloads"]) == set(run.WORKLOADS)

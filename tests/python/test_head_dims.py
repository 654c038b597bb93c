"""bench/head_dims.py: its commands, its table, and a build that fails a cell."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import head_dims  # noqa: E402
import run  # noqa: E402

FAKE_CLI = r'''#!/usr/bin/env python3
# `raggedattn bench` as run.py's run_ours calls it: times chosen so that the rates run_ours
# derives (visible pairs, 2 (Dqk + Dv) Hq FLOPs each forward, 2.5x backward) are
# fwd = Dqk + Dv and bwd = Dqk, + 1 with a 16-bit scratch, + 1 under the causal mask.
import json, sys
a = sys.argv[1:]
opt = lambda k, default=None: a[a.index(k) + 1] if k in a else default
dqk = int(opt("--dim"))
dv = int(opt("--dim-v", dqk))
if dqk == 96:
    print("raggedattn: head dim 96 is not supported here", file=sys.stderr)
    sys.exit(2)
lens = [int(x) for x in opt("--segments").split(",")]
causal = "--causal" in a
hq = int(opt("--heads").split("/")[0])
pairs = sum(s * (s + 1) // 2 if causal else s * s for s in lens)
fwd_flops = 2.0 * (dqk + dv) * hq * pairs
fwd_rate = dqk + dv
bwd_rate = dqk + (1 if opt("--dq-accum") == "bf16" else 0) + causal
json.dump({"fwd_ms": fwd_flops / fwd_rate / 1e9, "bwd_ms": 2.5 * fwd_flops / bwd_rate / 1e9,
           "path": "fake"}, open(opt("--json"), "w"))
'''


def test_dims_parse_and_name():
    assert head_dims.parse_dims("64, 192/128,256") == [(64, 64), (192, 128), (256, 256)]
    assert [head_dims.dims_name(*d) for d in [(64, 64), (192, 128)]] == ["64", "192/128"]


def test_the_command_carries_the_workload_and_the_regime():
    cmd = run.bench_command("cli", [3, 5], True, ["--dq-accum", "bf16"], 10, "x.json",
                            warmup_ms=50, min_ms=200, l2_flush_mb=256, dims=(192, 128))
    s = " ".join(cmd)
    for part in ("--segments 3,5", "--dim 192", "--dim-v 128", "--dq-accum bf16",
                 "--warmup-ms 50", "--min-ms 200", "--l2-flush-mb 256", "--causal"):
        assert part in s
    assert "--causal" not in run.bench_command("cli", [3], False, ["--dq-accum", "fp32"], 10, "x")
    # at the workloads' own D the command is the one run.py always gave (no --dim-v)
    assert "--dim-v" not in run.bench_command("cli", [3], True, [], 10, "x")


def test_table_per_build_and_mode_and_the_failed_cell(tmp_path):
    cli = tmp_path / "raggedattn"
    cli.write_text(FAKE_CLI)
    cli.chmod(cli.stat().st_mode | stat.S_IEXEC)
    other = tmp_path / "other"
    other.mkdir()
    (other / "libraggedattn.so").write_text("")
    out = tmp_path / "out"
    script = os.path.join(os.path.dirname(head_dims.__file__), "head_dims.py")
    subprocess.run([sys.executable, script, "--cli", str(cli), "--out", str(out), "--dims",
                    "64,96,192/128", "--workloads", "one_doc_16k", "--lib", f"b={other}"],
                   check=True, capture_output=True, text=True)
    md = (out / "head_dims.md").read_text()
    assert "| workload | Dqk / Dv | main, fp32 dQ | b, fp32 dQ | main, bf16 dQ | b, bf16 dQ |" in md
    # one_doc_16k is causal: the fake backward rate is dqk + 1, + 1 more with a 16-bit scratch
    assert "| one_doc_16k | 64 | 128 / 65 | 128 / 65 | 128 / 66 | 128 / 66 |" in md
    assert "| one_doc_16k | 192/128 | 320 / 193 | 320 / 193 | 320 / 194 | 320 / 194 |" in md
    assert "| one_doc_16k | 96 | error | error | error | error |" in md
    assert "head dim 96 is not supported here" in md
    data = json.loads((out / "head_dims.json").read_text())
    assert [r["dims"] for r in data["results"]] == ["64", "96", "192/128"]

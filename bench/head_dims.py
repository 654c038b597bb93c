#!/usr/bin/env python3
"""raggedattn at every head dim the Hopper path takes, on the standard workloads' segments, so a
change whose rule applies at every head dim is seen at every head dim (docs/PERFORMANCE.md item
115: a loss at D = 64 stood two days in calls that timed D = 128 only).

    python3 bench/head_dims.py --cli build/tools/raggedattn --out DIR
        [--dims 64,128,192/128,256] [--workloads one_doc_16k,docs_short_32k]
        [--dq-accum fp32,bf16] [--lib TAG=DIR ...]

Each cell is one `raggedattn bench` process through bench/run.py's run_ours (Hq / Hkv and the
mask of the workload, bf16, run.py's timing options: the anchors' regime by default); TFLOP/s as
the command counts them (visible pairs, 2 (Dqk + Dv) Hq FLOPs each forward, 2.5x that backward).
--lib TAG=DIR times another build's libraggedattn.so under the same command (run.py's
lib_builds), cell by cell after this build's. Writes head_dims.json and head_dims.md under --out.
A timing, never a test.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import add_timing_args, lib_builds, regime_str, run_ours, timing_kwargs  # noqa: E402
from workloads import HKV, HQ, WORKLOADS  # noqa: E402


def parse_dims(spec):
    """'64,192/128' -> [(64, 64), (192, 128)]."""
    dims = []
    for item in spec.split(","):
        dqk, _, dv = item.strip().partition("/")
        dims.append((int(dqk), int(dv) if dv else int(dqk)))
    return dims


def dims_name(dqk, dv):
    return str(dqk) if dqk == dv else f"{dqk}/{dv}"


def cell_text(r):
    if r is None:
        return ""
    if "error" in r:
        return "error"
    return f"{r['fwd_tflops']:.0f} / {r['bwd_tflops']:.0f}"


def table(results, builds):
    """Markdown: one row per (workload, head dims), one column per (build, dQ mode)."""
    modes = sorted({m for row in results for m in row["cells"]}, key=["fp32", "bf16"].index)
    cols = [(b, m) for m in modes for b in builds]  # builds side by side per mode
    head = "| workload | Dqk / Dv | " + " | ".join(
        f"{b}, {m} dQ" for b, m in cols) + " |"
    lines = [head, "|" + "---|" * (2 + len(cols))]
    for row in results:
        cells = [cell_text(row["cells"].get(m, {}).get(b)) for b, m in cols]
        lines.append(f"| {row['workload']} | {row['dims']} | " + " | ".join(cells) + " |")
    errors = [(row["workload"], row["dims"], m, b, r["error"]) for row in results
              for m, by in row["cells"].items() for b, r in by.items() if "error" in r]
    for w, d, m, b, e in errors:
        lines.append(f"\nerror: {w} {d} {m} dQ ({b}): {e.strip().splitlines()[-1] if e.strip() else '?'}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default="build/tools/raggedattn")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--dims", default="64,128,192/128,256")
    ap.add_argument("--workloads", default="one_doc_16k,docs_short_32k")
    ap.add_argument("--dq-accum", default="fp32,bf16")
    ap.add_argument("--lib", action="append", default=[], metavar="TAG=DIR")
    add_timing_args(ap)  # the anchors' regime by default, as bench/run.py
    args = ap.parse_args()
    builds = [(tag or "main", env, cli)
              for tag, env, cli in lib_builds(ap, args.cli, args.lib)]
    results = []
    for name in args.workloads.split(","):
        lens, causal = WORKLOADS[name]
        for dqk, dv in parse_dims(args.dims):
            row = {"workload": name, "dims": dims_name(dqk, dv), "cells": {}}
            for mode in args.dq_accum.split(","):
                by = row["cells"].setdefault(mode, {})
                for tag, env, cli in builds:
                    by[tag] = run_ours(cli, lens, causal, ["--dq-accum", mode],
                                       args.repeat, env, dims=(dqk, dv), **timing_kwargs(args))
                    print(name, row["dims"], mode, tag, cell_text(by[tag]), flush=True)
            results.append(row)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "head_dims.json"), "w") as f:
        json.dump({"hq": HQ, "hkv": HKV, "regime": regime_str(args), "results": results}, f, indent=1)
    md = (f"raggedattn at each head dim, bf16, Hq={HQ}, Hkv={HKV}; TFLOP/s fwd / bwd; timed: "
          f"{regime_str(args)}.\n\n" + table(results, [t for t, _, _ in builds]))
    with open(os.path.join(args.out, "head_dims.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()

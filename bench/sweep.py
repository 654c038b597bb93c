#!/usr/bin/env python3
"""Equal-document sweep: forward and backward TFLOP/s of each path over document lengths, in one
run, for choosing the Plan's per-direction thresholds (sm90::kAutoMinSeqlenKv: below it the
Hopper path runs the portable forward).

    python3 bench/sweep.py --cli build/tools/raggedattn --out bench/results/sweep

Each point packs documents of one length into --tokens tokens (causal unless --full), bf16,
Hq = 32, Hkv = 8, D = 128 (the standard workloads' shape), and times every --backends path with
`raggedattn bench`, in the anchors' timing regime by default (bench/run.py's options). Writes
sweep.json ({length: {backend: {fwd_tflops, bwd_tflops, path}}}) and sweep.md (one table, the
faster path of each direction in bold) under --out.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import add_timing_args, run_ours, timing_kwargs  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cli", default="build/tools/raggedattn")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "sweep"))
    ap.add_argument("--lengths", default="64,128,192,256,384,512,768,1024,2048")
    ap.add_argument("--backends", default="cuda_portable,cuda_sm90")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--full", action="store_true", help="no causal mask")
    add_timing_args(ap)  # the anchors' regime by default, as bench/run.py
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",") if x]
    backends = [b for b in a.backends.split(",") if b]
    if not lengths or min(lengths) < 1 or not backends:
        sys.exit(f"sweep.py: need lengths >= 1 and at least one backend; given --lengths "
                 f"{a.lengths!r} --backends {a.backends!r}")
    report = {}
    for n in lengths:
        lens = [n] * max(1, a.tokens // n)
        report[n] = {}
        for b in backends:
            r = run_ours(a.cli, lens, not a.full, ["--backend", b], a.repeat,
                         **timing_kwargs(a))
            report[n][b] = r
            shown = r.get("error") or f"{r['fwd_tflops']:.0f} / {r['bwd_tflops']:.0f}"
            print(f"{n:6d} tokens x {len(lens):5d}  {b:14s} {shown}", flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "sweep.json"), "w") as f:
        json.dump({"tokens": a.tokens, "causal": not a.full, "report": report}, f, indent=1)
    lines = [f"Equal documents, {a.tokens} tokens, {'full' if a.full else 'causal'}; bf16, Hq=32, "
             f"Hkv=8, D=128; TFLOP/s fwd / bwd.", "",
             "| length | " + " | ".join(backends) + " |", "|---" * (len(backends) + 1) + "|"]
    for n in lengths:
        row = report[n]
        best = {}
        for d in ("fwd_tflops", "bwd_tflops"):
            ok = [b for b in backends if d in row[b]]
            best[d] = max(ok, key=lambda b: row[b][d]) if ok else None
        cells = []
        for b in backends:
            r = row[b]
            if "error" in r:
                cells.append("error")
                continue
            f_ = f"{r['fwd_tflops']:.0f}"
            b_ = f"{r['bwd_tflops']:.0f}"
            cells.append((f"**{f_}**" if best["fwd_tflops"] == b else f_) + " / " +
                         (f"**{b_}**" if best["bwd_tflops"] == b else b_))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    with open(os.path.join(a.out, "sweep.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

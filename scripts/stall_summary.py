#!/usr/bin/env python3
"""Summarizes Nsight Compute's per-SASS warp-stall samples of one kernel: where its warps wait.

    ncu --set full --import-source no -o REP ...           # on the GPU machine
    ncu --import REP.ncu-rep --page source --csv --print-source sass > SRC.csv
    scripts/stall_summary.py SRC.csv [--top 30] [--regions]

Prints the stall reasons over the whole kernel, then the instructions with the most samples (each
with its two main reasons and how often it ran). With --regions, it also sums the samples between
landmarks: register reallocation (setmaxnreg: where the producer and the consumer code begin),
named barriers, mbarrier waits (SYNCS ... TRYWAIT), wgmma waits, TMA copies and exits. A
warp-specialized kernel's regions then read as "the consumers' item set-up", "the key loop", "the
producer", and so on. Stall samples say where a warp waits, not what removing the wait would gain
(docs/PERFORMANCE.md item 22). A mbarrier wait shows as long-scoreboard samples on the branch
after its TRYWAIT.

With --by-count, it also groups the instructions by how often they ran, in powers of two: in a
warp-specialized kernel each role's code runs a count of its own (the backward's consumer code 8
times per step, warp 0's and warp 1's once), so the groups compare the roles' waits across two
kernels of the same step count.
"""

import argparse
import csv
import math
import sys

LANDMARKS = ("SETMAXREG", "BAR.SYNC", "BAR.ARV", "TRYWAIT", "DEPBAR", "UTMALDG", "UBLKRED", "EXIT")


def load(path):
    rows = list(csv.reader(open(path, newline="")))
    # Row 0 names the kernel; row 1 is the header.
    header = rows[1]
    col = {name: i for i, name in enumerate(header)}
    for need in ("Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"):
        if need not in col:
            sys.exit(f"{path}: no '{need}' column (export with --page source --csv --print-source sass)")
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    insts = []
    for r in rows[2:]:
        if len(r) < len(header):
            continue
        num = lambda name: int(float(r[col[name]] or 0))
        insts.append({
            "sass": r[col["Source"]].strip(),
            "samples": num("Warp Stall Sampling (All Samples)"),
            "executed": num("Instructions Executed"),
            "reasons": {x[len("stall_"):]: num(x) for x in reasons},
        })
    return rows[0][1] if len(rows[0]) > 1 else path, insts


def print_by_count(insts, total):
    """Samples, instructions executed and the main reasons per group of instructions whose
    execution counts round to the same power of two (one role's 4 210 688 and 4 227 072 runs stay
    together)."""
    groups = {}
    for i in insts:
        if i["executed"] == 0 and i["samples"] == 0:
            continue
        key = round(math.log2(i["executed"])) if i["executed"] else -1
        g = groups.setdefault(key, {"samples": 0, "executed": 0, "reasons": {}})
        g["samples"] += i["samples"]
        g["executed"] += i["executed"]
        for k, v in i["reasons"].items():
            g["reasons"][k] = g["reasons"].get(k, 0) + v
    print("\nby execution count (each instruction run about 2^k times: samples, %, instructions "
          "executed, main reasons as % of the group):")
    for k, g in sorted(groups.items(), key=lambda kv: -kv[1]["samples"]):
        if g["samples"] < total / 200:
            continue
        runs = f"2^{k}" if k >= 0 else "never"
        top = sorted(g["reasons"].items(), key=lambda kv: -kv[1])[:5]
        why = ", ".join(f"{k} {100 * v / g['samples']:.1f}%" for k, v in top if v)
        print(f"  {runs:>6} {g['samples']:>8} {100 * g['samples'] / total:>5.1f}%  "
              f"{g['executed']:.3g}  {why}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--regions", action="store_true")
    ap.add_argument("--by-count", action="store_true")
    a = ap.parse_args()
    kernel, insts = load(a.csv)
    total = sum(i["samples"] for i in insts) or 1
    print(f"{kernel}\n{len(insts)} instructions, {total} stall samples\n")
    by_reason = {}
    for i in insts:
        for k, v in i["reasons"].items():
            by_reason[k] = by_reason.get(k, 0) + v
    print("reason          samples      %")
    for k, v in sorted(by_reason.items(), key=lambda kv: -kv[1])[:12]:
        print(f"{k:<15} {v:>7} {100 * v / total:>6.1f}")
    print(f"\ntop {a.top} instructions (index, samples, %, main reasons, times executed):")
    for n, i in sorted(enumerate(insts), key=lambda ni: -ni[1]["samples"])[: a.top]:
        main2 = sorted(i["reasons"].items(), key=lambda kv: -kv[1])[:2]
        why = ", ".join(f"{k} {v}" for k, v in main2 if v)
        print(f"{n:>6} {i['samples']:>7} {100 * i['samples'] / total:>5.1f}%  {i['sass'][:60]:<60} [{why}] x{i['executed']}")
    if a.by_count:
        print_by_count(insts, total)
    if a.regions:
        print("\nregions between landmarks (first index, samples, %, the landmark that opens it):")
        start, label, acc = 0, "kernel entry", 0
        for n, i in enumerate(insts):
            if any(m in i["sass"] for m in LANDMARKS) and n > start:
                if acc:
                    print(f"{start:>6} {acc:>7} {100 * acc / total:>5.1f}%  {label[:70]}")
                start, label, acc = n, i["sass"], 0
            acc += i["samples"]
        if acc:
            print(f"{start:>6} {acc:>7} {100 * acc / total:>5.1f}%  {label[:70]}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Summarizes `raggedattn check` logs into a markdown table: per configuration, the worst segment's
relative error of each tensor (segments whose reference is all zero are judged by max abs error
and left out of the rel column), one column group per log.

    scripts/summarize_check.py LABEL=check_fp32.txt LABEL=check_bf16.txt ...
"""
import math
import os
import re
import sys

TENSORS = ["O", "LSE", "dQ", "dK", "dV"]


def parse(path):
    res, cur = {}, None
    for line in open(path):
        m = re.match(r"== (\S+):", line)
        if m:
            cur = m.group(1)
            res[cur] = {"rel": [0.0] * 5, "cos": [1.0] * 5, "verdict": "?"}
            continue
        m = re.match(r"\s+\d+\s+\d+\s+\d+ \|(.*)", line)
        if m and cur:
            for t, col in enumerate(m.group(1).split("|")[:5]):
                f = col.replace("!", "").split()
                try:
                    cos, rel = float(f[0]), float(f[1])
                except (ValueError, IndexError):  # "(empty)", "(all -inf, as ref)"
                    continue
                if math.isfinite(rel):
                    res[cur]["rel"][t] = max(res[cur]["rel"][t], rel)
                    res[cur]["cos"][t] = min(res[cur]["cos"][t], cos)
            continue
        m = re.match(r"(\S+)\s+(PASS|FAIL)\s", line)
        if m and m.group(1) in res:
            res[m.group(1)]["verdict"] = m.group(2)
    return res


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    # LABEL=PATH, or PATH alone (labelled by its file name).
    specs = [a.split("=", 1) if "=" in a else [a.rsplit("/", 1)[-1], a] for a in sys.argv[1:]]
    missing = [path for _, path in specs if not os.path.isfile(path)]
    if missing:
        sys.exit(f"summarize_check.py: no such log: {', '.join(missing)}\n{__doc__}")
    logs = [(label, parse(path)) for label, path in specs]
    head = "| config | " + " | ".join(f"{label}: O / dQ / dK / dV rel, min cos" for label, _ in logs) + " |"
    print(head)
    print("|---" * (len(logs) + 1) + "|")
    for name in logs[0][1]:
        cells = []
        for _, res in logs:
            r = res.get(name)
            if not r:
                cells.append("")
                continue
            rel = " / ".join(f"{r['rel'][t]:.1e}" for t in (0, 2, 3, 4))
            cells.append(f"{r['verdict']} {rel}, {min(r['cos']):.6f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Per-cycle comparison of attention kernels from Nsight Compute's raw metrics: one row per kernel
launch with its time, cycles, clock, how busy the tensor pipe, the issue slots and shared memory
were, its DRAM bytes and its executed bf16 wgmma operations (the same work on both sides shows as
the same count). docs/PERFORMANCE.md item 78 was read this way.

    ncu --clock-control none --metrics $(scripts/ncu_percycle.py --metrics) --csv --page raw \\
        CMD > FILE.csv                                       # on the GPU machine, per program
    scripts/ncu_percycle.py FILE.csv [FILE.csv ...] [--match REGEX]

`scripts/gpu_session.sh BUILD OUT percycle` runs ours (the Hopper forward and backward on
one_doc_16k) and cuDNN's dense SDPA through PyTorch (bench/cudnn_sdpa_probe.py) this way. Lines
ncu adds to the program's output (==PROF==, warnings, the program's own prints) are skipped.
"""

import argparse
import csv
import io
import re
import sys

METRICS = {
    "time": "gpu__time_duration.sum",
    "cycles": "gpc__cycles_elapsed.max",
    "clock": "sm__cycles_elapsed.avg.per_second",
    "tensor": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "issue": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smem": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed",
    "dram_read": "dram__bytes_read.sum",
    "dram_write": "dram__bytes_write.sum",
    "ops": "sm__ops_path_tensor_op_hgmma_src_bf16_dst_fp32_sparsity_off.sum",
}
# Read where a run collected them (`--set full` does), never asked for by --metrics: the second
# table, what a kernel issues, how the L2 serves it and why its warps wait.
EXTRA = {
    "inst": "smsp__inst_executed.sum",
    "l2_hit": "lts__t_sector_hit_rate.pct",
    "l2_red": "lts__t_sectors_op_red.sum",
    "smem_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
}
STALLS = ("barrier", "long_scoreboard", "wait", "short_scoreboard", "mio_throttle", "math_pipe_throttle")
for reason in STALLS:
    EXTRA[f"stall_{reason}"] = f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"
SCALE = {"": 1.0, "%": 1.0, "ns": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3,
         "s": 1.0, "second": 1.0, "nsecond": 1e-9, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6,
         "Gbyte": 1e9, "Tbyte": 1e12, "hz": 1.0, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9,
         "cycle": 1.0, "Kcycle": 1e3, "Mcycle": 1e6, "Gcycle": 1e9, "inst": 1.0, "Kinst": 1e3,
         "Minst": 1e6, "Ginst": 1e9, "sector": 1.0, "Ksector": 1e3, "Msector": 1e6,
         "Gsector": 1e9, "ratio": 1.0}


def launches(path):
    """Yields (kernel name, {key: value in base units}) for each launch in an ncu raw CSV."""
    text = open(path, newline="").read()
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 3:
        return
    header, units = rows[0], rows[1]
    col = {name: i for i, name in enumerate(header)}
    for row in rows[2:]:
        vals = {}
        for key, metric in {**METRICS, **EXTRA}.items():
            if metric not in col or not row[col[metric]].strip():
                continue
            i = col[metric]
            unit = units[i] if i < len(units) else ""
            if unit not in SCALE and key in EXTRA:
                continue  # a column of the second table left empty, not a wrong first table
            if unit not in SCALE:
                raise SystemExit(f"{path}: unit {unit!r} of {metric} not known")
            vals[key] = float(row[i].replace(",", "")) * SCALE[unit]
        yield row[col["Kernel Name"]], vals


def short(name, width=60):
    wrapped = re.search(r"flash::(FlashAttn\w+|flash_\w+)", name)  # FA3's cutlass::device_kernel<…>
    if wrapped:
        return "FA3 " + wrapped.group(1)
    name = re.sub(r"\(.*", "", name)  # the parameter list
    name = re.sub(r"^void ", "", name)
    return name if len(name) <= width else name[: width - 1] + "…"


def cell(vals, key, fmt):
    return fmt(vals[key]) if key in vals else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="*")
    ap.add_argument("--match", default="", help="only kernels whose name matches this regex")
    ap.add_argument("--metrics", action="store_true", help="print the metric list for ncu --metrics")
    args = ap.parse_args()
    if args.metrics:
        print(",".join(METRICS.values()))
        return 0
    if not args.csv:
        ap.error("no CSV given")
    print("| kernel | time | cycles (GPC, max) | SM clock | tensor pipe active | issue slots busy | "
          "shared-memory wavefronts | DRAM read / written | bf16 wgmma ops |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    found = 0
    for path in args.csv:
        for name, v in launches(path):
            if args.match and not re.search(args.match, name):
                continue
            found += 1
            dram = (f"{v['dram_read'] / 1e9:.2f} / {v['dram_write'] / 1e9:.2f} GB"
                    if "dram_read" in v and "dram_write" in v else "")
            print(f"| {short(name)} | {cell(v, 'time', lambda x: f'{x * 1e3:.3f} ms')} | "
                  f"{cell(v, 'cycles', lambda x: f'{x / 1e6:.3f} M')} | "
                  f"{cell(v, 'clock', lambda x: f'{x / 1e9:.2f} GHz')} | "
                  f"{cell(v, 'tensor', lambda x: f'{x:.1f}%')} | {cell(v, 'issue', lambda x: f'{x:.1f}%')} | "
                  f"{cell(v, 'smem', lambda x: f'{x:.1f}%')} | {dram} | {cell(v, 'ops', lambda x: f'{x:.4g}')} |")
    if not found:
        print("ncu_percycle: no kernel launch found", file=sys.stderr)
        return 1
    print_extra(args)
    return 0


def print_extra(args):
    """The second table, for launches whose run collected EXTRA's metrics."""
    rows = [(name, v) for path in args.csv for name, v in launches(path)
            if "inst" in v and (not args.match or re.search(args.match, name))]
    if not rows:
        return
    print()
    print("| kernel | instructions | L2 hit | L2 reduction sectors | shared wavefronts | "
          + " | ".join(f"stall: {r}" for r in STALLS) + " |")
    print("| --- " * (5 + len(STALLS)) + "|")
    for name, v in rows:
        stalls = " | ".join(cell(v, f"stall_{r}", lambda x: f"{x:.2f}") for r in STALLS)
        print(f"| {short(name)} | {cell(v, 'inst', lambda x: f'{x:.4g}')} | "
              f"{cell(v, 'l2_hit', lambda x: f'{x:.1f}%')} | {cell(v, 'l2_red', lambda x: f'{x:.4g}')} | "
              f"{cell(v, 'smem_wavefronts', lambda x: f'{x:.4g}')} | {stalls} |")


if __name__ == "__main__":
    sys.exit(main())

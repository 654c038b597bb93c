#!/usr/bin/env python3
"""A list-scheduling model of the Hopper kernels' grids: how much of a launch its last wave costs.

    python3 scripts/schedule_model.py [--sms 132] [--overhead 6] [--fwd-overhead 1]

The backward runs one CTA per (key tile, KV head), one CTA per SM at a time; the block scheduler
hands each free SM the next CTA in launch order. A CTA costs its query steps (its key tile's query
tiles x the GQA group's query heads: portable::key_tile_work) plus a fixed overhead (start-up and
the dK/dV epilogue, in steps). The model takes every step as equally long, so it measures the order
alone: the makespan over its lower bound (all work spread evenly over the SMs, or the largest CTA)
for

- heads outer: grid (tiles, KV heads), the key tiles in bwd_lpt_schedule's order (segments with the
  most work first, a segment's tiles together and in order), every KV head after the one before;
- heads inner: the same tile order with a tile's KV heads as consecutive CTAs (commit 4c6c18a;
  main's schedule does this for segments whose query rows of every head fit the L2 and runs longer
  ones head by head, BwdWorkspace::schedule), so the order holds across the heads;
- by rows (main): a segment's KV heads interleaved where it has at most --interleave-rows rows,
  head by head otherwise (BwdWorkspace::schedule);
- KV head blocks: a segment's heads in blocks of the most KV heads whose rows fit (a lead: item
  99's next step);
- LPT: every CTA sorted by its steps (a bound for any order).

The forward's grid kernel (one CTA per (query tile, query head), a CTA = its key tiles + an
overhead) the same way: query heads outer (grid (tiles, query heads)), a tile's GQA group inner
(grid (tiles x group, KV heads), on main since item 99), and that with the tiles longest first.

The standard workloads come from bench/workloads.py, the tile shape from the D = 128 kernel
(64 query rows x 128 keys). docs/PERFORMANCE.md items 98 and 99 have what it predicted and what was measured.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from workloads import HKV, HQ, WORKLOADS  # noqa: E402

BLOCK_M, BLOCK_N = 64, 128  # sm90::bwd_config(128, 128): query rows per step, keys per CTA


def key_tiles(lens, causal, group=HQ // HKV):
    """(segment, key tile, steps) in tile-map order, len_q = len_kv per segment (top-left causal:
    key tile k's queries start at row k * BLOCK_N)."""
    out = []
    for s, n in enumerate(lens):
        q_tiles = math.ceil(n / BLOCK_M)
        for k in range(math.ceil(n / BLOCK_N)):
            first = (k * BLOCK_N) // BLOCK_M if causal else 0
            out.append((s, k, (q_tiles - first) * group))
    return out


def schedule_order(tiles):
    """bwd_lpt_schedule's order: a stable sort by the segment's first key tile's steps, descending."""
    first = {s: steps for s, k, steps in tiles if k == 0}
    return sorted(tiles, key=lambda t: -first[t[0]])


def makespan(costs, sms):
    """Each CTA, in launch order, to the SM that frees first."""
    free = [0.0] * sms
    end = 0.0
    for c in costs:
        t = heapq.heappop(free) + c
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def by_segment(ordered, lens, heads_kv, block, overhead):
    """The schedule's order with each segment's KV heads in blocks of block(len) heads: a block's
    heads tile by tile together, the blocks one after the other (block = heads_kv: interleaved,
    1: head by head; schedule_slot)."""
    out = []
    for s, seg in itertools.groupby(ordered, key=lambda t: t[0]):  # a segment's tiles together
        seg = list(seg)
        n = block(lens[s])
        for _ in range(heads_kv // n):
            out += [steps + overhead for _, _, steps in seg for _ in range(n)]
    return out


def kv_block(length, heads_kv, rows):
    """The most KV heads (a divisor of heads_kv) whose query rows of a segment of `length` fit
    what sm90::bwd_interleave_rows allows all heads' (`rows`), at least one."""
    n = heads_kv
    while n > 1 and length * n > rows * heads_kv:
        n -= 1
        while heads_kv % n:
            n -= 1
    return n


# sm90::bwd_interleave_rows at D = 128, Hq 32, the fp32 scratch and a 50 MiB L2.
INTERLEAVE_ROWS = 1587


def orders(lens, causal, heads_kv=HKV, overhead=6.0, rows=INTERLEAVE_ROWS):
    """Each order's CTA costs, in launch order."""
    ordered = schedule_order(key_tiles(lens, causal))
    outer = [steps + overhead for _ in range(heads_kv) for _, _, steps in ordered]
    inner = [steps + overhead for _, _, steps in ordered for _ in range(heads_kv)]
    rule = by_segment(ordered, lens, heads_kv,
                      lambda n: heads_kv if n <= rows else 1, overhead)
    blocks = by_segment(ordered, lens, heads_kv, lambda n: kv_block(n, heads_kv, rows), overhead)
    return {"heads outer": outer, "heads inner": inner, "by rows (main)": rule,
            "KV head blocks": blocks, "LPT": sorted(inner, reverse=True)}


FWD_BLOCK = 128  # sm90::fwd_config(128, 128): query rows and keys per tile


def query_tiles(lens, causal):
    """The forward grid kernel's items of one head in launch order (the tile map's reversed: the
    last segment first, a segment's heaviest causal tiles first): each one's key tiles."""
    out = []
    for n in lens:
        keys = math.ceil(n / FWD_BLOCK)
        out += [min(i + 1, keys) if causal else keys for i in range(math.ceil(n / FWD_BLOCK))]
    return out[::-1]


def fwd_orders(lens, causal, heads_q=HQ, heads_kv=HKV, overhead=1.0):
    """The forward grid kernel's CTA costs (key tiles + overhead), in launch order: query heads
    outer (grid (tiles, query heads)), a tile's GQA group inner (grid (tiles x group, KV heads)),
    and that with the tiles longest first across segments (a schedule the forward lacks)."""
    items = query_tiles(lens, causal)
    group = heads_q // heads_kv
    return {
        "query heads outer": [c + overhead for _ in range(heads_q) for c in items],
        "group inner": [c + overhead for _ in range(heads_kv) for c in items for _ in range(group)],
        "group inner, longest first": [c + overhead for _ in range(heads_kv)
                                       for c in sorted(items, reverse=True) for _ in range(group)],
    }


def tail(costs, sms):
    """The makespan over its lower bound (the work spread evenly over the SMs, or the largest
    CTA where that is longer), minus 1."""
    return makespan(costs, sms) / max(sum(costs) / sms, max(costs)) - 1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--overhead", type=float, default=6.0,
                    help="a backward CTA's fixed cost, in query steps")
    ap.add_argument("--fwd-overhead", type=float, default=1.0,
                    help="a forward CTA's fixed cost, in key tiles")
    ap.add_argument("--interleave-rows", type=int, default=INTERLEAVE_ROWS,
                    help="sm90::bwd_interleave_rows (D = 128, Hq 32, fp32 scratch, 50 MiB L2)")
    args = ap.parse_args()
    print(f"{args.sms} SMs, a CTA = its steps + {args.overhead}; the last wave's cost "
          "(the makespan over its lower bound, minus 1):")
    for name, (lens, causal) in WORKLOADS.items():
        cells = ", ".join(f"{k} {100 * tail(c, args.sms):.1f}%"
                          for k, c in orders(lens, causal, overhead=args.overhead,
                                              rows=args.interleave_rows).items())
        print(f"  {name:20s} {cells}")
    print(f"The forward's grid kernel, a CTA = its key tiles + {args.fwd_overhead}:")
    for name, (lens, causal) in WORKLOADS.items():
        cells = ", ".join(f"{k} {100 * tail(c, args.sms):.1f}%"
                          for k, c in fwd_orders(lens, causal, overhead=args.fwd_overhead).items())
        print(f"  {name:20s} {cells}")


if __name__ == "__main__":
    main()

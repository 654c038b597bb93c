"""scripts/schedule_model.py: the backward's CTA costs and the list scheduling it models."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import schedule_model as m  # noqa: E402


def test_key_tile_steps_follow_the_causal_band():
    # 300 tokens: 5 query tiles of 64 rows, 3 key tiles of 128 keys; key tile k's queries start
    # at query tile 2k under a causal mask, at 0 without; 4 query heads per KV head.
    assert m.key_tiles([300], causal=True, group=4) == [(0, 0, 20), (0, 1, 12), (0, 2, 4)]
    assert m.key_tiles([300], causal=False, group=4) == [(0, 0, 20), (0, 1, 20), (0, 2, 20)]


def test_schedule_order_puts_the_heaviest_segment_first_and_keeps_its_tiles_together():
    order = m.schedule_order(m.key_tiles([130, 600, 200], causal=True))
    assert [s for s, _, _ in order] == [1] * 5 + [2] * 2 + [0] * 2
    assert [k for s, k, _ in order if s == 1] == [0, 1, 2, 3, 4]


def test_every_order_runs_the_same_ctas():
    o = m.orders([1356, 4918, 772], causal=True, heads_kv=3, overhead=2, rows=1000)
    runs = list(o.values())
    assert all(sorted(r) == sorted(runs[0]) for r in runs)
    assert len(o["heads inner"]) == 3 * len(m.key_tiles([1356, 4918, 772], True))


def test_main_rule_interleaves_only_the_segments_within_its_rows():
    lens = [1356, 300]  # 11 + 3 key tiles; only the 300-token segment within 1000 rows
    o = m.orders(lens, causal=False, heads_kv=2, overhead=0, rows=1000)
    long_steps, short_steps = 22 * 4, 5 * 4  # query tiles x group (4)
    # The long segment head by head (11 tiles, twice), then the short one's tiles with both heads.
    assert o["by rows (main)"] == [long_steps] * 22 + [short_steps] * 6
    assert m.kv_block(1356, heads_kv=8, rows=1000) == 4  # 1356 x 4 <= 8000 < 1356 x 8
    assert m.kv_block(16384, heads_kv=8, rows=1587) == 1
    assert m.kv_block(300, heads_kv=8, rows=1000) == 8
    assert m.kv_block(2000, heads_kv=6, rows=1000) == 3  # a divisor of the heads


def test_makespan_is_list_scheduling_in_launch_order():
    # Two SMs: 4 and 3 start; 2 goes to the SM free at 3, 1 to the one free at 4.
    assert m.makespan([4, 3, 2, 1], sms=2) == 5
    # The heaviest last: it starts when the first SM frees.
    assert m.makespan([1, 1, 4], sms=2) == 5
    assert m.tail([1, 1, 4], sms=2) == 5 / 4 - 1


def test_forward_items_and_orders():
    # 300 tokens, causal: query tiles of 128 rows see 1, 2, 3 key tiles; launched last first.
    assert m.query_tiles([300], causal=True) == [3, 2, 1]
    assert m.query_tiles([300, 100], causal=False) == [1, 3, 3, 3]
    o = m.fwd_orders([1356, 4918, 772], causal=True, heads_q=8, heads_kv=2, overhead=1)
    runs = list(o.values())
    assert all(sorted(r) == sorted(runs[0]) for r in runs)
    assert len(runs[0]) == 8 * len(m.query_tiles([1356, 4918, 772], True))
    # A tile's group of four query heads is four consecutive CTAs of the same cost.
    inner = o["group inner"]
    assert all(len(set(inner[i:i + 4])) == 1 for i in range(0, len(inner), 4))

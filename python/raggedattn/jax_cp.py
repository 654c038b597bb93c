"""Context-parallel attention in JAX over a mesh axis (the all-gather strategy), inside shard_map.

The same scheme as raggedattn.cp for PyTorch: every document in 2·cp zigzag chunks
(raggedattn.cp_shard), K and V gathered over the axis once, each of a device's query chunks
attending the keys it sees (its document's prefix under a causal mask, the whole document without
one) through the library's own call. shard_map needs equal shards, so each device's rows are
padded to the longest device's count (padding rows lie outside every segment: zeros in the output
and in the gradients). Autodiff gives the backward: the gather's transpose adds the keys'
gradients, the all-gather's transpose (a reduce-scatter) returns them to their owners.

    plan = zigzag_shard(cu_seqlens, cp=mesh.shape["cp"])
    layout = ShardLayout.of(plan)
    q_sharded = layout.shard(q)                 # [cp * rows, H, D], rank-major, on the host
    f = shard_map(lambda q, k, v: attention(q, k, v, layout, "cp", causal=True), mesh,
                  in_specs=P("cp"), out_specs=P("cp"))
    out = layout.unshard(f(q_sharded, k_sharded, v_sharded))       # back in document order
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import jax as _rj
from .cp_shard import ShardPlan, row_ranges, window_left

__all__ = ["ShardLayout", "attention"]


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """A ShardPlan as fixed-shape arrays, one row per device (shard_map's equal shards).

    rows: the padded local row count of every device; index: int64 [cp, rows], the global token of
    each local row (-1 for padding); cu_q: int32 [cp, 2B + 1], each device's query pieces."""

    plan: ShardPlan
    rows: int
    index: np.ndarray
    cu_q: np.ndarray

    @staticmethod
    def of(plan: ShardPlan) -> "ShardLayout":
        indices = [plan.rank_index(r) for r in range(plan.cp)]
        rows = max(1, max(len(i) for i in indices))
        index = np.full((plan.cp, rows), -1, dtype=np.int64)
        for r, i in enumerate(indices):
            index[r, :len(i)] = i
        cu_q = np.stack([plan.rank_cu_seqlens(r) for r in range(plan.cp)])
        return ShardLayout(plan=plan, rows=rows, index=index, cu_q=cu_q)

    def shard(self, x):
        """[total, ...] in document order -> [cp * rows, ...] rank-major with zero padding rows."""
        x = jnp.asarray(x)
        flat = self.index.reshape(-1)
        picked = jnp.take(x, np.maximum(flat, 0), axis=0)
        keep = jnp.asarray(flat >= 0).reshape((-1,) + (1,) * (x.ndim - 1))
        return jnp.where(keep, picked, jnp.zeros_like(picked))

    def unshard(self, x):
        """[cp * rows, ...] rank-major -> [total, ...] in document order."""
        flat = self.index.reshape(-1)
        where = np.empty(int(self.plan.cu_seqlens[-1]), dtype=np.int64)
        where[flat[flat >= 0]] = np.nonzero(flat >= 0)[0]
        return jnp.take(x, where, axis=0)

    def key_rows(self, causal: bool, left: int) -> Tuple[np.ndarray, np.ndarray, int, int]:
        """Per device: int32 [cp, K] rows of the gathered (rank-major, padded) keys each device's
        pieces read, in piece order (padded with row 0); int32 [cp, 2B + 1] their segments; the
        longest query and key piece."""
        plan = self.plan
        position = np.empty(int(plan.cu_seqlens[-1]), dtype=np.int64)
        flat = self.index.reshape(-1)
        position[flat[flat >= 0]] = np.nonzero(flat >= 0)[0]  # global row -> gathered row
        per_rank, cu_kv, longest_kv = [], [], 1
        for r in range(plan.cp):
            pieces = plan.rank_pieces(r)
            starts = plan.cu_seqlens[pieces[:, 0]].astype(np.int64)
            ends = plan.cu_seqlens[pieces[:, 0] + 1].astype(np.int64)
            if causal:
                ends = pieces[:, 2]
                if left >= 0:
                    starts = np.minimum(np.maximum(starts, pieces[:, 1] - left), ends)
            per_rank.append(position[row_ranges(starts, ends)])
            lengths = ends - starts
            cu_kv.append(np.concatenate([[0], np.cumsum(lengths)]))
            longest_kv = max(longest_kv, int(lengths.max(initial=0)))
        width = max(1, max(len(x) for x in per_rank))
        table = np.zeros((plan.cp, width), dtype=np.int32)
        for r, x in enumerate(per_rank):
            table[r, :len(x)] = x
        longest_q = max(1, int(np.diff(self.cu_q, axis=1).max(initial=0)))
        return table, np.stack(cu_kv).astype(np.int32), longest_q, longest_kv


def attention(q, k, v, layout: ShardLayout, axis_name: str, *, causal: bool = False,
              window: Tuple[int, int] = (-1, -1), softmax_scale=None, softcap: float = 0.0,
              sink=None):
    """Inside shard_map over `axis_name`: this device's rows of q, k, v ([rows, H, D], the
    layout's padded shard) -> its rows of the output. sink: learnable attention sinks [Hq], as in
    raggedattn.jax.attention (replicated over the axis: their gradient is summed over it)."""
    left = window_left("raggedattn.jax_cp.attention", causal, window)
    table, cu_kv, longest_q, longest_kv = layout.key_rows(causal, left)
    rank = jax.lax.axis_index(axis_name)
    k_all = jax.lax.all_gather(k, axis_name, tiled=True)
    v_all = jax.lax.all_gather(v, axis_name, tiled=True)
    rows = jnp.asarray(table)[rank]
    return _rj.attention(
        q,
        jnp.take(k_all, rows, axis=0),
        jnp.take(v_all, rows, axis=0),
        jnp.asarray(layout.cu_q)[rank],
        jnp.asarray(cu_kv)[rank],
        longest_q,
        longest_kv,
        causal=causal,
        causal_alignment="bottom_right",
        window=(left, 0) if causal else (-1, -1),
        softmax_scale=softmax_scale,
        softcap=softcap,
        sink=sink,
    )

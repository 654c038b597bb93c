"""Context-parallel attention in JAX over a mesh axis, inside shard_map: the all-gather strategy
(`attention`) and the ring strategy (`ring_attention`, causal or full masks).

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

The ring strategy (as raggedattn.cp.ring_attention) passes K and V around the axis with
ppermute instead, one hop per step; each step is one call of the library on this device's query
pieces and the key chunks they see, and the partial outputs merge by their LSEs in fp32. Its
backward is its own (a custom_vjp): the ring again, each step's gradients from the library's
backward with the merged output and LSE, dK and dV travelling with their chunks back home, so it
keeps no step's K/V for the backward.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

from . import jax as _rj
from ._options import make_options
from .cp_shard import ShardPlan, chunk_pair_mask, refuse_ring_window, row_ranges, window_left

__all__ = ["ShardLayout", "RingStep", "attention", "ring_attention"]


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
        return table, np.stack(cu_kv).astype(np.int32), self.longest_q, longest_kv

    def key_row_readers(self, causal: bool, left: int) -> np.ndarray:
        """Per device, int32 [cp, cp * rows, 2]: for each row of the gathered keys, the (at most
        two) places of key_rows' table that read it; the table's width (a zero row appended to
        the gradient) where fewer do. A key row belongs to one document, and the device holds two
        pieces of it, so no row is read more often; padding places read nothing."""
        return self.plan.derived(("jax readers", self.rows, causal, left),
                                 lambda: self._make_key_row_readers(causal, left))

    def _make_key_row_readers(self, causal: bool, left: int) -> np.ndarray:
        table, cu_kv, _, _ = self.key_rows(causal, left)
        width = table.shape[1]
        readers = np.full((self.plan.cp, self.plan.cp * self.rows, 2), width, dtype=np.int32)
        for r in range(self.plan.cp):
            valid = int(cu_kv[r, -1])  # the table's places past this hold padding
            count = np.zeros(self.plan.cp * self.rows, dtype=np.int64)
            for place, row in enumerate(table[r, :valid]):
                if count[row] >= 2:
                    raise AssertionError(f"gathered key row {row} read more than twice")
                readers[r, row, count[row]] = place
                count[row] += 1
        return readers

    @property
    def longest_q(self) -> int:
        """The longest query piece of any device (at least 1)."""
        return max(1, int(np.diff(self.cu_q, axis=1).max(initial=0)))

    def ring_steps(self, causal: bool = True) -> Tuple["RingStep", ...]:
        """The ring strategy's steps under a causal mask or none, made once per plan (see
        RingStep)."""
        return self.plan.derived(("jax ring", self.rows, causal),
                                 lambda: self._make_ring_steps(causal))

    def _make_ring_steps(self, causal: bool) -> Tuple["RingStep", ...]:
        # At step s device r holds the keys of src = r - s (mod cp). Which of src's chunks a query
        # chunk sees, and how, is cp_shard.chunk_pair_mask's (as in raggedattn.cp's ring). A query
        # piece's key segment is the src chunks it sees, of its document, in chunk order. Without
        # a causal mask that is both chunks at every step, and every call is unmasked. Under one,
        # the diagonal (the same chunk, step 0 only) comes last, so one causal call with the
        # bottom-right alignment puts every query of step 0 on its diagonal and sees the earlier
        # chunk whole; later steps have no diagonal and are unmasked.
        plan, cp = self.plan, self.plan.cp
        steps = []
        for s in range(cp):
            per_rank, cu_kv, longest_kv = [], [], 1
            diagonal = set()  # per query piece: whether its segment ends with a causal pair
            for r in range(cp):
                src = (r - s) % cp
                src_cu = self.cu_q[src].astype(np.int64)  # src's local piece boundaries
                starts, ends = [], []
                for piece in range(2 * plan.num_docs):
                    doc, kind = divmod(piece, 2)
                    i = plan.rank_chunks(r)[kind]
                    masks = [chunk_pair_mask(i, j, causal) for j in plan.rank_chunks(src)]
                    seen = [m for m in masks if m is not None]
                    # src's chunks in chunk order (kind 0 < kind 1): those seen are a prefix,
                    # and src's pieces of one document are adjacent rows, so they are a range;
                    # a causal pair can only be the segment's last.
                    assert masks[:len(seen)] == seen and "causal" not in seen[:-1]
                    diagonal.add(bool(seen) and seen[-1] == "causal")
                    lo = src_cu[2 * doc] if seen else 0
                    hi = src_cu[2 * doc + len(seen)] if seen else 0
                    starts.append(lo)
                    ends.append(hi)
                starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
                per_rank.append(row_ranges(starts, ends))
                lengths = ends - starts
                cu_kv.append(np.concatenate([[0], np.cumsum(lengths)]))
                longest_kv = max(longest_kv, int(lengths.max(initial=0)))
            width = max(1, max(len(x) for x in per_rank))
            table = np.zeros((cp, width), dtype=np.int32)  # padding: row 0, outside every segment
            for r, x in enumerate(per_rank):
                table[r, :len(x)] = x
            # One call per step, so one mask for every piece of it: the step is causal where each
            # piece's segment ends on its diagonal, unmasked where none does.
            assert len(diagonal) == 1, f"step {s}: pieces with and without a diagonal"
            steps.append(RingStep(causal=diagonal.pop(), key_rows=table,
                                  cu_kv=np.stack(cu_kv).astype(np.int32), longest_kv=longest_kv))
        return tuple(steps)


@dataclasses.dataclass(frozen=True)
class RingStep:
    """One step of the ring strategy: every device's query pieces (its local rows, segments
    ShardLayout.cu_q) against the key chunks it holds at that step (those of device r - s).

    causal: the step's mask (under a causal mask step 0, where each query piece meets its own
    chunk; later steps, and every step without a causal mask, unmasked); key_rows: int32 [cp, K],
    per device the rows of the held K/V shard each query piece reads, piece after piece (padded
    with row 0); cu_kv: int32 [cp, 2B + 1], their segments; longest_kv: the longest key segment of
    any device."""

    causal: bool
    key_rows: np.ndarray
    cu_kv: np.ndarray
    longest_kv: int


def attention(q, k, v, layout: ShardLayout, axis_name: str, *, causal: bool = False,
              window: Tuple[int, int] = (-1, -1), softmax_scale=None, softcap: float = 0.0,
              sink=None, deterministic: bool = False):
    """Inside shard_map over `axis_name`: this device's rows of q, k, v ([rows, H, D], the
    layout's padded shard) -> its rows of the output. sink: learnable attention sinks [Hq], as in
    raggedattn.jax.attention (replicated over the axis: their gradient is summed over it).

    deterministic: the library's deterministic backward, and the gathered keys' gradient summed
    back onto the keys by two gathers in a fixed order (each key row is read by at most two of the
    device's pieces: ShardLayout.key_row_readers) instead of the scatter-add that jnp.take's
    gradient is, whose order of additions XLA does not fix on the GPU. The gradient's reduction
    over the axis is XLA's reduce-scatter."""
    left = window_left("raggedattn.jax_cp.attention", causal, window)
    table, cu_kv, longest_q, longest_kv = layout.key_rows(causal, left)
    rank = jax.lax.axis_index(axis_name)
    k_all = jax.lax.all_gather(k, axis_name, tiled=True)
    v_all = jax.lax.all_gather(v, axis_name, tiled=True)
    rows = jnp.asarray(table)[rank]
    if deterministic:
        readers = jnp.asarray(layout.key_row_readers(causal, left))[rank]
        k_rows = _take_rows(k_all, rows, readers)
        v_rows = _take_rows(v_all, rows, readers)
    else:
        k_rows, v_rows = jnp.take(k_all, rows, axis=0), jnp.take(v_all, rows, axis=0)
    return _rj.attention(
        q,
        k_rows,
        v_rows,
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
        deterministic=deterministic,
    )


@jax.custom_vjp
def _take_rows(x, rows, readers):
    """x[rows], whose gradient adds each row's (at most two) readers' gradients by gathers, in a
    fixed order (readers: ShardLayout.key_row_readers' for this device)."""
    return jnp.take(x, rows, axis=0)


def _take_rows_fwd(x, rows, readers):
    return jnp.take(x, rows, axis=0), readers


def _take_rows_bwd(readers, g):
    padded = jnp.concatenate([g, jnp.zeros((1,) + g.shape[1:], g.dtype)])  # the "no reader" row
    d_x = jnp.take(padded, readers[:, 0], axis=0) + jnp.take(padded, readers[:, 1], axis=0)
    return d_x, None, None


_take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


def ring_attention(q, k, v, layout: ShardLayout, axis_name: str, *, causal: bool = True,
                   window: Tuple[int, int] = (-1, -1), softmax_scale=None, softcap: float = 0.0,
                   dq_accum: str = "fp32", sink=None):
    """The ring strategy (as raggedattn.cp.ring_attention): inside shard_map over `axis_name`,
    this device's rows of q, k, v ([rows, H, D], the layout's padded shard) -> its rows of the
    output, the same as `attention(..., causal=causal)`.

    causal: True (the default), each query piece runs against the chunks at or before its own,
    its diagonal masked; False, against both chunks of its document at every step, unmasked.

    window: none ((-1, -1), or (-1, 0) under a causal mask: the causal mask itself); a sliding
    window raises NotImplementedError. With a window a query chunk sees only the chunks near it, so
    the ring would carry every K/V chunk to every device for nothing, and each off-diagonal pair's
    band sits at an offset that differs per document, which the library's one window per call
    cannot express. Sliding windows use the all-gather strategy (`attention(..., window=...)`);
    TransformerEngine's context parallelism likewise serves them with all-gather, not its p2p ring.

    K and V travel around the axis with ppermute, one hop per step (cp steps; the next step's
    chunks can travel while this step computes); each step runs this device's query pieces on
    the key chunks they see (ShardLayout.ring_steps) and the partial outputs merge by their LSEs
    in fp32. The backward runs the ring again: each step's gradients come from the library's
    backward with the merged output and LSE (so they are exact), dQ adds up here and dK/dV
    travel with their chunks back to their owners. It keeps only q, k, v, the output and the
    LSE: training memory stays that of this device's shard.

    sink: learnable attention sinks [Hq] (replicated over the axis), joining the merged softmax
    once after the last step; their gradient is summed over the axis."""
    refuse_ring_window("raggedattn.jax_cp.ring_attention", window,
                       "raggedattn.jax_cp.attention(..., window=...)", causal)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 3 or x.shape[0] != layout.rows:
            raise ValueError(
                f"raggedattn.jax_cp.ring_attention: {name} has shape {tuple(x.shape)}; each "
                f"device's shard of the layout is [{layout.rows}, heads, head_dim]")
    cp = layout.plan.cp
    axis_size = jax.lax.axis_size(axis_name) if hasattr(jax.lax, "axis_size") else None
    if axis_size is not None and int(axis_size) != cp:
        raise ValueError(
            f"raggedattn.jax_cp.ring_attention: the layout is for cp={cp} devices but mesh axis "
            f"{axis_name!r} has {int(axis_size)}")
    ring = _Ring(layout, axis_name, bool(causal), softmax_scale, float(softcap), dq_accum)
    if sink is None:
        return ring.attention_without_sink(q, k, v)
    # attention()'s checks (float, [Hq]); varying where q varies, so that the cast's transpose
    # sums the devices' shares of the sinks' gradient over the axis.
    sink = _rj._like(_rj._sink_array(sink, q), q)
    return ring.attention_with_sink(q, k, v, sink)


class _Ring:
    """The ring's forward and backward passes for one layout and set of options; its two entry
    points are custom_vjp functions (with and without sinks)."""

    def __init__(self, layout: ShardLayout, axis_name: str, causal: bool, softmax_scale,
                 softcap: float, dq_accum: str):
        self.layout, self.axis_name, self.causal = layout, axis_name, causal
        self.softmax_scale, self.softcap, self.dq_accum = softmax_scale, softcap, dq_accum
        self.to_next = [(r, (r + 1) % layout.plan.cp) for r in range(layout.plan.cp)]
        self.attention_without_sink = jax.custom_vjp(lambda q, k, v: self._forward(q, k, v)[0])
        self.attention_without_sink.defvjp(
            lambda q, k, v: self._forward_with_residuals(q, k, v, None),
            lambda res, g: self._backward(res, g)[:3])
        self.attention_with_sink = jax.custom_vjp(lambda q, k, v, s: self._forward(q, k, v, s)[0])
        self.attention_with_sink.defvjp(self._forward_with_residuals, self._backward)

    def _step_static(self, q, step: "RingStep") -> "_rj._Static":
        """What the library's call of one step needs besides arrays (as _rj.attention makes it)."""
        opts = make_options(causal=step.causal, causal_alignment="bottom_right",
                            softmax_scale=self.softmax_scale, softcap=self.softcap,
                            dq_accum=self.dq_accum)
        cuda, device = _rj._target(q)
        return _rj._Static(self.layout.longest_q, step.longest_kv, False, opts, cuda, device)

    def _forward(self, q, k, v, sink=None):
        """The output (q's dtype) and the merged LSE, sinks included (float32 [H, rows])."""
        layout, cp = self.layout, self.layout.plan.cp
        rank = jax.lax.axis_index(self.axis_name)
        cu_q = jnp.asarray(layout.cu_q)[rank]
        out = lse = None
        kv = (k, v)
        for s, step in enumerate(layout.ring_steps(self.causal)):
            # Sent before this step's attention, which does not depend on it: the hop can
            # overlap.
            following = tuple(jax.lax.ppermute(x, self.axis_name, self.to_next) for x in kv) \
                if s + 1 < cp else None
            rows = jnp.asarray(step.key_rows)[rank]
            o_s, lse_s = _rj.attention(
                q, jnp.take(kv[0], rows, axis=0), jnp.take(kv[1], rows, axis=0), cu_q,
                jnp.asarray(step.cu_kv)[rank], layout.longest_q, step.longest_kv,
                causal=step.causal, causal_alignment="bottom_right",
                softmax_scale=self.softmax_scale, softcap=self.softcap, dq_accum=self.dq_accum,
                return_lse=True)
            if out is None:
                out, lse = o_s.astype(jnp.float32), lse_s
            else:
                out, lse = _merge(out, lse, o_s, lse_s)
            kv = following
        if sink is not None:
            out = _merge_sink(out, lse, sink)
            lse = jnp.logaddexp(lse, sink[:, None])
        return out.astype(q.dtype), lse

    def _forward_with_residuals(self, q, k, v, sink):
        out, lse = self._forward(q, k, v, sink)
        return out, (q, k, v, sink, out, lse)

    def _backward(self, res, g):
        """dq, dk, dv and the sinks' gradient: every step's library backward with the merged
        output and LSE, whose probabilities are the final softmax's, so the steps' gradients add
        up to the exact ones. dK/dV accumulate in fp32 beside the chunk they belong to and travel
        with it; after the last step one more hop brings them home."""
        q, k, v, sink, out, lse = res
        layout = self.layout
        rank = jax.lax.axis_index(self.axis_name)
        cu_q = jnp.asarray(layout.cu_q)[rank]
        g = g.astype(q.dtype)
        dq = jnp.zeros(q.shape, jnp.float32)
        dk, dv = jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)
        kv = (k, v)
        for s, step in enumerate(layout.ring_steps(self.causal)):
            following = tuple(jax.lax.ppermute(x, self.axis_name, self.to_next) for x in kv) \
                if s + 1 < layout.plan.cp else None
            rows = jnp.asarray(step.key_rows)[rank]
            cu_kv = jnp.asarray(step.cu_kv)[rank]
            dq_s, dk_s, dv_s, _ = _rj._backward(
                q, jnp.take(kv[0], rows, axis=0), jnp.take(kv[1], rows, axis=0), out, lse, g,
                None, None, cu_q, cu_kv, cu_q, cu_kv, self._step_static(q, step))
            # Rows past the step's segments (the table's padding reads row 0) get zero gradients.
            dq = dq + _rj._like(dq_s, q).astype(jnp.float32)
            dk = dk.at[rows].add(_rj._like(dk_s, k).astype(jnp.float32))
            dv = dv.at[rows].add(_rj._like(dv_s, v).astype(jnp.float32))
            dk, dv = (jax.lax.ppermute(x, self.axis_name, self.to_next) for x in (dk, dv))
            kv = following
        grads = (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype))
        if sink is None:
            return grads + (None,)
        # d sink_h = -sum_i p_sink(i) D_i over this device's rows (the cast before the call sums
        # the devices' shares), D_i = rowsum(dO_i o_i).
        d = jnp.sum(g.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [rows, H]
        p_sink = jnp.exp(sink[None, :] - lse.T)  # exp(-inf) = 0 on rows outside the pieces
        return grads + (-jnp.sum(p_sink * d, axis=0),)


def _merge(out, lse, o_s, lse_s):
    """fp32 out [rows, H, D] and lse [H, rows] merged with a step's o_s and lse_s. A row that saw
    no key yet has lse -inf and out 0; where neither part saw one, the merged lse stays -inf and
    no cotangent reaches the parts' LSEs (logaddexp's derivative there is not the limit's)."""
    merged = jnp.logaddexp(lse, lse_s)
    seen = jnp.isfinite(merged)
    base = jnp.where(seen, merged, 0.0)
    keep = jnp.exp(lse - base).T[..., None]  # exp(-inf) = 0, with a zero derivative
    take = jnp.exp(lse_s - base).T[..., None]
    return out * keep + o_s.astype(jnp.float32) * take, jnp.where(seen, merged, -jnp.inf)


def _merge_sink(out, lse, sink):
    """The sinks join the merged softmax once: one more column of logit sink[h] and no value, so
    O shrinks by exp(lse - lse'), lse' = logaddexp(lse, sink)."""
    merged = jnp.logaddexp(lse, sink[:, None])
    return out * jnp.exp(lse - merged).T[..., None]

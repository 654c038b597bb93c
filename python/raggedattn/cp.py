"""Context-parallel attention over a torch.distributed group: the all-gather strategy
(`attention`) and the ring strategy (`ring_attention`).

Each rank holds the zigzag shard of every document (raggedattn.cp_shard) of its Q, K and V. K and
V are gathered once (with GQA they are a fraction of Q's bytes), put back in document order, and
each of the rank's query pieces attends the keys it sees: under a causal mask the prefix of its
document up to the piece's end (the bottom-right alignment of the library's causal mask then puts
every query on its global diagonal), without a mask the whole document. The per-piece attention
is the library's own call on the rank's pieces as segments. The backward is autograd's: the
gathered keys' gradients are summed back onto their owners by the all-gather's own backward (a
reduce-scatter).

    plan = raggedattn.cp_shard.zigzag_shard(cu_seqlens, cp=world)       # once per batch
    idx = torch.from_numpy(plan.rank_index(rank))                       # shard q, k, v, labels
    out = raggedattn.cp.attention(q[idx], k[idx], v[idx], plan, rank, group, causal=True)

Masks: `attention` takes causal (with a left window too) and none; a window with a right side on
a mask that is not causal raises NotImplementedError (its pieces would need windows of their own).
`ring_attention` takes causal and none, without a window (its docstring says why).

CUDA graphs: the first call of a plan on a device makes its index tensors there (`_on`,
`_ring_steps`: a copy from the host, once); later calls neither copy from the host nor wait for
the device, so forward and backward can be captured after warm-up calls on a side stream, as
torch.cuda.graph asks. The collectives are NCCL's; over a ring of one nothing is sent.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import Tensor

from . import torch as _rt
from .cp_shard import ShardPlan, chunk_pair_mask, refuse_ring_window, row_ranges, window_left

__all__ = ["attention", "ring_attention"]


def _key_ranges(plan: ShardPlan, rank: int, causal: bool, left: int) -> np.ndarray:
    """int64 [pieces, 2]: the global key rows [start, end) each of the rank's query pieces sees."""
    pieces = plan.rank_pieces(rank)
    doc_start = plan.cu_seqlens[pieces[:, 0]].astype(np.int64)
    doc_end = plan.cu_seqlens[pieces[:, 0] + 1].astype(np.int64)
    if not causal:
        return np.stack([doc_start, doc_end], 1)
    end = pieces[:, 2]
    start = doc_start if left < 0 else np.maximum(doc_start, pieces[:, 1] - left)
    return np.stack([np.minimum(start, end), end], 1)


def _gather_tokens(x: Tensor, plan: ShardPlan, group) -> Tensor:
    """Every rank's rows of x in global token order (autograd: the backward sums each row's
    gradient from every rank onto the rank that owns it)."""
    sizes = _rank_sizes(plan)
    padded = torch.cat([x, x.new_zeros((max(sizes) - x.shape[0],) + tuple(x.shape[1:]))])
    parts = dist_fn.all_gather(padded, group=group)
    ranked = torch.cat([p[:n] for p, n in zip(parts, sizes)])
    return ranked.index_select(0, _on(plan, "inverse", x.device, plan.inverse_permutation))


def _rank_sizes(plan: ShardPlan):
    """Every rank's token count."""
    return plan.derived("sizes", lambda: [len(plan.rank_index(r)) for r in range(plan.cp)])


def _on(plan: ShardPlan, key, device, make):
    """The plan's NumPy array make() as a tensor on `device`, made and copied once per plan."""
    return plan.derived((key, str(device)), lambda: torch.from_numpy(np.asarray(make())).to(device))


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan: ShardPlan,
    rank: int,
    group: Optional[dist.ProcessGroup] = None,
    *,
    causal: bool = False,
    window: Tuple[int, int] = (-1, -1),
    softmax_scale: Optional[float] = None,
    softcap: float = 0.0,
    dq_accum: str = "fp32",
    deterministic: bool = False,
    sink: Optional[Tensor] = None,
) -> Tensor:
    """The attention of this rank's query rows (q: its shard, [local tokens, Hq, Dqk], in
    `plan.rank_index(rank)` order; k, v likewise) over their documents across the group. Returns
    out [local tokens, Hq, Dv] in the same order. sink: learnable attention sinks [Hq], as in
    raggedattn.torch.attention (every query row runs once, so the sinks' gradient is exact; it is
    this rank's share, which data parallelism's gradient reduction sums over the group).

    deterministic: bitwise the same gradients from run to run. The library's deterministic
    backward, and the rank's first and second chunks in two calls: within each, no key row is
    read twice, so the keys' gradients are scattered back without atomic additions, and the two
    calls' gradients add in autograd's fixed order."""
    left = window_left("raggedattn.cp.attention", causal, window)
    local = len(plan.rank_index(rank))
    if q.shape[0] != local or k.shape[0] != local or v.shape[0] != local:
        raise ValueError(
            f"rank {rank} holds {local} tokens of the plan; got q, k, v with "
            f"{q.shape[0]}, {k.shape[0]}, {v.shape[0]} rows")
    k_all = _gather_tokens(k, plan, group)
    v_all = _gather_tokens(v, plan, group)
    ranges = _key_ranges(plan, rank, causal, left)
    q_cu = plan.rank_cu_seqlens(rank)
    options = dict(causal=causal, causal_alignment="bottom_right",
                   window=(left, 0) if causal else (-1, -1), softmax_scale=softmax_scale,
                   softcap=softcap, dq_accum=dq_accum, deterministic=deterministic, sink=sink)
    if not deterministic:
        return _pieces_attention(q, k_all, v_all, q_cu, ranges, np.arange(len(ranges)), options,
                                 plan, (rank, causal, left, "all"))
    # Chunks r (even pieces) and 2·cp - 1 - r (odd pieces) apart; each call's rows back in place.
    out = None
    for first in (0, 1):
        pieces = np.arange(first, len(ranges), 2)
        rows = _on(plan, ("chunk rows", rank, first), q.device,
                   lambda: row_ranges(q_cu[:-1][pieces], q_cu[1:][pieces]))
        part = _pieces_attention(q.index_select(0, rows), k_all, v_all, q_cu, ranges, pieces,
                                 options, plan, (rank, causal, left, first))
        if out is None:
            out = q.new_zeros(q.shape[:2] + (v.shape[2],))
        out = out.index_copy(0, rows, part)
    return out


def _pieces_attention(q, k_all, v_all, q_cu, ranges, pieces, options, plan, key) -> Tensor:
    """The library's call on the query pieces `pieces` (q: their rows, concatenated), each piece
    a segment over its key range of the gathered keys. `key` names the call's index arrays in
    the plan's cache."""
    q_lengths = (q_cu[1:] - q_cu[:-1])[pieces]
    kv_lengths = (ranges[:, 1] - ranges[:, 0])[pieces]
    rows = _on(plan, ("key rows", key), q.device,
               lambda: row_ranges(ranges[pieces, 0], ranges[pieces, 1]))
    cu_q = _on(plan, ("cu_q", key), q.device,
               lambda: np.concatenate([[0], np.cumsum(q_lengths)]).astype(np.int32))
    cu_kv = _on(plan, ("cu_kv", key), q.device,
                lambda: np.concatenate([[0], np.cumsum(kv_lengths)]).astype(np.int32))
    return _rt.attention(
        q,
        k_all.index_select(0, rows),
        v_all.index_select(0, rows),
        cu_q,
        cu_kv,
        max(int(q_lengths.max(initial=0)), 1),
        max(int(kv_lengths.max(initial=0)), 1),
        **options,
    )


# --- the ring strategy ---------------------------------------------------------------------------


def _peer(group, group_rank: int) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _exchange(tensors, sizes_from, plan: ShardPlan, rank: int, group):
    """Sends `tensors` to the next rank of the ring and receives the previous rank's, of
    `sizes_from` rows (the sending rank's token count); returns (received, requests)."""
    world = plan.cp
    if world == 1:  # a ring of one: what leaves arrives back as it is (no transport to itself)
        return list(tensors), []
    nxt, prv = _peer(group, (rank + 1) % world), _peer(group, (rank - 1) % world)
    received = [t.new_empty((sizes_from,) + tuple(t.shape[1:])) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, prv, group) for r in received]
    return received, dist.batch_isend_irecv(ops)


def _ring_steps(plan: ShardPlan, rank: int, causal: bool, device):
    """Per ring step s (the keys of rank src = rank - s): the pairs of this rank's query chunk
    kind and src's key chunk kind that see each other, each with its mask and its rows and
    segments as tensors on `device` (made once per plan and mask).

    Kinds: 0 = chunk r (the rank's first of each document), 1 = chunk 2·cp − 1 − r. Which pairs
    run, and how, is cp_shard.chunk_pair_mask's: without a causal mask all four pairs at every
    step, unmasked; under one, query chunk i sees key chunk j entirely where j < i (no mask), on
    the diagonal where j == i (causal; the same chunk, at step 0), not at all where j > i."""
    return plan.derived(("ring", rank, causal, str(device)),
                        lambda: _make_ring_steps(plan, rank, causal, device))


def _make_ring_steps(plan: ShardPlan, rank: int, causal: bool, device):
    cp = plan.cp

    def kind_rows(r):
        pieces = plan.rank_pieces(r)
        lengths = pieces[:, 2] - pieces[:, 1]
        starts = np.concatenate([[0], np.cumsum(lengths)])[:-1]
        out = []
        for kind in (0, 1):
            sel = np.arange(kind, len(pieces), 2)
            out.append((row_ranges(starts[sel], starts[sel] + lengths[sel]), lengths[sel]))
        return out

    mine = kind_rows(rank)
    steps = []
    for s in range(cp):
        src = (rank - s) % cp
        theirs = kind_rows(src)
        pairs = []
        for qk, i in enumerate(plan.rank_chunks(rank)):
            for kk, j in enumerate(plan.rank_chunks(src)):
                mask = chunk_pair_mask(i, j, causal)
                if mask is None:
                    continue
                (q_rows, q_len), (k_rows, k_len) = mine[qk], theirs[kk]
                pairs.append(dict(causal=(mask == "causal"), q_rows=_t(q_rows, device),
                                  k_rows=_t(k_rows, device),
                                  cu_q=_t(np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32),
                                          device),
                                  cu_k=_t(np.concatenate([[0], np.cumsum(k_len)]).astype(np.int32),
                                          device),
                                  max_q=max(int(q_len.max(initial=0)), 1),
                                  max_k=max(int(k_len.max(initial=0)), 1)))
        steps.append((src, pairs))
    return steps


def _t(a, device):
    return torch.from_numpy(a).to(device)


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, plan, rank, group, causal, scale, softcap, dq_bf16,
                deterministic):
        steps = _ring_steps(plan, rank, causal, q.device)
        sizes = _rank_sizes(plan)
        out = torch.zeros(q.shape[:2] + (v.shape[2],), dtype=torch.float32, device=q.device)
        lse = torch.full((q.shape[1], q.shape[0]), -float("inf"), device=q.device)
        kv = (k, v)
        for s, (src, pairs) in enumerate(steps):
            pending = None
            if s + 1 < plan.cp:  # the next step's keys travel while this step computes
                pending = _exchange(kv, sizes[(rank - s - 1) % plan.cp], plan, rank, group)
            for p in pairs:
                qi, ki = p["q_rows"], p["k_rows"]
                o_c, lse_c = torch.ops.raggedattn.fwd(
                    q.index_select(0, qi), kv[0].index_select(0, ki), kv[1].index_select(0, ki),
                    p["cu_q"], p["cu_k"], None, None, p["max_q"],
                    p["max_k"], p["causal"], True, -1, 0 if p["causal"] else -1, scale, softcap,
                    dq_bf16, deterministic)
                old = lse.index_select(1, qi)
                new = torch.logaddexp(old, lse_c)
                keep = torch.where(new.isneginf(), 0.0, torch.exp(old - new)).T[..., None]
                take = torch.where(new.isneginf(), 0.0, torch.exp(lse_c - new)).T[..., None]
                out.index_copy_(0, qi, out.index_select(0, qi) * keep + o_c.float() * take)
                lse.index_copy_(1, qi, new)
            if pending is not None:
                received, requests = pending
                for r in requests:
                    r.wait()
                kv = tuple(received)
        if sink is not None:
            out, lse = _merge_sink(out, lse, sink)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse, sink)
        ctx.args = (plan, rank, group, scale, softcap, dq_bf16, deterministic, steps, sizes)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse, sink = ctx.saved_tensors
        plan, rank, group, scale, softcap, dq_bf16, deterministic, steps, sizes = ctx.args
        d_out = d_out.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = (k, v)
        dkv = (torch.zeros(k.shape, dtype=torch.float32, device=q.device),
               torch.zeros(v.shape, dtype=torch.float32, device=q.device))
        for s, (src, pairs) in enumerate(steps):
            for p in pairs:
                qi, ki = p["q_rows"], p["k_rows"]
                dq_c, dk_c, dv_c, _ = torch.ops.raggedattn.bwd(
                    d_out.index_select(0, qi), q.index_select(0, qi), kv[0].index_select(0, ki),
                    kv[1].index_select(0, ki), out.index_select(0, qi), lse.index_select(1, qi),
                    p["cu_q"], p["cu_k"], None, None, p["max_q"],
                    p["max_k"], p["causal"], True, -1, 0 if p["causal"] else -1, scale, softcap,
                    dq_bf16, deterministic)
                dq.index_add_(0, qi, dq_c.float())
                dkv[0].index_add_(0, ki, dk_c.float())
                dkv[1].index_add_(0, ki, dv_c.float())
            # The keys and their gradients move on together; after the last step the gradients
            # take one more hop, back to their owner.
            prev = (rank - s - 1) % plan.cp
            if s + 1 < plan.cp:
                received, requests = _exchange(kv + dkv, sizes[prev], plan, rank, group)
                for r in requests:
                    r.wait()
                kv, dkv = tuple(received[:2]), tuple(received[2:])
            else:
                received, requests = _exchange(dkv, sizes[rank], plan, rank, group)
                for r in requests:
                    r.wait()
                dkv = tuple(received)
        d_sink = None if sink is None else _sink_grad(d_out, out, lse, sink)
        return (dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), d_sink) + (None,) * 8


def _merge_sink(out, lse, sink):
    """The sinks join the merged softmax once, after every step: one more column of logit
    sink[h] and no value, so O shrinks by exp(lse - lse') and lse' = logaddexp(lse, sink)."""
    new = torch.logaddexp(lse, sink.float()[:, None])
    keep = torch.where(lse.isneginf(), 0.0, torch.exp(lse - new)).T[..., None]
    return out * keep, new


def _sink_grad(d_out, out, lse, sink):
    """This rank's share of d_sink[h] = -sum_i exp(sink_h - lse_i) dot(dO_i, O_i): the sink
    column's dS summed over the rank's rows. The steps' backward needs nothing else: the merged
    LSE already holds the sink."""
    row_term = (d_out.float() * out.float()).sum(-1).T  # [Hq, rows]
    p_sink = torch.exp(sink.float()[:, None] - lse)
    return (-(p_sink * row_term).sum(1)).to(sink.dtype)


def ring_attention(q: Tensor, k: Tensor, v: Tensor, plan: ShardPlan, rank: int,
                   group: Optional[dist.ProcessGroup] = None, *, causal: bool = True,
                   window: Tuple[int, int] = (-1, -1), softmax_scale: Optional[float] = None,
                   softcap: float = 0.0, dq_accum: str = "fp32", deterministic: bool = False,
                   sink: Optional[Tensor] = None) -> Tensor:
    """The ring strategy: K/V chunks travel around the group, each step's attention runs while
    the next step's chunks are in flight, partial outputs merge with their LSEs in fp32; the
    backward sends dK/dV around with the chunks and uses the merged O and LSE, so each step's
    gradients are exact. Sinks join the merge once, after the last step (their gradient is this
    rank's share, as in `attention`). Same arguments and result as
    `attention(..., causal=causal)`.

    causal: True (the default), each query chunk runs against the chunks at or before it, the
    diagonal masked; False, every query chunk against every key chunk of its document at every
    step, unmasked.

    window: none ((-1, -1), or (-1, 0) under a causal mask: the causal mask itself); a sliding
    window raises NotImplementedError. With a window a query chunk sees only the chunks near it, so
    the ring would carry every K/V chunk to every rank for nothing, and each off-diagonal pair's
    band sits at an offset that differs per document, which the library's one window per call
    cannot express. Sliding windows use the all-gather strategy (`attention(..., window=...)`);
    TransformerEngine's context parallelism likewise serves them with all-gather, not its p2p ring."""
    refuse_ring_window("raggedattn.cp.ring_attention", window,
                       "raggedattn.cp.attention(..., window=...)", causal)
    local = len(plan.rank_index(rank))
    if q.shape[0] != local or k.shape[0] != local or v.shape[0] != local:
        raise ValueError(
            f"rank {rank} holds {local} tokens of the plan; got q, k, v with "
            f"{q.shape[0]}, {k.shape[0]}, {v.shape[0]} rows")
    scale = float(softmax_scale) if softmax_scale is not None else q.shape[-1] ** -0.5
    if sink is not None:
        _rt._sink_input(sink, q)  # the same checks as attention()'s
    return _Ring.apply(q, k, v, sink, plan, rank, group, bool(causal), scale, float(softcap),
                       dq_accum == "bf16", bool(deterministic))

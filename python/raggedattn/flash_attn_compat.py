"""FlashAttention-compatible varlen functions on raggedattn (PyTorch).

`flash_attn_varlen_func`, `flash_attn_varlen_kvpacked_func` and `flash_attn_varlen_qkvpacked_func`
take FlashAttention-2's arguments and return what it returns, so that code written against
`flash_attn` switches with one import:

    from raggedattn.torch import flash_attn_varlen_func

Semantics kept from FlashAttention-2:
- `causal` is aligned to the bottom-right corner (query i of a segment sees key j when
  j <= i + len_k - len_q), and so is `window_size=(left, right)`; -1 is unbounded, and with
  `causal` the right side is 0.
- `softmax_scale=None` is 1/sqrt(head dim); `softcap` is cap * tanh(scale * q.k / cap).
- `return_attn_probs=True` returns `(out, softmax_lse, None)`: the LSE is float32
  [num_heads, total_q], +inf for a row that sees no key (so that exp(s - lse) is 0).
- Head dims up to 256 that the kernels lack (FlashAttention-2 takes every multiple of 8) run
  zero-padded to the next head dim raggedattn has; the scale stays that of the original dim.
- FlashAttention-3's `seqused_q` / `seqused_k`: each segment b uses only the first
  seqused[b] rows of its slot [cu_seqlens[b], cu_seqlens[b + 1]) (raggedattn's padded THD
  layout); the other rows of `out` come out as zeros.
- FlashAttention-4's `learnable_sink` ([num_heads_q], float32 or 16-bit, computed in float32):
  head h's logit joins every row's softmax as one more column with no value (raggedattn's
  `sink`); its gradient comes back in the tensor's dtype.

What raggedattn does not have raises NotImplementedError naming the argument before anything
runs: `dropout_p > 0`, `alibi_slopes`, `block_table` (paged KV), head dims over 256. The error is
an `UnsupportedFeature` (a NotImplementedError) whose `.features` names the arguments.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import torch as _rt

__all__ = [
    "UnsupportedFeature",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]

_MAX_HEAD_DIM = 256


class UnsupportedFeature(NotImplementedError):
    """A FlashAttention argument raggedattn does not implement. `.features` names the arguments,
    so a caller (or a test suite written for FlashAttention) can tell a missing feature from a
    failure and take another path for that call."""

    def __init__(self, message: str, features):
        super().__init__(message)
        self.features = tuple(features)


def _unsupported(argument: str, given, why: str = "") -> UnsupportedFeature:
    detail = f": {why}" if why else ""
    return UnsupportedFeature(
        f"raggedattn flash_attn_varlen_func: {argument}={given!r} is not supported{detail}",
        [argument])


@lru_cache(maxsize=None)
def _library_takes(dqk: int, dv: int) -> bool:
    """Whether the library has kernels for head dims (dqk, dv): asked of it, on a one-token
    problem on the CPU backend (the support list lives in one place, the library)."""
    cu = torch.tensor([0, 1], dtype=torch.int32)
    q = torch.zeros(1, 1, dqk)
    try:
        _rt.attention(q, q, torch.zeros(1, 1, dv), cu, cu, 1, 1)
    except ValueError as error:
        if "head_dim" in str(error):
            return False
        raise
    return True


@lru_cache(maxsize=None)
def _head_dims_to_run(dqk: int, dv: int) -> Tuple[int, int]:
    """(dqk, dv) where the library takes them, else the smallest equal pair above both that it
    takes (zero columns change no dot product, and the extra output columns are cut off)."""
    if _library_takes(dqk, dv):
        return dqk, dv
    for d in range(max(dqk, dv), _MAX_HEAD_DIM + 1):
        if _library_takes(d, d):
            return d, d
    raise _unsupported("head dim", (dqk, dv), f"head dims up to {_MAX_HEAD_DIM} run")


def _window(window_size: Sequence[int], causal: bool) -> Tuple[int, int]:
    left, right = (int(x) for x in window_size)  # a list, a tuple or a 2-element tensor
    left = -1 if left < 0 else left
    right = 0 if causal else (-1 if right < 0 else right)
    return left, right


def _padded_layout(cu_seqlens: Tensor, seqused: Optional[Tensor]):
    """(cu_seqlens, seq_offsets) for the library: FlashAttention's slots with their used rows."""
    if seqused is None:
        return cu_seqlens, None
    used = torch.zeros_like(cu_seqlens)
    used[1:] = torch.cumsum(seqused.to(torch.int32), 0)
    return used, cu_seqlens


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: Optional[Tensor] = None,
    *,
    seqused_q: Optional[Tensor] = None,
    seqused_k: Optional[Tensor] = None,
    learnable_sink: Optional[Tensor] = None,
):
    """FlashAttention-2's flash_attn_varlen_func: q [total_q, Hq, D], k and v [total_k, Hkv, D]
    (Hq a multiple of Hkv), bf16 or fp16 on CUDA (fp32 too on the CPU). Returns out
    [total_q, Hq, Dv], or (out, softmax_lse, None) with return_attn_probs. learnable_sink:
    FlashAttention-4's attention sinks, [Hq] (raggedattn.torch.attention's `sink`)."""
    if dropout_p is not None and float(dropout_p) > 0.0:
        raise _unsupported("dropout_p", dropout_p, "raggedattn has no dropout")
    if alibi_slopes is not None:
        raise _unsupported("alibi_slopes", "a tensor", "raggedattn has no ALiBi bias")
    if block_table is not None:
        raise _unsupported("block_table", "a tensor", "raggedattn has no paged KV cache")
    dqk, dv = int(q.shape[-1]), int(v.shape[-1])
    run_qk, run_v = _head_dims_to_run(dqk, dv)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(dqk)
    if (run_qk, run_v) != (dqk, dv):
        q = F.pad(q, [0, run_qk - dqk])
        k = F.pad(k, [0, run_qk - dqk])
        v = F.pad(v, [0, run_v - dv])
    cu_q, off_q = _padded_layout(cu_seqlens_q, seqused_q)
    cu_k, off_k = _padded_layout(cu_seqlens_k, seqused_k)
    if (off_q is None) != (off_k is None):  # the library's padded layout covers both sides
        off_q = cu_seqlens_q if off_q is None else off_q
        off_k = cu_seqlens_k if off_k is None else off_k
    out, lse = _rt.attention(
        q,
        k,
        v,
        cu_q,
        cu_k,
        int(max_seqlen_q),
        int(max_seqlen_k),
        causal=bool(causal),
        causal_alignment="bottom_right",
        window=_window(window_size, bool(causal)),
        softmax_scale=float(softmax_scale),
        softcap=float(softcap),
        seq_offsets_q=off_q,
        seq_offsets_kv=off_k,
        deterministic=bool(deterministic),
        return_lse=True,
        sink=learnable_sink,
    )
    if run_v != dv:
        out = out[..., :dv]
    if not return_attn_probs:
        return out
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
    return out, lse, None


def flash_attn_varlen_kvpacked_func(
    q: Tensor,
    kv: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    learnable_sink: Optional[Tensor] = None,
):
    """kv [total_k, 2, Hkv, D]: K and V as strided views of it (no copy)."""
    k, v = kv.unbind(1)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
        softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, learnable_sink=learnable_sink,
    )


def flash_attn_varlen_qkvpacked_func(
    qkv: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Tensor] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    learnable_sink: Optional[Tensor] = None,
):
    """qkv [total, 3, H, D]: Q, K and V as strided views of it (no copy)."""
    q, k, v = qkv.unbind(1)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
        learnable_sink=learnable_sink,
    )

"""PyTorch binding: raggedattn.torch.attention, a torch.library custom op with autograd.

Two ops, raggedattn::fwd and raggedattn::bwd, each with a fake (meta) implementation, so
torch.compile traces them without graph breaks. They run on the current CUDA stream, take their
workspace from the caching allocator, and send CPU tensors to the library's CPU (reference)
backend.
"""

from __future__ import annotations

import contextlib
from typing import Optional, Tuple

from ._framework import missing_framework

try:
    import torch
except ImportError as _error:
    raise missing_framework(__name__, "PyTorch", "torch", _error) from _error
from torch import Tensor

from . import _C
from ._options import Options, make_options

__all__ = [
    "attention",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
]

_DTYPES = {
    torch.bfloat16: _C.DTYPE_BF16,
    torch.float16: _C.DTYPE_FP16,
    torch.float32: _C.DTYPE_FP32,  # the CPU backend only; the library says so on CUDA
}


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_kv: Tensor,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    *,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: Tuple[int, int] = (-1, -1),
    softmax_scale: Optional[float] = None,
    softcap: float = 0.0,
    seq_offsets_q: Optional[Tensor] = None,
    seq_offsets_kv: Optional[Tensor] = None,
    dq_accum: str = "fp32",
    deterministic: bool = False,
    return_lse: bool = False,
    sink: Optional[Tensor] = None,
):
    """Attention over packed variable-length segments (the shape of flash_attn_varlen_func).

    q: [total_q, Hq, Dqk]; k: [total_kv, Hkv, Dqk]; v: [total_kv, Hkv, Dv] (Hq % Hkv == 0),
    bfloat16 or float16 (float32 on CPU tensors). Token and head strides pass through (packed
    QKV views work); the last dim must be contiguous.
    cu_seqlens_q/kv: int32 [B + 1]; segment b holds rows [cu[b], cu[b+1]).
    seq_offsets_q/kv: int32 [B + 1], optional (padded THD): segment b starts at row offset[b];
    rows outside every segment are padding and come out as zeros.
    max_seqlen_q/kv: upper bounds of the segment lengths (host ints).
    causal_alignment: "top_left" (query i sees keys <= i) or "bottom_right" (<= i + len_kv - len_q).
    window: (left, right) sliding window on the same diagonal; -1 is unbounded.
    dq_accum: "fp32" or "bf16" scratch for the backward's dQ; deterministic: bitwise repeatable
    backward.
    sink: optional learnable attention sinks, [Hq] on q's device (float32; bfloat16 and float16
    are computed in float32): head h's logit sink[h], in the scores' units (after softmax_scale and
    softcap), joins every row's softmax as one more column with no value. Differentiable.

    Returns o [total_q, Hq, Dv], and with return_lse also lse, float32 [Hq, total_q] (natural log;
    -inf for rows that see no key, sink[h] with sinks). lse is differentiable: its gradient flows
    into q, k and the sinks.
    """
    opts = make_options(
        causal=causal,
        causal_alignment=causal_alignment,
        window=window,
        softmax_scale=softmax_scale,
        softcap=softcap,
        dq_accum=dq_accum,
        deterministic=deterministic,
    )
    _check_inputs(q, k, v, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q, seq_offsets_kv)
    sink = _sink_input(sink, q)
    o, lse = torch.ops.raggedattn.fwd(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_kv,
        seq_offsets_q,
        seq_offsets_kv,
        int(max_seqlen_q),
        int(max_seqlen_kv),
        *_option_args(opts),
        sink,
    )
    return (o, lse) if return_lse else o


# --- checks only Python can make: ranks, dtypes, devices, shapes that must agree ---------------


def _check_inputs(q, k, v, cu_q, cu_kv, off_q, off_kv) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise ValueError(f"raggedattn: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(
                f"raggedattn: {name} has shape {tuple(t.shape)}; expected 3 dims "
                "[tokens, heads, head_dim]"
            )
    if q.dtype not in _DTYPES:
        raise ValueError(
            f"raggedattn: q has dtype {q.dtype}; supported: torch.bfloat16, torch.float16 "
            "(and torch.float32 on CPU tensors)"
        )
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise ValueError(f"raggedattn: {name} has dtype {t.dtype} but q has {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"raggedattn: {name} is on {t.device} but q is on {q.device}")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"raggedattn: tensors on {q.device}; supported: cpu, cuda")
    if k.shape[0] != v.shape[0] or k.shape[1] != v.shape[1]:
        raise ValueError(
            f"raggedattn: k {tuple(k.shape)} and v {tuple(v.shape)} must agree in tokens and heads"
        )
    if q.shape[2] != k.shape[2]:
        raise ValueError(
            f"raggedattn: q {tuple(q.shape)} and k {tuple(k.shape)} must have the same head_dim"
        )
    _check_index("cu_seqlens_q", cu_q, q.device)
    _check_index("cu_seqlens_kv", cu_kv, q.device)
    if cu_q.shape[0] != cu_kv.shape[0]:
        raise ValueError(
            f"raggedattn: cu_seqlens_q has {cu_q.shape[0]} entries and cu_seqlens_kv "
            f"{cu_kv.shape[0]}; both are [batch + 1]"
        )
    if (off_q is None) != (off_kv is None):
        raise ValueError("raggedattn: give both seq_offsets_q and seq_offsets_kv, or neither")
    if off_q is not None:
        _check_index("seq_offsets_q", off_q, q.device)
        _check_index("seq_offsets_kv", off_kv, q.device)
        for name, t in (("seq_offsets_q", off_q), ("seq_offsets_kv", off_kv)):
            if t.shape[0] < cu_q.shape[0] - 1:
                raise ValueError(
                    f"raggedattn: {name} has {t.shape[0]} entries; need one per segment "
                    f"({cu_q.shape[0] - 1})"
                )


_SINK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _sink_input(sink, q: Tensor) -> Optional[Tensor]:
    """The sinks as the op takes them: float32 [Hq] on q's device (a 16-bit sink is upcast; its
    gradient comes back in its own dtype through the cast's backward)."""
    if sink is None:
        return None
    if not isinstance(sink, Tensor):
        raise ValueError(f"raggedattn: sink must be a torch.Tensor, got {type(sink).__name__}")
    if sink.dtype not in _SINK_DTYPES:
        raise ValueError(
            f"raggedattn: sink has dtype {sink.dtype}; supported: torch.float32 (torch.bfloat16 "
            "and torch.float16 are upcast to float32)"
        )
    if tuple(sink.shape) != (q.shape[1],):
        raise ValueError(
            f"raggedattn: sink has shape {tuple(sink.shape)}; expected ({q.shape[1]},), one logit "
            "per query head"
        )
    if sink.device != q.device:
        raise ValueError(f"raggedattn: sink is on {sink.device} but q is on {q.device}")
    return sink.float().contiguous()


def _check_index(name: str, t, device) -> None:
    if not isinstance(t, Tensor):
        raise ValueError(f"raggedattn: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1 or t.dtype != torch.int32:
        raise ValueError(
            f"raggedattn: {name} is {t.dtype} of shape {tuple(t.shape)}; expected 1-D torch.int32"
        )
    if t.device != device:
        raise ValueError(f"raggedattn: {name} is on {t.device} but q is on {device}")


def _option_args(opts: Options):
    return (
        opts.causal,
        opts.bottom_right,
        opts.window_left,
        opts.window_right,
        opts.softmax_scale,
        opts.softcap,
        opts.dq_accum_bf16,
        opts.deterministic,
    )


# --- the library call -----------------------------------------------------------------------


def _with_strides(t: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
    """t with a contiguous last dim, and its (token, head) element strides for the library.

    Strides of size-1 dims are arbitrary in PyTorch and a broadcast dim has stride 0, which the
    library reads as "contiguous": such tensors get canonical strides or a copy.
    """
    if t.shape[2] > 1 and t.stride(2) != 1:
        t = t.contiguous()
    head = t.stride(1) if t.shape[1] > 1 else t.shape[2]
    token = t.stride(0) if t.shape[0] > 1 else t.shape[1] * head
    if head == 0 or token == 0:
        t = t.contiguous()
        head, token = t.shape[2], t.shape[1] * t.shape[2]
    return t, (token, head)


def _contiguous_strides(heads: int, dim: int) -> Tuple[int, int]:
    return (heads * dim, dim)


def _plan(q, k, v, o_strides, d_o_strides, q_strides, k_strides, v_strides, cu_q, has_offsets,
          max_q, max_kv, opts: Options, has_sink: bool):
    p = _C.Problem()
    p.batch = cu_q.shape[0] - 1
    p.total_q, p.num_heads_q, p.head_dim_qk = q.shape
    p.total_kv, p.num_heads_kv = k.shape[0], k.shape[1]
    p.head_dim_v = v.shape[2]
    p.max_seqlen_q = max_q
    p.max_seqlen_kv = max_kv
    p.has_seq_offsets = int(has_offsets)
    p.dtype = _DTYPES[q.dtype]
    p.q_strides, p.k_strides, p.v_strides = q_strides, k_strides, v_strides
    p.o_strides, p.d_o_strides = o_strides, d_o_strides
    # Gradients are always allocated contiguous.
    p.dq_strides = _contiguous_strides(q.shape[1], q.shape[2])
    p.dk_strides = _contiguous_strides(k.shape[1], k.shape[2])
    p.dv_strides = _contiguous_strides(v.shape[1], v.shape[2])
    opts.fill(p, _C)
    p.has_sink = int(has_sink)
    # Outputs are allocated uninitialized: the library writes zeros in their padding rows.
    p.zero_padding = 1
    if q.device.type == "cuda":
        p.backend = _C.BACKEND_CUDA
        return _C.get_plan(p, q.device.index if q.device.index is not None else -1)
    p.backend = _C.BACKEND_CPU
    return _C.get_plan(p, -1)


def _address(t: Optional[Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _on_device(t: Tensor):
    """The device guard and stream of a call on t's device."""
    if t.device.type != "cuda":
        return contextlib.nullcontext(), 0
    return torch.cuda.device(t.device), torch.cuda.current_stream(t.device).cuda_stream


def _workspace(plan, direction: int, device) -> Tuple[Optional[Tensor], int]:
    nbytes = plan.workspace_size(direction)
    if nbytes == 0:
        return None, 0
    return torch.empty(nbytes, dtype=torch.uint8, device=device), nbytes


def _options_from(args) -> Options:
    causal, bottom_right, wl, wr, scale, softcap, dq_bf16, det = args
    return Options(causal, bottom_right, wl, wr, scale, softcap, dq_bf16, det)


@torch.library.custom_op("raggedattn::fwd", mutates_args=())
def _fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_kv: Tensor,
    seq_offsets_q: Optional[Tensor],
    seq_offsets_kv: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_kv: int,
    causal: bool,
    bottom_right: bool,
    window_left: int,
    window_right: int,
    softmax_scale: float,
    softcap: float,
    dq_accum_bf16: bool,
    deterministic: bool,
    sink: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    opts = _options_from(
        (causal, bottom_right, window_left, window_right, softmax_scale, softcap, dq_accum_bf16,
         deterministic)
    )
    q, q_strides = _with_strides(q)
    k, k_strides = _with_strides(k)
    v, v_strides = _with_strides(v)
    total_q, hq, _ = q.shape
    dv = v.shape[2]
    contiguous_o = _contiguous_strides(hq, dv)
    # The backward's plan is this one when dO arrives contiguous, as it usually does.
    plan = _plan(q, k, v, contiguous_o, contiguous_o, q_strides, k_strides, v_strides,
                 cu_seqlens_q, seq_offsets_q is not None, max_seqlen_q, max_seqlen_kv, opts,
                 sink is not None)
    sink = _sink_input(sink, q)  # the op called directly: the same checks as attention()'s
    # Uninitialized: the plan's zero_padding mode writes the rows outside every segment.
    o = torch.empty((total_q, hq, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((hq, total_q), dtype=torch.float32, device=q.device)
    guard, stream = _on_device(q)
    with guard:
        workspace, nbytes = _workspace(plan, _C.FORWARD, q.device)
        plan.forward(
            _address(q), _address(k), _address(v), _address(o), _address(lse),
            _address(cu_seqlens_q), _address(cu_seqlens_kv),
            _address(seq_offsets_q), _address(seq_offsets_kv),
            _address(workspace), nbytes, stream, sink=_address(sink),
        )
    return o, lse


@_fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q, seq_offsets_kv, *args):
    total_q, hq, _ = q.shape
    o = q.new_empty((total_q, hq, v.shape[2]))
    lse = q.new_empty((hq, total_q), dtype=torch.float32)
    return o, lse


@torch.library.custom_op("raggedattn::bwd", mutates_args=())
def _bwd(
    d_o: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_kv: Tensor,
    seq_offsets_q: Optional[Tensor],
    seq_offsets_kv: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_kv: int,
    causal: bool,
    bottom_right: bool,
    window_left: int,
    window_right: int,
    softmax_scale: float,
    softcap: float,
    dq_accum_bf16: bool,
    deterministic: bool,
    sink: Optional[Tensor] = None,
    d_lse: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv, and d_sink (float32 [Hq]; empty without sinks). d_lse: the LSE's cotangent
    (float32 [Hq, total_q]); None is zeros."""
    opts = _options_from(
        (causal, bottom_right, window_left, window_right, softmax_scale, softcap, dq_accum_bf16,
         deterministic)
    )
    q, q_strides = _with_strides(q)
    k, k_strides = _with_strides(k)
    v, v_strides = _with_strides(v)
    o, o_strides = _with_strides(o)
    # dO comes from autograd in any layout (a sum's is a broadcast of zero strides).
    d_o, d_o_strides = _with_strides(d_o)
    lse = lse.contiguous()
    has_sink = sink is not None
    sink = _sink_input(sink, q)
    if d_lse is not None:
        d_lse = d_lse.to(torch.float32).contiguous()
    plan = _plan(q, k, v, o_strides, d_o_strides, q_strides, k_strides, v_strides, cu_seqlens_q,
                 seq_offsets_q is not None, max_seqlen_q, max_seqlen_kv, opts, has_sink)
    # Uninitialized: the zero_padding mode writes zeros in the padding rows, which belong to no
    # segment's gradient.
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    d_sink = torch.empty((q.shape[1] if has_sink else 0,), dtype=torch.float32, device=q.device)
    guard, stream = _on_device(q)
    with guard:
        workspace, nbytes = _workspace(plan, _C.BACKWARD, q.device)
        plan.backward(
            _address(q), _address(k), _address(v), _address(o), _address(d_o), _address(lse),
            _address(dq), _address(dk), _address(dv),
            _address(cu_seqlens_q), _address(cu_seqlens_kv),
            _address(seq_offsets_q), _address(seq_offsets_kv),
            _address(workspace), nbytes, stream,
            sink=_address(sink), d_sink=_address(d_sink if has_sink else None),
            d_lse=_address(d_lse),
        )
    return dq, dk, dv, d_sink


@_bwd.register_fake
def _bwd_fake(d_o, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q, seq_offsets_kv,
              max_seqlen_q, max_seqlen_kv, causal, bottom_right, window_left, window_right,
              softmax_scale, softcap, dq_accum_bf16, deterministic, sink=None, d_lse=None):
    d_sink = q.new_empty((q.shape[1] if sink is not None else 0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), d_sink


_N_OPTION_ARGS = 10  # max_seqlen_q, max_seqlen_kv and the eight options


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_q, cu_kv, off_q, off_kv = inputs[:7]
    sink = inputs[7 + _N_OPTION_ARGS]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_kv, off_q, off_kv, sink)
    ctx.options = tuple(inputs[7:7 + _N_OPTION_ARGS])
    # Unused outputs' gradients arrive as None: no zeros are made for an LSE nobody reads, and
    # the library gets no d_lse then.
    ctx.set_materialize_grads(False)


def _backward(ctx, d_o: Optional[Tensor], d_lse: Optional[Tensor]):
    q, k, v, o, lse, cu_q, cu_kv, off_q, off_kv, sink = ctx.saved_tensors
    if d_o is None:  # only the LSE is differentiated
        d_o = torch.zeros_like(o)
    dq, dk, dv, d_sink = torch.ops.raggedattn.bwd(d_o, q, k, v, o, lse, cu_q, cu_kv, off_q,
                                                  off_kv, *ctx.options, sink, d_lse)
    return (dq, dk, dv) + (None,) * (4 + _N_OPTION_ARGS) + (d_sink if sink is not None else None,)


torch.library.register_autograd("raggedattn::fwd", _backward, setup_context=_setup_context)

# FlashAttention-compatible entry points (flash_attn_compat.py), over `attention` above.
from .flash_attn_compat import (  # noqa: E402  (they call back into this module)
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

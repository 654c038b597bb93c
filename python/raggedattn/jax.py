"""JAX binding: raggedattn.jax.attention, a jax.custom_vjp over two XLA FFI calls.

raggedattn_fwd and raggedattn_bwd are C++ handlers in the extension, registered for the CPU
(running the library's reference backend) and for CUDA. Options travel as FFI attributes. Each
call's workspace is one more result buffer whose size comes from the library's plan, made here at
trace time; the handler looks the same plan up in the shared cache when it runs.

Packing comes either as cu_seqlens (the THD layout, as in the PyTorch binding) or as MaxText-style
segment_ids, from which the segment arrays are derived inside the traced computation.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional, Tuple

from ._framework import missing_framework

try:
    import jax
    import jax.numpy as jnp
except ImportError as _error:
    raise missing_framework(__name__, "JAX", "jax", _error) from _error
import numpy as np

from . import _C
from ._options import Options, make_options

__all__ = ["attention"]

if not _C.has_xla_ffi:
    raise ImportError(
        "raggedattn was built without the XLA FFI headers, so its JAX binding is missing: "
        "reinstall with jaxlib present in the build environment (see python/README.md)"
    )

_DTYPES = {
    jnp.dtype(jnp.bfloat16): _C.DTYPE_BF16,
    jnp.dtype(jnp.float16): _C.DTYPE_FP16,
    jnp.dtype(jnp.float32): _C.DTYPE_FP32,  # the CPU backend only; the library says so on CUDA
}


def _register_targets() -> None:
    for name, by_platform in _C.xla_ffi_targets().items():
        for platform, capsule in by_platform.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)


_register_targets()


@dataclasses.dataclass(frozen=True)
class _Static:
    """What the FFI calls need besides arrays; hashable, a non-differentiable custom_vjp arg."""

    max_seqlen_q: int
    max_seqlen_kv: int
    has_offsets: bool
    opts: Options
    cuda: bool  # the platform the workspace is sized for
    device: int  # its device (CUDA), -1 for the CPU
    has_sink: bool = False  # the sink array holds [Hq] logits (else it is an empty placeholder)
    lse_cotangent: bool = False  # the LSE is returned: its cotangent goes to the backward


def attention(
    q,
    k,
    v,
    cu_seqlens_q=None,
    cu_seqlens_kv=None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    *,
    segment_ids=None,
    max_segments_per_seq: Optional[int] = None,
    causal: bool = False,
    causal_alignment: str = "top_left",
    window: Tuple[int, int] = (-1, -1),
    softmax_scale: Optional[float] = None,
    softcap: float = 0.0,
    seq_offsets_q=None,
    seq_offsets_kv=None,
    dq_accum: str = "fp32",
    deterministic: bool = False,
    return_lse: bool = False,
    sink=None,
):
    """Attention over packed variable-length segments; differentiable in q, k, v and sink.

    Packing, one of:
      cu_seqlens_q/kv: int32 [B + 1] (segment b holds rows [cu[b], cu[b+1])), optionally with
        seq_offsets_q/kv, int32 [B + 1] (padded THD: segment b starts at row offset[b]).
        q: [total_q, Hq, Dqk]; k: [total_kv, Hkv, Dqk]; v: [total_kv, Hkv, Dv].
      segment_ids: int32 [total] or [batch, seq] (self-attention; 0 marks padding): a segment is a
        run of equal non-zero ids within one row. q, k, v are [total, H, D], or [batch, seq, H, D]
        with [batch, seq] ids, and the output has q's leading shape.
        max_segments_per_seq bounds the segments of one row (default: seq, one per token, which
        is always enough; a tighter bound shrinks the GPU's scratch and grid). If a row holds
        more, the output is NaN under jit and a ValueError outside it.

    max_seqlen_q/kv: static upper bounds of the segment lengths; default: the longest segment
    when the segment arrays are concrete, else the token count (always a valid bound).

    sink: optional learnable attention sinks, [Hq] (float32; bfloat16 and float16 are computed in
    float32): head h's logit sink[h], in the scores' units (after softmax_scale and softcap), joins
    every row's softmax as one more column with no value. Differentiable.

    The options are those of raggedattn.torch.attention. Returns o (q's dtype), and with
    return_lse also lse, float32 [Hq, total_q] (-inf for rows that see no key, sink[h] with
    sinks); lse is differentiable: its cotangent flows into q, k and sink.
    Padding rows of o (and of the gradients) are zeros.
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
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    out_lead = None  # q's leading shape when given as [batch, seq, H, D]
    overflow = None
    if segment_ids is not None:
        if cu_seqlens_q is not None or cu_seqlens_kv is not None or seq_offsets_q is not None:
            raise ValueError(
                "raggedattn: give either segment_ids or cu_seqlens_q/kv (and seq_offsets), not both"
            )
        ids = jnp.asarray(segment_ids)
        if ids.ndim not in (1, 2) or not jnp.issubdtype(ids.dtype, jnp.integer):
            raise ValueError(
                f"raggedattn: segment_ids is {ids.dtype} of shape {ids.shape}; expected integer "
                "[total] or [batch, seq]"
            )
        rows, row_len = (1, ids.shape[0]) if ids.ndim == 1 else ids.shape
        if q.ndim == 4:
            if ids.ndim != 2 or q.shape[:2] != ids.shape:
                raise ValueError(
                    f"raggedattn: q of shape {q.shape} needs segment_ids of shape {q.shape[:2]}, "
                    f"got {ids.shape}"
                )
            out_lead = q.shape[:2]
            q, k, v = (_flatten_rows(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
        _check_arrays(q, k, v)
        if q.shape[0] != ids.size or k.shape[0] != ids.size:
            raise ValueError(
                f"raggedattn: segment_ids has {ids.size} tokens but q has {q.shape[0]} and k "
                f"{k.shape[0]} rows; segment_ids describes self-attention over one packing"
            )
        per_row = row_len if max_segments_per_seq is None else int(max_segments_per_seq)
        if per_row < 1:
            raise ValueError(f"raggedattn: max_segments_per_seq={max_segments_per_seq}; need >= 1")
        cu, offsets, count = _segments_from_ids(ids.astype(jnp.int32), row_len, rows * per_row)
        if _is_concrete(count):
            if int(count) > rows * per_row:
                raise ValueError(
                    f"raggedattn: segment_ids hold {int(count)} segments, more than "
                    f"max_segments_per_seq={per_row} per row allows ({rows * per_row})"
                )
        else:
            overflow = count > rows * per_row
        cu_q = cu_kv = cu
        off_q = off_kv = offsets
        max_q = max_kv = row_len
    else:
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise ValueError("raggedattn: give cu_seqlens_q and cu_seqlens_kv, or segment_ids")
        _check_arrays(q, k, v)
        cu_q = _index_array("cu_seqlens_q", cu_seqlens_q)
        cu_kv = _index_array("cu_seqlens_kv", cu_seqlens_kv)
        if cu_q.shape != cu_kv.shape:
            raise ValueError(
                f"raggedattn: cu_seqlens_q has {cu_q.shape[0]} entries and cu_seqlens_kv "
                f"{cu_kv.shape[0]}; both are [batch + 1]"
            )
        if (seq_offsets_q is None) != (seq_offsets_kv is None):
            raise ValueError("raggedattn: give both seq_offsets_q and seq_offsets_kv, or neither")
        off_q = off_kv = None
        if seq_offsets_q is not None:
            off_q = _index_array("seq_offsets_q", seq_offsets_q)
            off_kv = _index_array("seq_offsets_kv", seq_offsets_kv)
            for name, a in (("seq_offsets_q", off_q), ("seq_offsets_kv", off_kv)):
                if a.shape[0] < cu_q.shape[0] - 1:
                    raise ValueError(
                        f"raggedattn: {name} has {a.shape[0]} entries; need one per segment "
                        f"({cu_q.shape[0] - 1})"
                    )
        max_q = _longest(cu_q, q.shape[0])
        max_kv = _longest(cu_kv, k.shape[0])
    if max_seqlen_q is not None:
        max_q = int(max_seqlen_q)
    if max_seqlen_kv is not None:
        max_kv = int(max_seqlen_kv)

    sink = _sink_array(sink, q)
    cuda, device = _target(q)
    static = _Static(max_q, max_kv, off_q is not None, opts, cuda, device,
                     has_sink=sink is not None, lse_cotangent=bool(return_lse))
    # Sizing the workspaces makes the plan: a problem the library rejects raises here, at trace
    # time, with its message.
    _plan(q.shape, k.shape, v.shape, q.dtype, cu_q.shape[0] - 1, static)
    if sink is not None:
        # Varying where q varies (inside shard_map): the cast's transpose sums the sinks'
        # per-device gradients over those axes.
        sink = _like(sink, q)
    o, lse = _attention(
        q, k, v, sink, cu_q, cu_kv,
        cu_q if off_q is None else off_q,  # placeholders, unread without offsets
        cu_kv if off_kv is None else off_kv,
        static,
    )
    if not return_lse:
        lse = jax.lax.stop_gradient(lse)
    if overflow is not None:
        o = jnp.where(overflow, jnp.asarray(jnp.nan, o.dtype), o)
    if out_lead is not None:
        o = o.reshape(out_lead + o.shape[1:])
    return (o, lse) if return_lse else o


# --- checks only Python can make -------------------------------------------------------------


def _check_arrays(q, k, v) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 3:
            raise ValueError(
                f"raggedattn: {name} has shape {x.shape}; expected 3 dims [tokens, heads, head_dim]"
                " (or [batch, seq, heads, head_dim] with segment_ids)"
            )
    if q.dtype not in _DTYPES:
        raise ValueError(
            f"raggedattn: q has dtype {q.dtype}; supported: bfloat16, float16 (and float32 on "
            "the CPU)"
        )
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise ValueError(f"raggedattn: {name} has dtype {x.dtype} but q has {q.dtype}")
    if k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"raggedattn: k {k.shape} and v {v.shape} must agree in tokens and heads"
        )
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"raggedattn: q {q.shape} and k {k.shape} must have the same head_dim")


def _sink_array(sink, q):
    """float32 [Hq] sinks (16-bit ones upcast; their cotangent comes back in their dtype)."""
    if sink is None:
        return None
    sink = jnp.asarray(sink)
    if not jnp.issubdtype(sink.dtype, jnp.floating):
        raise ValueError(
            f"raggedattn: sink has dtype {sink.dtype}; supported: float32 (bfloat16 and float16 "
            "are upcast to float32)"
        )
    if sink.shape != (q.shape[1],):
        raise ValueError(
            f"raggedattn: sink has shape {sink.shape}; expected ({q.shape[1]},), one logit per "
            "query head"
        )
    return sink.astype(jnp.float32)


def _flatten_rows(x, name: str):
    if x.ndim != 4:
        raise ValueError(
            f"raggedattn: {name} has shape {x.shape}; with q as [batch, seq, heads, dim] it must "
            "be 4-D too"
        )
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def _index_array(name: str, a):
    a = jnp.asarray(a)
    if a.ndim != 1 or a.dtype != jnp.int32:
        raise ValueError(f"raggedattn: {name} is {a.dtype} of shape {a.shape}; expected 1-D int32")
    return a


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _longest(cu, total: int) -> int:
    if _is_concrete(cu) and cu.shape[0] > 1:
        return max(int(np.max(np.diff(np.asarray(cu)))), 0)
    return int(total)


def _target(x) -> Tuple[bool, int]:
    """The platform (and device) the call is for, as JAX places it: a committed array's device; an
    uncommitted one's where no default device is set (jax.default_device), else the default, as
    for a tracer."""
    default = getattr(jax.config, "jax_default_device", None)
    if isinstance(default, str):
        default = jax.devices(default)[0]
    device = None
    if _is_concrete(x) and (default is None or getattr(x, "committed", True)):
        try:
            device = next(iter(x.devices()))
        except (AttributeError, StopIteration):
            device = None
    if device is None:
        device = default if default is not None else jax.devices()[0]
    if device.platform == "cpu":
        return False, -1
    if device.platform in ("gpu", "cuda"):
        ordinal = getattr(device, "local_hardware_id", None)  # the CUDA ordinal in this process
        return True, int(device.id if ordinal is None else ordinal)
    raise ValueError(f"raggedattn: arrays on platform {device.platform!r}; supported: cpu, cuda")


# --- segments from MaxText-style segment ids --------------------------------------------------


def _segments_from_ids(ids, row_len: int, max_segments: int):
    """cu_seqlens, seq_offsets (both int32 [max_segments + 1]) and the number of segments.

    A segment starts where a non-zero id differs from the token before it, or a row begins;
    segment b's valid tokens are the run from offsets[b]. Unused entries are zero-length segments
    at the end of the tensor.
    """
    ids = ids.reshape(-1)
    total = ids.shape[0]
    position = jnp.arange(total, dtype=jnp.int32)
    previous = jnp.concatenate([jnp.zeros((1,), jnp.int32), ids[:-1]])
    valid = ids != 0
    starts = valid & ((position % row_len == 0) | (ids != previous))
    segment = jnp.cumsum(starts.astype(jnp.int32)) - 1
    count = jnp.sum(starts.astype(jnp.int32))
    (first,) = jnp.nonzero(starts, size=max_segments, fill_value=total)
    lengths = jax.ops.segment_sum(
        valid.astype(jnp.int32),
        jnp.where(valid, segment, max_segments),  # out of range: dropped
        num_segments=max_segments,
    )
    zero = jnp.zeros((1,), jnp.int32)
    cu = jnp.concatenate([zero, jnp.cumsum(lengths).astype(jnp.int32)])
    offsets = jnp.concatenate([first.astype(jnp.int32), jnp.full((1,), total, jnp.int32)])
    return cu, offsets, count


# --- the FFI calls and their VJP ----------------------------------------------------------------


def _plan(q_shape, k_shape, v_shape, dtype, batch: int, st: _Static):
    p = _C.Problem()
    p.batch = batch
    p.total_q, p.num_heads_q, p.head_dim_qk = q_shape
    p.total_kv, p.num_heads_kv = k_shape[0], k_shape[1]
    p.head_dim_v = v_shape[2]
    p.max_seqlen_q = st.max_seqlen_q
    p.max_seqlen_kv = st.max_seqlen_kv
    p.has_seq_offsets = int(st.has_offsets)
    p.dtype = _DTYPES[jnp.dtype(dtype)]
    st.opts.fill(p, _C)  # strides stay 0: contiguous, as the handler's problem has them
    p.has_sink = int(st.has_sink)
    p.zero_padding = 1  # outputs are uninitialized, as in the handler's problem
    p.backend = _C.BACKEND_CUDA if st.cuda else _C.BACKEND_CPU
    return _C.get_plan(p, st.device)


def _ffi_attributes(st: _Static) -> dict:
    """The attributes of both handlers (xla_ffi.cpp, AttnAttrs), with their exact types."""
    o = st.opts
    return dict(
        max_seqlen_q=np.int64(st.max_seqlen_q),
        max_seqlen_kv=np.int64(st.max_seqlen_kv),
        has_seq_offsets=bool(st.has_offsets),
        causal=bool(o.causal),
        bottom_right=bool(o.bottom_right),
        window_left=np.int64(o.window_left),
        window_right=np.int64(o.window_right),
        softmax_scale=np.float32(o.softmax_scale),
        softcap=np.float32(o.softcap),
        dq_accum_bf16=bool(o.dq_accum_bf16),
        deterministic=bool(o.deterministic),
        has_sink=bool(st.has_sink),
        has_d_lse=bool(st.lse_cotangent),
    )


def _placeholder(x):
    """x, or where it is None the empty operand the handlers leave unread (no sinks, no LSE
    cotangent). Made here, inside each FFI call's function, rather than passed through the
    custom_vjp: a zero-size residual of a shard_map's gradient crashed jaxlib 0.11.2's compiler
    (Shardy's ManualComputationUnusedInputsPattern), where the ring strategy, which makes its
    placeholders this way, compiled."""
    return jnp.zeros((0,), jnp.float32) if x is None else x


def _forward(q, k, v, sink, cu_q, cu_kv, off_q, off_kv, st: _Static):
    """O and LSE through the library's forward; sink None: none."""
    sink = _placeholder(sink)
    plan = _plan(q.shape, k.shape, v.shape, q.dtype, cu_q.shape[0] - 1, st)
    total_q, hq, _ = q.shape
    o_type = jax.ShapeDtypeStruct((total_q, hq, v.shape[2]), q.dtype)
    lse_type = jax.ShapeDtypeStruct((hq, total_q), jnp.float32)
    ws_type = jax.ShapeDtypeStruct((plan.workspace_size(_C.FORWARD),), jnp.uint8)
    call = jax.ffi.ffi_call("raggedattn_fwd", (o_type, lse_type, ws_type))
    o, lse, _ = call(q, k, v, cu_q, cu_kv, off_q, off_kv, sink, **_ffi_attributes(st))
    return o, lse


def _backward(q, k, v, o, lse, d_o, sink, d_lse, cu_q, cu_kv, off_q, off_kv, st: _Static):
    """dq, dk, dv and d_sink (float32 [Hq]; empty without sinks). d_lse is read only where the
    LSE is returned (st.lse_cotangent), and None otherwise; sink None: none."""
    sink, d_lse = _placeholder(sink), _placeholder(d_lse)
    plan = _plan(q.shape, k.shape, v.shape, q.dtype, cu_q.shape[0] - 1, st)
    ws_type = jax.ShapeDtypeStruct((plan.workspace_size(_C.BACKWARD),), jnp.uint8)
    grad_types = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
    d_sink_type = jax.ShapeDtypeStruct(sink.shape, jnp.float32)
    call = jax.ffi.ffi_call("raggedattn_bwd", grad_types + (d_sink_type, ws_type))
    dq, dk, dv, d_sink, _ = call(
        q, k, v, o, lse, d_o.astype(q.dtype), cu_q, cu_kv, off_q, off_kv, sink, d_lse,
        **_ffi_attributes(st)
    )
    return dq, dk, dv, d_sink


def _varying_axes(x) -> frozenset:
    """The mesh axes along which x varies inside shard_map (none outside it)."""
    aval = jax.typeof(x) if hasattr(jax, "typeof") else None
    axes = getattr(aval, "vma", None)
    if axes is None:
        axes = getattr(getattr(aval, "manual_axis_type", None), "varying", None)
    return frozenset(axes or ())


def _like(result, operand):
    """An FFI call's result marked varying along the mesh axes its operand varies along: inside
    shard_map the call computes each device's own values, which JAX cannot see through a custom
    call (its custom_vjp then rejects cotangents whose manual-axis types differ from the
    primals')."""
    missing = tuple(sorted(_varying_axes(operand) - _varying_axes(result)))
    if not missing:
        return result
    cast = getattr(jax.lax, "pcast", None)
    if cast is not None:
        return cast(result, missing, to="varying")
    return jax.lax.pvary(result, missing)


def _outputs(q, k, v, sink, cu_q, cu_kv, off_q, off_kv, st: _Static):
    o, lse = _forward(q, k, v, sink, cu_q, cu_kv, off_q, off_kv, st)
    return _like(o, q), _like(lse, q)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8,))
def _attention(q, k, v, sink, cu_q, cu_kv, off_q, off_kv, st: _Static):
    return _outputs(q, k, v, sink, cu_q, cu_kv, off_q, off_kv, st)


def _attention_fwd(q, k, v, sink, cu_q, cu_kv, off_q, off_kv, st: _Static):
    o, lse = _outputs(q, k, v, sink, cu_q, cu_kv, off_q, off_kv, st)
    return (o, lse), (q, k, v, sink, o, lse, cu_q, cu_kv, off_q, off_kv)


def _attention_bwd(st: _Static, residuals, cotangents):
    q, k, v, sink, o, lse, cu_q, cu_kv, off_q, off_kv = residuals
    d_o, d_lse = cotangents
    # Without return_lse the LSE's cotangent is zero (attention() stops its gradient): the
    # library then gets none.
    d_lse = d_lse.astype(jnp.float32) if st.lse_cotangent else None
    dq, dk, dv, d_sink = _backward(q, k, v, o, lse, d_o, sink, d_lse, cu_q, cu_kv, off_q, off_kv,
                                   st)
    d_sink = _like(d_sink, sink) if st.has_sink else None
    return _like(dq, q), _like(dk, k), _like(dv, v), d_sink, None, None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)

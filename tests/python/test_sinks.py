"""Learnable attention sinks and the differentiable LSE, through both bindings, on the CPU backend.

Head h's sink logit joins every row's softmax as one more column with no value; the LSE counts it
(a row that sees no key has O = 0 and LSE = sink[h]); the LSE's cotangent flows into dq, dk and
d_sink. Checked against plain implementations of that math segment by segment (PyTorch in
float64 with its autograd; jax.numpy with jax.grad), with cotangents on O and on the LSE together
and on the LSE alone; against central differences of the library's own float32 outputs (a check
that needs no reference); rows that see no key, GQA and MQA, zero-length and padded segments,
16-bit sinks, torch.compile and opcheck, the plan cache, the FlashAttention drop-in's
learnable_sink, and inputs that must raise. Each framework's tests skip where it is missing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cases import (
    CASES_BY_NAME,
    assert_segments_close,
    assert_zero_rows,
    full_mask,
    make_packing,
    random_inputs,
    visible,
)

try:
    import torch
except ImportError:
    torch = None
try:
    import jax
    import jax.numpy as jnp
except ImportError:
    jax = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
needs_jax = pytest.mark.skipif(jax is None, reason="JAX is not installed")

# Cases with every feature the sinks meet: GQA and MQA, causal in both alignments (rows that see
# no key in cross_bottom_right's last segment), windows, softcap with a scale, padded THD, and
# zero-length and length-1 segments.
SINK_CASES = ["mha", "causal_gqa", "cross_bottom_right", "window_causal_bottom_right",
              "softcap_scale", "mqa_192_128", "padded_causal_gqa", "zero_and_one"]


def sinks(hq: int, seed: int = 7) -> np.ndarray:
    """float32 [hq] logits large enough to take a real share of each row (scores are O(1))."""
    return np.random.default_rng(seed).uniform(-1.0, 3.0, hq).astype(np.float32)


def lse_cotangent(case, packing, seed: int = 9) -> np.ndarray:
    """float32 [hq, total_q]: random on the segments' rows, zero on padding columns (which the
    library does not read, and a full-mask reference would count as rows that see no key)."""
    g = np.zeros((case.hq, packing.total_q), np.float32)
    rng = np.random.default_rng(seed)
    for r in packing.rows_q:
        g[:, r] = rng.standard_normal((case.hq, len(r)))
    return g


def no_key_rows(case, packing):
    """Query rows (global indices) of segments' rows that see no key."""
    rows = []
    for rq, rk in zip(packing.rows_q, packing.rows_kv):
        if len(rq):
            sees = visible(case, len(rq), len(rk)).any(axis=1)
            rows.extend(np.asarray(rq)[~sees].tolist())
    return rows


# =================================================================================================
# PyTorch
# =================================================================================================


def torch_reference(case, packing, q, k, v, sink):
    """Sink attention in q's dtype, segment by segment, differentiable in q, k, v and sink (None:
    no sinks): o [total_q, Hq, Dv] and lse [Hq, total_q]; padding rows zero."""
    group = case.hq // case.hkv
    o = q.new_zeros(packing.total_q, case.hq, case.head_dim_v)
    lse = q.new_zeros(case.hq, packing.total_q)
    for rq, rk in zip(packing.rows_q, packing.rows_kv):
        if len(rq) == 0:
            continue
        rq_t, rk_t = torch.as_tensor(rq), torch.as_tensor(rk)
        qs = q[rq_t].transpose(0, 1)  # [H, Lq, D]
        ks = k[rk_t].repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[rk_t].repeat_interleave(group, dim=1).transpose(0, 1)
        mask = torch.as_tensor(visible(case, len(rq), len(rk)))
        s = (qs @ ks.transpose(1, 2)) * case.scale
        if case.softcap:
            s = case.softcap * torch.tanh(s / case.softcap)
        s = s.masked_fill(~mask, -math.inf)
        columns = [s]
        if sink is not None:
            columns.append(sink.to(s.dtype)[:, None, None].expand(case.hq, len(rq), 1))
        logits = torch.cat(columns, dim=-1)
        seen = torch.isfinite(logits).any(-1)  # rows with a key or a sink
        # Rows with neither have LSE -inf and O 0: kept out of the logsumexp (no NaN gradients).
        lse_b = torch.where(seen, torch.logsumexp(torch.where(seen[..., None], logits, 0.0), -1),
                            -math.inf)
        p = torch.where(mask, torch.exp(s - torch.where(seen, lse_b, 0.0)[..., None]), 0.0)
        o = o.index_copy(0, rq_t, (p @ vs).transpose(0, 1))
        lse = lse.index_copy(1, rq_t, lse_b)
    return o, lse


def _torch_inputs(case, packing, dtype=None, seed=0):
    dtype = dtype or torch.float32
    q, k, v, d_o = (torch.from_numpy(x).to(dtype) for x in random_inputs(case, packing, seed))
    seg = dict(cu_seqlens_q=torch.from_numpy(packing.cu_q),
               cu_seqlens_kv=torch.from_numpy(packing.cu_kv))
    if packing.off_q is not None:
        seg.update(seq_offsets_q=torch.from_numpy(packing.off_q),
                   seq_offsets_kv=torch.from_numpy(packing.off_kv))
    return q, k, v, d_o, seg


def _torch_attention(case, q, k, v, seg, **extra):
    import raggedattn.torch as rt

    return rt.attention(q, k, v, seg["cu_seqlens_q"], seg["cu_seqlens_kv"],
                        max(max(case.lens_q), 1), max(max(case.kv_lens), 1),
                        seq_offsets_q=seg.get("seq_offsets_q"),
                        seq_offsets_kv=seg.get("seq_offsets_kv"), **case.options(), **extra)


def _np(t):
    return t.detach().double().numpy()


def _torch_grads(outputs, inputs, cotangents):
    grads = torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]


def _check_torch_against_reference(case, dtype, with_sink: bool, o_cotangent: bool,
                                   tol=(2e-6, 1e-5)):
    packing = make_packing(case)
    q, k, v, d_o, seg = _torch_inputs(case, packing, dtype)
    sink = torch.from_numpy(sinks(case.hq)) if with_sink else None
    d_lse = torch.from_numpy(lse_cotangent(case, packing))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    if with_sink:
        leaves.append(sink.clone().requires_grad_())
    o, lse = _torch_attention(case, *leaves[:3], seg, return_lse=True,
                              sink=leaves[3] if with_sink else None)
    assert o.dtype == dtype and lse.dtype == torch.float32
    assert lse.shape == (case.hq, packing.total_q)
    outputs, cotangents = ((o, lse), (d_o, d_lse)) if o_cotangent else ((lse,), (d_lse,))
    got = _torch_grads(outputs, leaves, cotangents)

    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    o_ref, lse_ref = torch_reference(case, packing, *ref_leaves[:3],
                                     ref_leaves[3] if with_sink else None)
    ref_outputs = (o_ref, lse_ref) if o_cotangent else (lse_ref,)
    want = _torch_grads(ref_outputs, ref_leaves, tuple(c.double() for c in cotangents))

    o_tol, g_tol = tol
    assert_segments_close(f"{case.name} o", _np(o), _np(o_ref), packing.rows_q, o_tol)
    assert_segments_close(f"{case.name} lse", _np(lse), _np(lse_ref), packing.rows_q, 1e-5,
                          axis=1)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        rows = packing.rows_q if name == "dq" else packing.rows_kv
        assert_segments_close(f"{case.name} {name}", _np(g), _np(w), rows, g_tol)
    if with_sink:
        assert got[3].dtype == torch.float32 and got[3].shape == (case.hq,)
        assert_segments_close(f"{case.name} d_sink", _np(got[3]), _np(want[3]),
                              [np.arange(case.hq)], g_tol)
    assert_zero_rows(f"{case.name} o", _np(o), packing.padding_q)
    assert_zero_rows(f"{case.name} dq", _np(got[0]), packing.padding_q)
    return o, lse, sink


@needs_torch
@pytest.mark.parametrize("name", SINK_CASES)
def test_torch_sinks_match_plain_implementation(name):
    """O, LSE and the gradients of q, k, v and the sinks with cotangents on O and on the LSE."""
    _check_torch_against_reference(CASES_BY_NAME[name], torch.float32, True, True)


@needs_torch
@pytest.mark.parametrize("name", ["causal_gqa", "cross_bottom_right", "padded_causal_gqa"])
def test_torch_lse_cotangent_alone(name):
    """O unused: the LSE's cotangent alone gives dq, dk and d_sink (and dv = 0)."""
    _check_torch_against_reference(CASES_BY_NAME[name], torch.float32, True, False)


@needs_torch
@pytest.mark.parametrize("name", ["mha", "cross_bottom_right", "zero_and_one"])
def test_torch_lse_is_differentiable_without_sinks(name):
    """No sinks: the LSE's cotangent flows into dq and dk (rows that see no key: LSE -inf, their
    cotangent is not read)."""
    _check_torch_against_reference(CASES_BY_NAME[name], torch.float32, False, True)


@needs_torch
@pytest.mark.parametrize("name", ["causal_gqa", "cross_bottom_right"])
def test_torch_bfloat16_with_sinks(name):
    _check_torch_against_reference(CASES_BY_NAME[name], torch.bfloat16, True, True,
                                   tol=(6e-3, 1.2e-2))


@needs_torch
def test_torch_rows_that_see_no_key_have_lse_sink():
    case = CASES_BY_NAME["cross_bottom_right"]  # its last segment: 7 queries over 2 keys
    packing = make_packing(case)
    rows = no_key_rows(case, packing)
    assert len(rows) == 5
    q, k, v, _, seg = _torch_inputs(case, packing)
    sink = torch.from_numpy(sinks(case.hq))
    o, lse = _torch_attention(case, q, k, v, seg, return_lse=True, sink=sink)
    assert torch.equal(lse[:, rows], sink[:, None].expand(-1, len(rows)))
    assert torch.count_nonzero(o[rows]) == 0
    _, lse_plain = _torch_attention(case, q, k, v, seg, return_lse=True)
    assert torch.isneginf(lse_plain[:, rows]).all()
    # d LSE_i / d sink = 1 for those rows: a cotangent on them alone goes to d_sink unchanged.
    sink.requires_grad_()
    _, lse = _torch_attention(case, q, k, v, seg, return_lse=True, sink=sink)
    w = torch.zeros_like(lse)
    w[:, rows] = torch.arange(1.0, 1.0 + case.hq)[:, None]
    (d_sink,) = torch.autograd.grad(lse, sink, w)
    torch.testing.assert_close(d_sink, w.sum(1), rtol=0, atol=0)


def _directional(f, x, direction, eps):
    """Central difference of the scalar f along direction, in float64 from float32 outputs."""
    return (f(x + eps * direction) - f(x - eps * direction)) / (2 * eps)


@needs_torch
@pytest.mark.parametrize("name", ["causal_gqa", "cross_bottom_right", "softcap_scale"])
def test_torch_gradients_match_finite_differences(name):
    """The library's float32 gradients of L = <o, g_o> + <lse, g_lse> against central differences
    of its own float32 outputs: for every sink and along random directions in q, k and v."""
    case = CASES_BY_NAME[name]
    packing = make_packing(case)
    q, k, v, d_o, seg = _torch_inputs(case, packing)
    sink = torch.from_numpy(sinks(case.hq))
    d_lse = torch.from_numpy(lse_cotangent(case, packing))

    def loss(q, k, v, sink):
        o, lse = _torch_attention(case, q, k, v, seg, return_lse=True, sink=sink)
        return float((o.double() * d_o.double()).sum() + (lse.double() * d_lse.double()).sum())

    leaves = [x.clone().requires_grad_() for x in (q, k, v, sink)]
    o, lse = _torch_attention(case, *leaves[:3], seg, return_lse=True, sink=leaves[3])
    grads = torch.autograd.grad((o, lse), leaves, (d_o, d_lse))
    args = [q, k, v, sink]
    for h in range(case.hq):  # each sink on its own
        e = torch.zeros(case.hq)
        e[h] = 1.0
        numeric = _directional(lambda s: loss(q, k, v, s), sink, e, 1e-2)
        assert abs(numeric - float(grads[3][h])) <= 2e-3 * max(1.0, abs(numeric)), (h, numeric,
                                                                                  grads[3])
    g = torch.Generator().manual_seed(3)
    for i, name_i in enumerate("qkv"):
        u = torch.randn(args[i].shape, generator=g)
        for rows in (packing.padding_q if name_i == "q" else []):
            u[rows] = 0.0  # padding rows are no input of any segment

        def along(x, i=i):
            moved = list(args)
            moved[i] = x
            return loss(*moved)

        numeric = _directional(along, args[i], u, 1e-3)
        analytic = float((grads[i].double() * u.double()).sum())
        assert abs(numeric - analytic) <= 2e-3 * max(1.0, abs(analytic)), (name_i, numeric,
                                                                           analytic)


@needs_torch
def test_torch_return_lse_false_matches_unused_lse():
    """Without return_lse the gradients are those of o alone (the library gets no d_lse)."""
    case = CASES_BY_NAME["causal_gqa"]
    packing = make_packing(case)
    q, k, v, d_o, seg = _torch_inputs(case, packing)
    sink = torch.from_numpy(sinks(case.hq))
    results = []
    for return_lse in (False, True):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, sink)]
        out = _torch_attention(case, *leaves[:3], seg, return_lse=return_lse, sink=leaves[3])
        o = out[0] if return_lse else out
        results.append(torch.autograd.grad(o, leaves, d_o))
    for a, b in zip(*results):
        assert torch.equal(a, b)


@needs_torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_16bit_sink_is_upcast(dtype):
    """A 16-bit sink runs as its float32 value; its gradient comes back in its own dtype."""
    dtype = getattr(torch, dtype)
    case = CASES_BY_NAME["causal_gqa"]
    packing = make_packing(case)
    q, k, v, d_o, seg = _torch_inputs(case, packing)
    sink16 = torch.from_numpy(sinks(case.hq)).to(dtype).requires_grad_()
    sink32 = sink16.detach().float().requires_grad_()
    o16 = _torch_attention(case, q, k, v, seg, sink=sink16)
    o32 = _torch_attention(case, q, k, v, seg, sink=sink32)
    assert torch.equal(o16, o32)
    (o16 * d_o).sum().backward()
    (o32 * d_o).sum().backward()
    assert sink16.grad.dtype == dtype
    assert torch.equal(sink16.grad, sink32.grad.to(dtype))


@needs_torch
def test_torch_plan_cache_tells_sinks_apart():
    """The same shapes with and without sinks are two plans (the problem's has_sink differs)."""
    case = CASES_BY_NAME["mha"]
    packing = make_packing(case)
    q, k, v, d_o, seg = _torch_inputs(case, packing)
    for sink in (None, torch.from_numpy(sinks(case.hq)), None):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        if sink is not None:
            leaves.append(sink.clone().requires_grad_())
        o, lse = _torch_attention(case, *leaves[:3], seg, return_lse=True,
                                  sink=leaves[3] if sink is not None else None)
        grads = torch.autograd.grad((o, lse), leaves, (d_o, torch.ones_like(lse)))
        assert all(torch.isfinite(g).all() for g in grads)


@needs_torch
def test_torch_opcheck_with_sinks():
    """Schema, fake tensors, autograd and AOT dispatch with sink and d_lse given."""
    case = CASES_BY_NAME["padded_causal_gqa"]
    packing = make_packing(case)
    q, k, v, d_o, seg = _torch_inputs(case, packing)
    q.requires_grad_()
    sink = torch.from_numpy(sinks(case.hq)).requires_grad_()
    options = (max(case.lens_q), max(case.kv_lens), True, False, -1, 0, 0.0, 0.0, False, False)
    fwd_args = (q, k, v, seg["cu_seqlens_q"], seg["cu_seqlens_kv"], seg["seq_offsets_q"],
                seg["seq_offsets_kv"]) + options + (sink,)
    torch.library.opcheck(torch.ops.raggedattn.fwd.default, fwd_args)
    o, lse = torch.ops.raggedattn.fwd(*fwd_args)
    d_lse = torch.from_numpy(lse_cotangent(case, packing))
    bwd_args = (d_o, q.detach(), k, v, o.detach(), lse.detach(), seg["cu_seqlens_q"],
                seg["cu_seqlens_kv"], seg["seq_offsets_q"], seg["seq_offsets_kv"]) + options
    torch.library.opcheck(torch.ops.raggedattn.bwd.default, bwd_args + (sink.detach(), d_lse))
    torch.library.opcheck(torch.ops.raggedattn.bwd.default, bwd_args + (None, d_lse))


@needs_torch
def test_torch_compile_fullgraph_with_sinks():
    case = CASES_BY_NAME["causal_gqa"]
    packing = make_packing(case)
    q, k, v, d_o, seg = _torch_inputs(case, packing)
    sink = torch.from_numpy(sinks(case.hq))
    d_lse = torch.from_numpy(lse_cotangent(case, packing))

    def f(q, k, v, sink):
        o, lse = _torch_attention(case, q, k, v, seg, return_lse=True, sink=sink)
        o_only = _torch_attention(case, q, k, v, seg, sink=sink)
        return (o * d_o).sum() + (lse * d_lse).sum() + (o_only * d_o).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (f, compiled):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, sink)]
        results.append(torch.autograd.grad(fn(*leaves), leaves))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@needs_torch
def test_flash_attn_learnable_sink():
    """learnable_sink (FlashAttention-4's name) is raggedattn's sink, on FlashAttention's
    bottom-right causal diagonal, in all three entry points."""
    import raggedattn.torch as rt

    case = CASES_BY_NAME["cross_bottom_right"]
    packing = make_packing(case)
    q, k, v, d_o, seg = _torch_inputs(case, packing)
    cu_q, cu_k = seg["cu_seqlens_q"], seg["cu_seqlens_kv"]
    max_q, max_k = max(case.lens_q), max(case.kv_lens)
    sink = torch.from_numpy(sinks(case.hq)).requires_grad_()
    out, lse, _ = rt.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                            return_attn_probs=True, learnable_sink=sink)
    want, want_lse = rt.attention(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                  causal_alignment="bottom_right", return_lse=True, sink=sink)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)  # finite: sinks in every row
    (d_sink,) = torch.autograd.grad((out * d_o).sum(), sink)
    (want_d_sink,) = torch.autograd.grad((want * d_o).sum(), sink)
    assert torch.equal(d_sink, want_d_sink)

    self_case = CASES_BY_NAME["mha"]
    packing = make_packing(self_case)
    q, k, v, _, seg = _torch_inputs(self_case, packing)
    cu, n = seg["cu_seqlens_q"], max(self_case.lens_q)
    sink = torch.from_numpy(sinks(self_case.hq))
    want = rt.flash_attn_varlen_func(q, k, v, cu, cu, n, n, learnable_sink=sink)
    kv = torch.stack([k, v], 1)
    got_kv = rt.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, n, n, learnable_sink=sink)
    got_qkv = rt.flash_attn_varlen_qkvpacked_func(torch.stack([q, k, v], 1), cu, n,
                                                  learnable_sink=sink)
    assert torch.equal(got_kv, want) and torch.equal(got_qkv, want)
    assert not torch.equal(want, rt.flash_attn_varlen_func(q, k, v, cu, cu, n, n))


def _torch_bad_sink(sink_of):
    import raggedattn.torch as rt

    q = torch.zeros(10, 2, 64)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    return lambda: rt.attention(q, q, q, cu, cu, 6, 6, sink=sink_of())


@needs_torch
@pytest.mark.parametrize("sink_of, fragment", [
    (lambda: torch.zeros(3), r"sink has shape \(3,\); expected \(2,\)"),
    (lambda: torch.zeros(1, 2), r"sink has shape \(1, 2\); expected \(2,\)"),
    (lambda: torch.zeros(2, dtype=torch.int32), "sink has dtype torch.int32; supported"),
    (lambda: torch.zeros(2, dtype=torch.float64), "sink has dtype torch.float64; supported"),
    (lambda: [0.0, 0.0], "sink must be a torch.Tensor, got list"),
    (lambda: torch.zeros(2, device="meta"), "sink is on meta but q is on cpu"),
], ids=["length", "rank", "int32", "float64", "list", "device"])
def test_torch_bad_sink_raises(sink_of, fragment):
    with pytest.raises(ValueError, match=fragment):
        _torch_bad_sink(sink_of)()


# =================================================================================================
# JAX
# =================================================================================================


def _jax_call(case, packing, q, k, v, sink, **extra):
    import raggedattn.jax as rj
    from jax_reference import segment_args

    return rj.attention(q, k, v, max_seqlen_q=max(max(case.lens_q), 1),
                        max_seqlen_kv=max(max(case.kv_lens), 1), sink=sink,
                        **segment_args(packing), **case.options(), **extra)


def _jax_loss(f, d_o, d_lse):
    def loss(q, k, v, sink):
        o, lse = f(q, k, v, sink)
        lse = jnp.where(d_lse != 0, lse, 0.0)  # -inf rows (no key, no sink) carry no cotangent
        return jnp.sum(o.astype(jnp.float32) * d_o) + jnp.sum(lse * d_lse)
    return loss


@needs_jax
@pytest.mark.parametrize("name", SINK_CASES)
def test_jax_sinks_match_reference(name):
    from jax_reference import reference

    case = CASES_BY_NAME[name]
    packing = make_packing(case)
    q, k, v, d_o = (jnp.asarray(x) for x in random_inputs(case, packing))
    sink = jnp.asarray(sinks(case.hq))
    d_lse = jnp.asarray(lse_cotangent(case, packing))
    mask = full_mask(case, packing)

    def ours(q, k, v, sink):
        return _jax_call(case, packing, q, k, v, sink, return_lse=True)

    def theirs(q, k, v, sink):
        return reference(q, k, v, mask, case.scale, case.softcap, sink=sink)

    with jax.default_device(jax.devices("cpu")[0]):
        o, lse = jax.jit(ours)(q, k, v, sink)
        o_ref, lse_ref = theirs(q, k, v, sink)
        got = jax.jit(jax.grad(_jax_loss(ours, d_o, d_lse), argnums=(0, 1, 2, 3)))(q, k, v, sink)
        want = jax.grad(_jax_loss(theirs, d_o, d_lse), argnums=(0, 1, 2, 3))(q, k, v, sink)
    assert_segments_close(f"{name} o", o, o_ref, packing.rows_q, 2e-6)
    assert_segments_close(f"{name} lse", lse, lse_ref, packing.rows_q, 1e-5, axis=1)
    for what, g, w in zip(("dq", "dk", "dv"), got, want):
        rows = packing.rows_q if what == "dq" else packing.rows_kv
        assert_segments_close(f"{name} {what}", g, w, rows, 1e-5)
    assert got[3].dtype == jnp.float32 and got[3].shape == (case.hq,)
    assert_segments_close(f"{name} d_sink", got[3], want[3], [np.arange(case.hq)], 1e-5)
    assert_zero_rows(f"{name} o", o, packing.padding_q)
    assert_zero_rows(f"{name} dq", got[0], packing.padding_q)


@needs_jax
def test_jax_rows_that_see_no_key_have_lse_sink():
    case = CASES_BY_NAME["cross_bottom_right"]
    packing = make_packing(case)
    rows = no_key_rows(case, packing)
    q, k, v, _ = (jnp.asarray(x) for x in random_inputs(case, packing))
    sink = jnp.asarray(sinks(case.hq))
    with jax.default_device(jax.devices("cpu")[0]):
        o, lse = _jax_call(case, packing, q, k, v, sink, return_lse=True)
        w = np.zeros((case.hq, packing.total_q), np.float32)
        w[:, rows] = 1.0
        d_sink = jax.grad(lambda s: jnp.sum(
            _jax_call(case, packing, q, k, v, s, return_lse=True)[1] * w))(sink)
    np.testing.assert_array_equal(np.asarray(lse)[:, rows],
                                  np.broadcast_to(np.asarray(sink)[:, None], (case.hq, len(rows))))
    assert not np.asarray(o)[rows].any()
    np.testing.assert_array_equal(np.asarray(d_sink), np.full(case.hq, len(rows), np.float32))


@needs_jax
def test_jax_bfloat16_sink_is_upcast():
    case = CASES_BY_NAME["causal_gqa"]
    packing = make_packing(case)
    q, k, v, d_o = (jnp.asarray(x) for x in random_inputs(case, packing))
    sink = jnp.asarray(sinks(case.hq), jnp.bfloat16)

    def loss(s):
        return jnp.sum(_jax_call(case, packing, q, k, v, s) * d_o)

    with jax.default_device(jax.devices("cpu")[0]):
        g16 = jax.grad(loss)(sink)
        g32 = jax.grad(loss)(sink.astype(jnp.float32))
    assert g16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(g16), np.asarray(g32.astype(jnp.bfloat16)))


@needs_jax
def test_jax_segment_ids_with_sinks():
    """MaxText-style segment_ids with sinks, against the reference on their mask."""
    import raggedattn.jax as rj
    from cases import mask_from_segment_ids, segment_ids_for
    from jax_reference import reference

    ids = segment_ids_for([[5, 9, 2], [16], [1, 3, 7, 1]], 20)
    rng = np.random.default_rng(4)
    q, k, v = (jnp.asarray(rng.standard_normal((60, h, 64)), jnp.float32) for h in (4, 2, 2))
    sink = jnp.asarray(sinks(4))
    valid = (ids.reshape(-1) != 0)
    w = jnp.asarray(rng.standard_normal((4, 60)) * valid, jnp.float32)
    mask = mask_from_segment_ids(ids, causal=True)

    def ours(q, sink):
        o, lse = rj.attention(q, k, v, segment_ids=jnp.asarray(ids), causal=True,
                              max_segments_per_seq=4, sink=sink, return_lse=True)
        return jnp.sum(o) + jnp.sum(lse * w)

    def theirs(q, sink):
        o, lse = reference(q, k, v, mask, 64**-0.5, sink=sink)
        return jnp.sum(jnp.where(valid[:, None, None], o, 0.0)) + jnp.sum(
            jnp.where(valid[None], lse, 0.0) * w)

    with jax.default_device(jax.devices("cpu")[0]):
        got = jax.jit(jax.grad(ours, argnums=(0, 1)))(q, sink)
        want = jax.grad(theirs, argnums=(0, 1))(q, sink)
    rows = [np.nonzero(valid)[0]]
    assert_segments_close("dq", got[0], want[0], rows, 1e-5)
    assert_segments_close("d_sink", got[1], want[1], [np.arange(4)], 1e-5)


@needs_jax
@pytest.mark.parametrize("sink, fragment", [
    (np.zeros(3, np.float32), r"sink has shape \(3,\); expected \(2,\)"),
    (np.zeros((1, 2), np.float32), r"sink has shape \(1, 2\); expected \(2,\)"),
    (np.zeros(2, np.int32), "sink has dtype int32; supported"),
], ids=["length", "rank", "int32"])
def test_jax_bad_sink_raises(sink, fragment):
    import raggedattn.jax as rj

    q = jnp.zeros((10, 2, 64), jnp.float32)
    cu = jnp.array([0, 4, 10], jnp.int32)
    with pytest.raises(ValueError, match=fragment):
        rj.attention(q, q, q, cu, cu, sink=sink)

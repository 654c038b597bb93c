"""raggedattn.torch.flash_attn_varlen_func and its packed forms against FlashAttention-2's
semantics, written out here as a float64 reference per segment: bottom-right causal alignment,
windows on that diagonal (right forced to 0 with causal), softcap, GQA, the LSE with +inf for rows
that see no key, zero-padded head dims, FlashAttention-3's seqused_q / seqused_k, and
NotImplementedError for what raggedattn lacks. On CPU tensors (the CPU backend) everywhere, and on
CUDA where there is a GPU."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
rt = pytest.importorskip("raggedattn.torch")
compat = pytest.importorskip("raggedattn.flash_attn_compat")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def fa2_reference(q, k, v, cu_q, cu_k, scale, causal, window, softcap):
    """out and lse in float64, segment by segment, with FlashAttention-2's masks."""
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), math.inf, dtype=torch.float64)
    left, right = window
    if causal:
        right = 0
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        lq, lk = q1 - q0, k1 - k0
        if lq == 0:
            continue
        s = torch.einsum("qhd,khd->hqk", q[q0:q1], k[k0:k1]) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(lq)[:, None] + (lk - lq)  # the bottom-right diagonal
        j = torch.arange(lk)[None, :]
        seen = torch.ones(lq, lk, dtype=torch.bool)
        if right >= 0:
            seen &= j <= i + right
        if left >= 0:
            seen &= j >= i - left
        s = s.masked_fill(~seen, -math.inf)
        row_lse = torch.logsumexp(s, -1)  # -inf where a row sees no key
        p = torch.exp(s - row_lse[..., None]).nan_to_num(0.0)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", p, v[k0:k1])
        lse[:, q0:q1] = torch.where(torch.isneginf(row_lse), math.inf, row_lse)
    return out, lse


def problem(lens_q, lens_k, hq, hkv, dqk, dv, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), hq, dqk, generator=g)
    k = torch.randn(int(cu_k[-1]), hkv, dqk, generator=g)
    v = torch.randn(int(cu_k[-1]), hkv, dv, generator=g)
    on = dict(device=device)
    return (q.to(dtype).to(**on), k.to(dtype).to(**on), v.to(dtype).to(**on),
            cu_q.to(**on), cu_k.to(**on), max(lens_q), max(lens_k))


def dtype_for(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


def tolerance(dtype):
    return 2e-5 if dtype == torch.float32 else 2e-2


# (name, q lengths, k lengths, heads, dims, causal, window, softcap)
CASES = [
    ("causal_q_shorter", [37, 1, 20], [50, 9, 20], (4, 2), (64, 64), True, (-1, -1), 0.0),
    ("causal_q_longer_rows_unseen", [30, 12], [10, 12], (4, 1), (128, 128), True, (-1, -1), 0.0),
    ("full_gqa", [17, 33], [17, 40], (6, 2), (64, 64), False, (-1, -1), 0.0),
    ("window_with_causal", [70, 5], [70, 5], (2, 2), (64, 64), True, (16, 8), 0.0),
    ("window_both_sides", [45], [60], (2, 1), (128, 128), False, (8, 4), 0.0),
    ("softcap", [31, 7], [31, 7], (4, 2), (64, 64), True, (-1, -1), 5.0),
    ("head_dim_80_padded", [19, 24], [19, 24], (2, 1), (80, 80), True, (-1, -1), 0.0),
    ("d192_dv128", [25], [25], (4, 2), (192, 128), True, (-1, -1), 0.0),
    ("zero_length_segment", [0, 13, 6], [4, 13, 0], (2, 1), (64, 64), False, (-1, -1), 0.0),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_flash_attention_semantics(case, device):
    name, lens_q, lens_k, (hq, hkv), (dqk, dv), causal, window, softcap = case
    dtype = dtype_for(device)
    q, k, v, cu_q, cu_k, mq, mk = problem(lens_q, lens_k, hq, hkv, dqk, dv, dtype, device, 7)
    out, lse, probs = rt.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, mq, mk, causal=causal, window_size=window, softcap=softcap,
        return_attn_probs=True)
    ref_out, ref_lse = fa2_reference(q.cpu(), k.cpu(), v.cpu(), cu_q.cpu(), cu_k.cpu(),
                                     dqk ** -0.5, causal, window, softcap)
    assert probs is None
    assert out.shape == (q.shape[0], hq, dv) and out.dtype == q.dtype
    assert lse.shape == (hq, q.shape[0]) and lse.dtype == torch.float32
    tol = tolerance(dtype)
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=tol, rtol=tol)
    assert torch.equal(torch.isposinf(lse.cpu()), torch.isposinf(ref_lse))  # rows seeing no key
    seen = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double().cpu()[seen], ref_lse[seen], atol=tol, rtol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_match_the_reference(device):
    dtype = dtype_for(device)
    q, k, v, cu_q, cu_k, mq, mk = problem([23, 9], [30, 9], 4, 2, 80, 80, dtype, device, 3)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = rt.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True, softcap=4.0)
    grad = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    qr, kr, vr = (t.detach().cpu().double().requires_grad_(True) for t in (q, k, v))
    ref, _ = fa2_reference(qr, kr, vr, cu_q.cpu(), cu_k.cpu(), 80 ** -0.5, True, (-1, -1), 4.0)
    rq, rk, rv = torch.autograd.grad(ref, (qr, kr, vr), grad.cpu().double())
    tol = 5 * tolerance(dtype)
    for got, want in ((dq, rq), (dk, rk), (dv, rv)):
        torch.testing.assert_close(got.double().cpu(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_packed_forms_are_the_same_call(device):
    dtype = dtype_for(device)
    q, k, v, cu, _, m, _ = problem([12, 31], [12, 31], 2, 2, 64, 64, dtype, device, 5)
    want = rt.flash_attn_varlen_func(q, k, v, cu, cu, m, m, causal=True)
    kv = torch.stack([k, v], 1)
    qkv = torch.stack([q, k, v], 1)
    torch.testing.assert_close(
        rt.flash_attn_varlen_kvpacked_func(q, kv, cu, cu, m, m, causal=True), want)
    torch.testing.assert_close(rt.flash_attn_varlen_qkvpacked_func(qkv, cu, m, causal=True), want)


@pytest.mark.parametrize("device", DEVICES)
def test_seqused_reads_only_the_used_rows_of_each_slot(device):
    dtype = dtype_for(device)
    slots = [16, 24]
    used_q, used_k = [10, 24], [16, 5]
    q, k, v, cu, _, m, _ = problem(slots, slots, 2, 1, 64, 64, dtype, device, 9)
    seqused_q = torch.tensor(used_q, dtype=torch.int32, device=device)
    seqused_k = torch.tensor(used_k, dtype=torch.int32, device=device)
    out = rt.flash_attn_varlen_func(q, k, v, cu, cu, m, m, causal=True, seqused_q=seqused_q,
                                    seqused_k=seqused_k)
    for b, (uq, uk) in enumerate(zip(used_q, used_k)):
        s = int(cu[b])
        cq = torch.tensor([0, uq], dtype=torch.int32, device=device)
        ck = torch.tensor([0, uk], dtype=torch.int32, device=device)
        alone = rt.flash_attn_varlen_func(q[s:s + uq], k[s:s + uk], v[s:s + uk], cq, ck, uq, uk,
                                          causal=True)
        torch.testing.assert_close(out[s:s + uq], alone)
        assert torch.count_nonzero(out[s + uq:int(cu[b + 1])]) == 0  # unused rows: zeros


@pytest.mark.parametrize(
    "argument, kwargs",
    [("dropout_p", dict(dropout_p=0.1)),
     ("alibi_slopes", dict(alibi_slopes=torch.ones(2))),
     ("block_table", dict(block_table=torch.zeros(1, 1, dtype=torch.int32)))],
)
def test_what_raggedattn_lacks_raises_naming_the_argument(argument, kwargs):
    q, k, v, cu, _, m, _ = problem([8], [8], 2, 2, 64, 64, torch.float32, "cpu", 1)
    with pytest.raises(NotImplementedError, match=argument) as raised:
        rt.flash_attn_varlen_func(q, k, v, cu, cu, m, m, **kwargs)
    # The features it names: how FlashAttention's own test suite tells a missing feature (a skip)
    # from a failure when it runs against this function.
    assert isinstance(raised.value, compat.UnsupportedFeature)
    assert raised.value.features == (argument,)


def test_head_dims_over_256_raise_not_implemented():
    q, k, v, cu, _, m, _ = problem([8], [8], 1, 1, 288, 288, torch.float32, "cpu", 1)
    with pytest.raises(NotImplementedError, match="head dim"):
        rt.flash_attn_varlen_func(q, k, v, cu, cu, m, m)

"""raggedattn.torch against PyTorch's math SDPA in float64, per segment, on CPU and CUDA tensors.

CPU tensors run the library's reference backend; CUDA tensors the GPU paths (skipped without a
GPU). Forward, LSE and gradients for the named cases of cases.py, the op's registration
(torch.library.opcheck), torch.compile without graph breaks, strides, streams and errors.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
import torch.nn.functional as F  # noqa: E402

import raggedattn  # noqa: E402
import raggedattn.torch as rt  # noqa: E402
from cases import (  # noqa: E402
    CASES,
    CASES_BY_NAME,
    Case,
    assert_zero_rows,
    make_packing,
    random_inputs,
    relative_error,
    visible,
)

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


# --- references ----------------------------------------------------------------------------------


class _PlainSoftmaxPV(torch.autograd.Function):
    """o = softmax(s) @ v in the inputs' dtype, and its backward by the fused kernels' math:
    dS = P * (dP - D) with D = rowsum(dO * O) over the rounded O (FlashAttention, cuDNN and this
    library all take D from the stored O) and dS rounded to the dtype before its products."""

    @staticmethod
    def forward(ctx, s, vh):
        p32 = torch.softmax(s, dim=-1).nan_to_num(0.0)
        p = p32.to(vh.dtype)
        o = p @ vh
        ctx.save_for_backward(p32, vh, o)
        return o

    @staticmethod
    def backward(ctx, d_o):
        p32, vh, o = ctx.saved_tensors
        d_o = d_o.to(vh.dtype)
        dv = p32.to(vh.dtype).transpose(-1, -2) @ d_o
        dp = (d_o @ vh.transpose(-1, -2)).float()
        d = (d_o.float() * o.float()).sum(-1, keepdim=True)
        ds = (p32 * (dp - d)).to(vh.dtype).float()
        return ds, dv


def _segment_reference(case, q, k, v, mask, plain: bool):
    """One segment, [L, H, D] tensors: o, lse. plain=False: float64 math SDPA (and the explicit
    formula with a softcap, which SDPA lacks). plain=True: a plain low-precision implementation
    of the same math (matmuls in the input dtype, softmax in float32, the backward of
    _PlainSoftmaxPV), the yardstick for GPU paths.
    """
    group = case.hq // case.hkv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    qh, kh, vh = (x.transpose(0, 1) for x in (q, k, v))  # [H, L, D]
    scale = case.scale
    m = torch.as_tensor(mask, device=q.device)
    s = (qh @ kh.transpose(1, 2)).float() * scale if plain else (qh @ kh.transpose(1, 2)) * scale
    if case.softcap:
        s = case.softcap * torch.tanh(s / case.softcap)
    s = s.masked_fill(~m, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    if plain:
        o = _PlainSoftmaxPV.apply(s, vh)
    elif case.softcap:
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        o = p @ vh
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=m, scale=scale)
    return o.transpose(0, 1), lse


def reference(case, packing, q, k, v, d_o, plain=False):
    """o, lse and dq, dk, dv over the packed tensors, segment by segment.

    float64 copies (or, plain, copies in the inputs' dtype) of q, k, v; padding rows zero."""
    dtype = q.dtype if plain else torch.float64
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    o = torch.zeros(packing.total_q, case.hq, case.head_dim_v, dtype=dtype, device=q.device)
    lse = torch.zeros(case.hq, packing.total_q, dtype=torch.float64, device=q.device)
    for rq, rk in zip(packing.rows_q, packing.rows_kv):
        if len(rq) == 0:
            continue
        rq_t = torch.as_tensor(rq, device=q.device)
        rk_t = torch.as_tensor(rk, device=q.device)
        ob, lb = _segment_reference(case, q[rq_t], k[rk_t], v[rk_t],
                                    visible(case, len(rq), len(rk)), plain)
        o = o.index_copy(0, rq_t, ob)
        lse[:, rq_t] = lb.detach().double()
    dq, dk, dv = torch.autograd.grad((o * d_o.to(dtype)).sum(), (q, k, v))
    return o.detach(), lse, dq, dk, dv


# --- comparisons ----------------------------------------------------------------------------------


def _np(t):
    return t.detach().double().cpu().numpy()


def _cosine(a, b):
    a, b = a.ravel(), b.ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return 1.0 if na == 0 and nb == 0 else float(a @ b / (na * nb + 1e-300))


def check_segments(what, got, want, rows, tol, plain=None, axis=0):
    """Per segment: relative error within tol or, given a plain low-precision result, within
    2x its error plus a floor of 1e-3 (the design's bar for GPU paths), and cosine >= 0.9999
    or 1 - cos within 4x the plain implementation's (twice its error, as for the relative error:
    1 - cos grows as rel^2 / 2; src/verify/metrics.cpp holds the same rule)."""
    got, want = _np(got), _np(want)
    plain = None if plain is None else _np(plain)
    for b, r in enumerate(rows):
        if len(r) == 0:
            continue
        g, w = np.take(got, r, axis=axis), np.take(want, r, axis=axis)
        finite = np.isfinite(w)
        assert np.array_equal(finite, np.isfinite(g)), f"{what}: segment {b}: non-finite mismatch"
        g, w = np.where(finite, g, 0), np.where(finite, w, 0)
        err = relative_error(g, w)
        bound = tol
        if plain is not None:
            p = np.where(finite, np.take(plain, r, axis=axis), 0)
            bound = max(tol, 2 * relative_error(p, w) + 1e-3)
        assert err <= bound, f"{what}: segment {b}: relative error {err:.3g} > {bound:.3g}"
        if np.linalg.norm(w) > 0 and plain is not None:
            # An ill-conditioned segment (a short causal segment whose gradient nearly cancels)
            # costs the plain implementation its cosine too: hold ours to twice its error there.
            cos, cos_plain = _cosine(g, w), _cosine(p, w)
            floor = min(0.9999, 1 - 4 * (1 - cos_plain))
            assert cos >= floor, (f"{what}: segment {b}: cosine {cos:.6f} < {floor:.6f} "
                                  f"(plain implementation: {cos_plain:.6f})")


def _tensors(case, packing, dtype, device, seed=0):
    q, k, v, d_o = (torch.from_numpy(x).to(device=device, dtype=dtype)
                    for x in random_inputs(case, packing, seed))
    seg = dict(
        cu_seqlens_q=torch.from_numpy(packing.cu_q).to(device),
        cu_seqlens_kv=torch.from_numpy(packing.cu_kv).to(device),
    )
    if packing.off_q is not None:
        seg["seq_offsets_q"] = torch.from_numpy(packing.off_q).to(device)
        seg["seq_offsets_kv"] = torch.from_numpy(packing.off_kv).to(device)
    return q, k, v, d_o, seg


def _attention(case, q, k, v, seg, **extra):
    return rt.attention(
        q, k, v, seg["cu_seqlens_q"], seg["cu_seqlens_kv"], max(case.lens_q), max(case.kv_lens),
        seq_offsets_q=seg.get("seq_offsets_q"), seq_offsets_kv=seg.get("seq_offsets_kv"),
        **case.options(), **extra,
    )


# Fixed bounds for the CPU backend: float32 is the same math; bfloat16 rounds the outputs.
CPU_TOL = {torch.float32: (2e-6, 4e-6), torch.bfloat16: (6e-3, 1.2e-2)}
# GPU paths: a floor under the 2x-plain bar (bf16 / fp16).
GPU_TOL = {torch.bfloat16: (1e-2, 2e-2), torch.float16: (4e-3, 1e-2)}


def _run_case(case, dtype, device, **extra):
    packing = make_packing(case)
    q, k, v, d_o, seg = _tensors(case, packing, dtype, device)
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    o, lse = _attention(case, q, k, v, seg, return_lse=True, **extra)
    assert o.dtype == dtype and o.shape == (packing.total_q, case.hq, case.head_dim_v)
    assert lse.dtype == torch.float32 and lse.shape == (case.hq, packing.total_q)
    assert o.device == q.device and lse.device == q.device
    dq, dk, dv = torch.autograd.grad((o * d_o).sum(), (q, k, v))
    ref = reference(case, packing, q, k, v, d_o)
    plain = reference(case, packing, q, k, v, d_o, plain=True) if device == "cuda" else None
    tol, gtol = (GPU_TOL if device == "cuda" else CPU_TOL)[dtype]
    if extra.get("dq_accum") == "bf16":
        gtol = max(gtol, 3e-2)
    names = ("o", "lse", "dq", "dk", "dv")
    for i, (name, got) in enumerate(zip(names, (o, lse, dq, dk, dv))):
        rows = packing.rows_kv if name in ("dk", "dv") else packing.rows_q
        bound = {"o": tol, "lse": 1e-5 if device == "cpu" else 1e-3}.get(name, gtol)
        check_segments(f"{case.name} {name}", got, ref[i], rows, bound,
                       plain=None if plain is None or name == "lse" else plain[i],
                       axis=1 if name == "lse" else 0)
    assert_zero_rows(f"{case.name} o", _np(o), packing.padding_q)
    assert_zero_rows(f"{case.name} dq", _np(dq), packing.padding_q)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_cpu_float32(case):
    _run_case(case, torch.float32, "cpu")


@pytest.mark.parametrize("name", ["mha", "causal_gqa", "padded", "cross_bottom_right"])
def test_cpu_bfloat16(name):
    _run_case(CASES_BY_NAME[name], torch.bfloat16, "cpu")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_cuda(case, dtype):
    _run_case(case, dtype, "cuda")


@needs_cuda
@pytest.mark.parametrize("name", ["causal_gqa", "padded_causal_gqa", "mqa_192_128"])
def test_cuda_dq_accum_bf16(name):
    _run_case(CASES_BY_NAME[name], torch.bfloat16, "cuda", dq_accum="bf16")


@needs_cuda
def test_cuda_deterministic_is_bitwise_repeatable():
    case = CASES_BY_NAME["causal_gqa"]
    packing = make_packing(case)
    q, k, v, d_o, seg = _tensors(case, packing, torch.bfloat16, "cuda")
    grads = []
    for _ in range(3):
        qkv = [x.clone().requires_grad_() for x in (q, k, v)]
        o = _attention(case, *qkv, seg, deterministic=True)
        grads.append(torch.autograd.grad((o * d_o).sum(), qkv))
    for later in grads[1:]:
        for a, b in zip(grads[0], later):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_large_batch_many_segments(device):
    """Many short segments and one long one: every segment is checked on its own."""
    rng = np.random.default_rng(7)
    lens = tuple(int(x) for x in rng.integers(0, 9, size=60)) + (300,)
    case = Case("many_segments", lens, hq=4, hkv=1, causal=True)
    _run_case(case, torch.float32 if device == "cpu" else torch.bfloat16, device)


# --- layout and the op's plumbing ------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_packed_qkv_view(device):
    """q, k, v as views of one [T, 3, H, D] tensor: strides pass through, gradients reach it."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    t, h, d = 40, 2, 64
    cu = torch.tensor([0, 13, 40], dtype=torch.int32, device=device)
    qkv = torch.randn(t, 3, h, d, dtype=dtype, device=device, requires_grad=True)
    q, k, v = qkv.unbind(1)
    assert q.stride() == (3 * h * d, d, 1)
    o = rt.attention(q, k, v, cu, cu, 27, 27, causal=True)
    (o.float() ** 2).sum().backward()
    dense = [x.detach().contiguous().requires_grad_() for x in (q, k, v)]
    o_dense = rt.attention(*dense, cu, cu, 27, 27, causal=True)
    (o_dense.float() ** 2).sum().backward()
    torch.testing.assert_close(o, o_dense, rtol=0, atol=0)
    for i, x in enumerate(dense):
        torch.testing.assert_close(qkv.grad[:, i], x.grad, rtol=0, atol=0)


_FIRST_BACKWARD = """
import torch
import raggedattn.torch as rt
cu = torch.tensor([0, 70, 300], dtype=torch.int32, device="cuda")
q, k, v = (torch.randn(300, h, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
           for h in (4, 2, 2))
o = rt.attention(q, k, v, cu, cu, 230, 230, causal=True)
o.backward(torch.randn_like(o))  # autograd's fresh device thread: our backward is its first call
torch.cuda.synchronize()
assert all(bool(torch.isfinite(x.grad).all()) for x in (q, k, v))
print("OK")
"""


@needs_cuda
def test_first_backward_of_a_process_on_autograds_own_thread():
    """The first backward of a process whose graph starts at the attention's output: autograd runs
    it on a device thread that has made no CUDA call yet (no current context), which the library
    must bind itself (the Hopper path's first call is a driver call)."""
    done = subprocess.run([sys.executable, "-c", _FIRST_BACKWARD], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [64, 128])
def test_head_major_views(device, d):
    """q, k, v, dO as [T, H, D] views of head-major [H, T, D] storage (head stride above the token
    stride): the same results, bit for bit, as contiguous copies (deterministic mode), through
    whole tiles inside a segment and partial ones at its end."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    t, hq, hkv = 300, 4, 2
    cu = torch.tensor([0, 70, 300], dtype=torch.int32, device=device)

    def head_major(h):
        return torch.randn(h, t, d, dtype=dtype, device=device).transpose(0, 1).requires_grad_()

    q, k, v = head_major(hq), head_major(hkv), head_major(hkv)
    assert q.stride() == (d, t * d, 1)
    d_o = torch.randn(hq, t, d, dtype=dtype, device=device).transpose(0, 1)
    o = rt.attention(q, k, v, cu, cu, 230, 230, causal=True, deterministic=True)
    o.backward(d_o)
    dense = [x.detach().contiguous().requires_grad_() for x in (q, k, v)]
    o_dense = rt.attention(*dense, cu, cu, 230, 230, causal=True, deterministic=True)
    o_dense.backward(d_o.contiguous())
    torch.testing.assert_close(o, o_dense, rtol=0, atol=0)
    for x, y in zip((q, k, v), dense):
        torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_broadcast_grad_output(device):
    """o.sum().backward() hands the backward a zero-stride dO; it must be read as such."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    q, k, v = (torch.randn(12, 2, 64, dtype=dtype, device=device, requires_grad=True)
               for _ in range(3))
    rt.attention(q, k, v, cu, cu, 7, 7).sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    o = rt.attention(q, k, v, cu, cu, 7, 7)
    o.backward(torch.ones_like(o))
    for a, x in zip(grads, (q, k, v)):
        torch.testing.assert_close(a, x.grad, rtol=0, atol=0)


@needs_cuda
def test_cuda_runs_on_current_stream():
    cu = torch.tensor([0, 50, 128], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(128, 4, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    expected = rt.attention(q, k, v, cu, cu, 78, 78, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = rt.attention(q, k, v, cu, cu, 78, 78, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    """Schema, fake tensor, autograd registration and AOT dispatch of both ops."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    case = CASES_BY_NAME["padded"]
    packing = make_packing(case)
    q, k, v, d_o, seg = _tensors(case, packing, dtype, device)
    q.requires_grad_()
    options = (max(case.lens_q), max(case.kv_lens), False, False, -1, -1, 0.0, 0.0, False, False)
    fwd_args = (q, k, v, seg["cu_seqlens_q"], seg["cu_seqlens_kv"], seg["seq_offsets_q"],
                seg["seq_offsets_kv"]) + options
    torch.library.opcheck(torch.ops.raggedattn.fwd.default, fwd_args)
    o, lse = torch.ops.raggedattn.fwd(*fwd_args)
    bwd_args = (d_o, q.detach(), k, v, o.detach(), lse.detach(), seg["cu_seqlens_q"],
                seg["cu_seqlens_kv"], seg["seq_offsets_q"], seg["seq_offsets_kv"]) + options
    torch.library.opcheck(torch.ops.raggedattn.bwd.default, bwd_args)


class _Block(torch.nn.Module):
    def __init__(self, d_model=128, heads=2, head_dim=64):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkv = torch.nn.Linear(d_model, 3 * heads * head_dim)
        self.out = torch.nn.Linear(heads * head_dim, d_model)

    def forward(self, x, cu, max_len: int):
        t = x.shape[0]
        q, k, v = self.qkv(x).view(t, 3, self.heads, self.head_dim).unbind(1)
        o = rt.attention(q, k, v, cu, cu, max_len, max_len, causal=True)
        return self.out(o.reshape(t, self.heads * self.head_dim))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    """torch.compile traces the op (fake implementation, autograd) without graph breaks."""
    torch.manual_seed(0)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    block = _Block().to(device=device, dtype=dtype)
    x = torch.randn(50, 128, device=device, dtype=dtype)
    cu = torch.tensor([0, 20, 31, 50], dtype=torch.int32, device=device)
    # Inductor on the GPU; on the CPU the AOT-autograd graph run eagerly (no C++ compile needed).
    compiled = torch.compile(block, fullgraph=True, backend="inductor" if device == "cuda"
                             else "aot_eager")
    y = compiled(x, cu, 20)
    y.float().square().sum().backward()
    grads = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    y_eager = block(x, cu, 20)
    y_eager.float().square().sum().backward()
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(y, y_eager, **tol)
    for g, p in zip(grads, block.parameters()):
        torch.testing.assert_close(g, p.grad, **tol)


def test_plan_cache_shared_by_forward_and_backward():
    cu = torch.tensor([0, 7, 19], dtype=torch.int32)
    q, k, v = (torch.randn(19, 2, 64, requires_grad=True) for _ in range(3))
    raggedattn.clear_plan_cache()
    rt.attention(q, k, v, cu, cu, 12, 12).sum().backward()
    assert raggedattn.plan_cache_size() == 1
    rt.attention(q, k, v, cu, cu, 12, 12).sum().backward()
    assert raggedattn.plan_cache_size() == 1


# --- errors -----------------------------------------------------------------------------------


def _small(device="cpu", dtype=torch.float32, d=64, hq=2, hkv=2):
    q = torch.randn(10, hq, d, dtype=dtype, device=device)
    k = torch.randn(10, hkv, d, dtype=dtype, device=device)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=device)
    return q, k, k.clone(), cu


@pytest.mark.parametrize("device", DEVICES)
def test_error_unsupported_head_dim(device):
    q, k, v, cu = _small(device, torch.float32 if device == "cpu" else torch.bfloat16, d=48)
    with pytest.raises(ValueError, match=r"head_dim_qk=48, head_dim_v=48; supported"):
        rt.attention(q, k, v, cu, cu, 6, 6)


def test_error_heads_not_a_multiple():
    q, k, v, cu = _small(hq=3, hkv=2)
    with pytest.raises(ValueError, match=r"num_heads_q=3, num_heads_kv=2"):
        rt.attention(q, k, v, cu, cu, 6, 6)


def test_error_inconsistent_cu_seqlens_cpu():
    q, k, v, _ = _small()
    bad = torch.tensor([0, 6, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q decreases at segment 1 \(6 -> 4\)"):
        rt.attention(q, k, v, bad, bad, 10, 10)


def test_error_python_checks():
    q, k, v, cu = _small()
    with pytest.raises(ValueError, match=r"q has dtype torch.float64"):
        rt.attention(q.double(), k.double(), v.double(), cu, cu, 6, 6)
    with pytest.raises(ValueError, match=r"q has shape \(10, 128\); expected 3 dims"):
        rt.attention(q.reshape(10, 128), k, v, cu, cu, 6, 6)
    with pytest.raises(ValueError, match=r"cu_seqlens_q is torch.int64"):
        rt.attention(q, k, v, cu.long(), cu, 6, 6)
    with pytest.raises(ValueError, match=r"k has dtype torch.bfloat16 but q has torch.float32"):
        rt.attention(q, k.bfloat16(), v, cu, cu, 6, 6)
    with pytest.raises(ValueError, match=r"causal_alignment='bottom'"):
        rt.attention(q, k, v, cu, cu, 6, 6, causal=True, causal_alignment="bottom")
    with pytest.raises(ValueError, match=r"give both seq_offsets_q and seq_offsets_kv"):
        rt.attention(q, k, v, cu, cu, 6, 6, seq_offsets_q=cu)


@needs_cuda
def test_error_cuda_specific():
    q, k, v, cu = _small("cuda", torch.float32)
    with pytest.raises(ValueError, match=r"dtype fp32 on a CUDA path"):
        rt.attention(q, k, v, cu, cu, 6, 6)
    q, k, v, cu = _small("cuda", torch.bfloat16)
    with pytest.raises(ValueError, match=r"cu_seqlens_q is on cpu but q is on cuda"):
        rt.attention(q, k, v, cu.cpu(), cu, 6, 6)

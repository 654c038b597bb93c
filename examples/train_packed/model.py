"""A small llama-style decoder: RMSNorm, RoPE, GQA attention, SwiGLU MLP.

Attention is pluggable: `raggedattn` (the library's packed kernel, block-diagonal causal through
cu_seqlens) or `reference` (PyTorch SDPA run per document, K/V heads repeated for GQA). Both see
the same q, k, v in the same dtype, so two runs from one initialization differ only in the kernel.
With `sinks=True` every attention layer has learnable per-head sinks (a logit per query head that
joins each row's softmax as a column with no value, as in gpt-oss): raggedattn's `sink` argument,
or for the reference a plain PyTorch softmax over the scores and the sink per document.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope(x, positions, base=10000.0):
    """Rotary embedding of x [T, H, D] at per-token positions [T] (restarting in every document)."""
    d = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.float()[:, None] * inv[None, :]  # [T, D/2]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


def reference_attention(q, k, v, cu_seqlens, causal=True):
    """SDPA per document; q [T, Hq, D], k/v [T, Hkv, D]."""
    group = q.shape[1] // k.shape[1]
    outs = []
    cu = cu_seqlens.tolist()
    for a, b in zip(cu[:-1], cu[1:]):
        qs = q[a:b].transpose(0, 1)[None]
        ks = k[a:b].repeat_interleave(group, dim=1).transpose(0, 1)[None]
        vs = v[a:b].repeat_interleave(group, dim=1).transpose(0, 1)[None]
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)[0].transpose(0, 1))
    return torch.cat(outs, dim=0)


def reference_sink_attention(q, k, v, cu_seqlens, sinks, causal=True):
    """Attention with sinks, written out per document: softmax over [scores, sink[h]] in float32,
    the sink's column dropped before the product with V. q [T, Hq, D], k/v [T, Hkv, D],
    sinks [Hq]."""
    group = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5
    outs = []
    cu = cu_seqlens.tolist()
    for a, b in zip(cu[:-1], cu[1:]):
        n = b - a
        qs = q[a:b].transpose(0, 1).float()  # [Hq, n, D]
        ks = k[a:b].repeat_interleave(group, dim=1).transpose(0, 1).float()
        vs = v[a:b].repeat_interleave(group, dim=1).transpose(0, 1)
        s = (qs @ ks.transpose(1, 2)) * scale
        if causal:
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            s = s.masked_fill(~mask, float("-inf"))
        sink = sinks.float()[:, None, None].expand(-1, n, 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
        outs.append((p.to(vs.dtype) @ vs).transpose(0, 1))
    return torch.cat(outs, dim=0)


class _CorruptDq(torch.autograd.Function):
    """Identity on q whose backward hands every document past the first the first document's dQ
    rows (cyclically) instead of its own: what a dQ scratch read with segment stride 0 returns.
    For the corruption experiment only (run `raggedattn_dq_corrupt`)."""

    @staticmethod
    def forward(ctx, q, cu_seqlens):
        ctx.save_for_backward(cu_seqlens)
        return q.view_as(q)

    @staticmethod
    def backward(ctx, dq):
        (cu,) = ctx.saved_tensors
        cu = cu.tolist()
        bad = dq.clone()
        first = max(1, cu[1] - cu[0])
        for a, b in zip(cu[1:-1], cu[2:]):
            rows = torch.arange(b - a, device=dq.device) % first + cu[0]
            bad[a:b] = dq[rows]
        return bad, None


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, impl="raggedattn", dq_accum="fp32",
                 attn_dtype=None, corrupt_dq=False, deterministic=False, sinks=False):
        super().__init__()
        self.h, self.hkv, self.d = n_heads, n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.d, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.d, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.d, bias=False)
        self.wo = nn.Linear(n_heads * self.d, dim, bias=False)
        self.impl, self.dq_accum, self.attn_dtype = impl, dq_accum, attn_dtype
        self.corrupt_dq, self.deterministic = corrupt_dq, deterministic
        # Learnable sinks, one logit per query head (float32, starting at 0: the sink then takes
        # the share of one key with score 0).
        self.sinks = nn.Parameter(torch.zeros(n_heads)) if sinks else None

    def forward(self, x, positions, cu_seqlens, max_seqlen):
        t = x.shape[0]
        q = rope(self.wq(x).view(t, self.h, self.d), positions)
        k = rope(self.wk(x).view(t, self.hkv, self.d), positions)
        v = self.wv(x).view(t, self.hkv, self.d)
        dt = self.attn_dtype or q.dtype
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
        if self.impl == "raggedattn":
            import raggedattn.torch as rt

            if self.corrupt_dq:
                q = _CorruptDq.apply(q, cu_seqlens)
            o = rt.attention(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True,
                             dq_accum=self.dq_accum, deterministic=self.deterministic,
                             sink=self.sinks)
        elif self.sinks is not None:
            o = reference_sink_attention(q, k, v, cu_seqlens, self.sinks)
        else:
            o = reference_attention(q, k, v, cu_seqlens)
        return self.wo(o.reshape(t, self.h * self.d).to(x.dtype))


class Block(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, hidden, **attn):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.attn = Attention(dim, n_heads, n_kv_heads, **attn)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x, positions, cu, max_seqlen):
        x = x + self.attn(self.attn_norm(x), positions, cu, max_seqlen)
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Decoder(nn.Module):
    def __init__(self, vocab, dim=256, layers=4, n_heads=4, n_kv_heads=2, **attn):
        """attn: the options of every layer's Attention (impl, dq_accum, attn_dtype, ...)."""
        super().__init__()
        hidden = int(8 * dim / 3 / 64 + 0.999) * 64
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(
            Block(dim, n_heads, n_kv_heads, hidden, **attn) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        for b in self.blocks:  # scaled residual projections (GPT-2 style)
            nn.init.normal_(b.attn.wo.weight, std=0.02 / math.sqrt(2 * layers))
            nn.init.normal_(b.w2.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, toks, positions, cu, max_seqlen):
        x = self.embed(toks)
        for b in self.blocks:
            x = b(x, positions, cu, max_seqlen)
        return self.head(self.norm(x))

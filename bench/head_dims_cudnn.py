#!/usr/bin/env python3
"""cuDNN's dense SDPA through PyTorch on one causal document at several head dims, for the table
of other head dims in docs/PERFORMANCE.md: 32 query heads, K and V expanded from 8 KV heads to 32
(as bench's anchor script calls cuDNN), bf16, timed in the anchors' regime (triton's do_bench:
warm-up 50 ms, timed 200 ms, 256 MiB zeroed before each call, the median). The backward is timed
on torch.autograd.grad, so no gradient accumulation kernels are in its time. TFLOP/s count the
visible (query, key) pairs only (bench/workloads.py's fwd_flops and bwd_flops, as raggedattn's
bench counts them). A head dim cuDNN rejects is printed as such.

    python3 bench/head_dims_cudnn.py [--tokens N] [--dims 64,128,192/128,256]
                                                                       (default: one_doc_16k's)
A dim is D (Q, K and V of D columns) or DQK/DV (V and the output of DV columns).
"""
import argparse
import json
import os
import sys

import torch
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import HQ, WORKLOADS, bwd_flops, fwd_flops  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=WORKLOADS["one_doc_16k"][0][0])
    ap.add_argument("--dims", default="64,128,192/128,256")
    ap.add_argument("--heads", type=int, default=HQ)
    args = ap.parse_args()
    s, h = args.tokens, args.heads
    for spec in args.dims.split(","):
        dqk, _, dv = spec.partition("/")
        dqk = int(dqk)
        dv = int(dv) if dv else dqk
        gen = torch.Generator(device="cuda").manual_seed(dqk * 1000 + dv)
        q, k, v = (torch.randn(1, h, s, n, device="cuda", dtype=torch.bfloat16, generator=gen)
                   .requires_grad_() for n in (dqk, dqk, dv))
        grad_out = torch.randn(1, h, s, dv, device="cuda", dtype=torch.bfloat16, generator=gen)
        row = {"impl": "cudnn_dense_sdpa", "tokens": s, "heads": h, "dim": dqk, "dim_v": dv}
        d = (dqk + dv) / 2  # 2 (Dqk + Dv) Hq FLOPs per visible pair forward = 4 d Hq
        out = None  # the forward's output and graph, freed with the inputs below
        try:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                def fwd():
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

                out = fwd()

                def bwd():
                    torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)

                fwd_ms = triton.testing.do_bench(fwd, warmup=50, rep=200, return_mode="median")
                bwd_ms = triton.testing.do_bench(bwd, warmup=50, rep=200, return_mode="median")
            row.update(fwd_ms=fwd_ms, bwd_ms=bwd_ms,
                       fwd_tflops=fwd_flops([s], True, h, d) / fwd_ms * 1e-9,
                       bwd_tflops=bwd_flops([s], True, h, d) / bwd_ms * 1e-9)
        except RuntimeError as e:  # cuDNN rejects the shape: say so, go on
            row["error"] = str(e).splitlines()[0][:200]
        print(json.dumps(row), flush=True)
        del q, k, v, grad_out, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

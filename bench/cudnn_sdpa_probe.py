#!/usr/bin/env python3
"""cuDNN's dense SDPA through PyTorch on one causal document (default: one_doc_16k's shape, 16384
tokens, 32 heads, D = 128), bf16, K and V expanded to 32 heads as bench's anchor script does: two
forward and backward passes, for Nsight Compute to profile (`scripts/gpu_session.sh BUILD OUT
percycle`; docs/PERFORMANCE.md item 78). Needs PyTorch with CUDA and cuDNN attention;
prints nothing.

    python3 bench/cudnn_sdpa_probe.py [--tokens N] [--dim DQK] [--dim-v DV]
"""
import argparse
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import D, HQ as H, WORKLOADS  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--tokens", type=int, default=WORKLOADS["one_doc_16k"][0][0])
ap.add_argument("--dim", type=int, default=D)
ap.add_argument("--dim-v", type=int, default=None, help="V's and the output's columns (default: --dim)")
args = ap.parse_args()
S, DQK = args.tokens, args.dim
DV = args.dim_v or DQK
torch.manual_seed(0)
q, k, v = (torch.randn(1, H, S, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for n in (DQK, DQK, DV))
grad_out = torch.randn(1, H, S, DV, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(2):  # the first pass warms up; ncu takes both
        for t in (q, k, v):
            t.grad = None  # no gradient accumulation kernels between the passes
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad_out)
torch.cuda.synchronize()

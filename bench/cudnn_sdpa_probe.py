#!/usr/bin/env python3
"""cuDNN's dense SDPA through PyTorch on one_doc_16k's shape (one causal document of 16384 tokens,
32 heads, D = 128, bf16, K and V expanded to 32 heads as bench's anchor script does): two forward
and backward passes, for Nsight Compute to profile (`scripts/gpu_session.sh BUILD OUT percycle`;
docs/PERFORMANCE.md item 78). Needs PyTorch with CUDA and cuDNN attention; prints nothing."""
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import D, HQ as H, WORKLOADS  # noqa: E402

(S,), _ = WORKLOADS["one_doc_16k"]
torch.manual_seed(0)
q, k, v = (torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
grad_out = torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(2):  # the first pass warms up; ncu takes both
        for t in (q, k, v):
            t.grad = None  # no gradient accumulation kernels between the passes
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad_out)
torch.cuda.synchronize()

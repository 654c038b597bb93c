#!/usr/bin/env python3
"""FlashAttention-3's varlen forward and backward (head dim 128) through the flash-attn3-jax wheel
on one standard workload (default one_doc_16k), bf16, K and V not expanded: two forward and two
backward calls, for Nsight Compute to profile beside our kernels (`scripts/gpu_session.sh BUILD
OUT percycle`, docs/PERFORMANCE.md section 4). Needs JAX with a GPU and the wheel
(`pip install flash-attn3-jax==0.2.3`, or the wheel carried and installed with --target); prints
nothing.

    python3 bench/fa3_varlen_probe.py [--workload NAME]
"""
import argparse
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flash_attn3_jax.varlen_bwd import flash_mha_varlen_bwd  # noqa: E402
from flash_attn3_jax.varlen_fwd import flash_mha_varlen_fwd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import D, HKV, HQ, WORKLOADS  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--workload", default="one_doc_16k", choices=sorted(WORKLOADS))
args = ap.parse_args()
lens, causal = WORKLOADS[args.workload]
total = sum(lens)
keys = jax.random.split(jax.random.PRNGKey(0), 4)
q, grad_out = (jax.random.normal(k, (total, HQ, D), jnp.bfloat16) for k in (keys[0], keys[3]))
k, v = (jax.random.normal(key, (total, HKV, D), jnp.bfloat16) for key in keys[1:3])
cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
cfg = dict(max_seqlen_q=max(lens), max_seqlen_k=max(lens), softmax_scale=1.0 / np.sqrt(D),
           is_causal=causal)
fwd = jax.jit(lambda q, k, v: flash_mha_varlen_fwd(q, k, v, cu, cu, **cfg))
bwd = jax.jit(lambda g, q, k, v, o, lse: flash_mha_varlen_bwd(g, q, k, v, o, lse, cu, cu, **cfg))
for _ in range(2):  # the first pass warms up; ncu picks the launch it is told to
    out, lse = jax.block_until_ready(fwd(q, k, v))
    jax.block_until_ready(bwd(grad_out, q, k, v, out, lse))

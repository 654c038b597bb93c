#!/usr/bin/env python3
"""Context-parallel scaling of raggedattn.cp (the all-gather strategy, or the ring with
--strategy ring), launched by torchrun: tokens/s per GPU and the efficiency against one GPU,
forward + backward.

    torchrun --nproc-per-node 8 bench/cp_scaling.py --tokens 262144 --out $OUT/cp.json
    torchrun --nproc-per-node 8 bench/cp_scaling.py --tokens 262144 --strategy ring
    torchrun --nproc-per-node 2 bench/cp_scaling.py --backend gloo --device cpu --tokens 2048 \\
        --heads 4/2 --dim 64 --dtype fp32 --iters 1          # wiring check without GPUs

The pack is docs_mixed_32k's document mix scaled to --tokens (each length times tokens / 32768,
so longer documents, not more of them), causal unless --full. Rank 0 also times the same pack on
one device (the whole batch, no collectives) for the efficiency: (one-device time / cp) / the
group's time. Every rank runs the same iterations; times are the median of --iters after
--warmup, with a barrier and a device synchronize around each. NVLink multicast stays off
(NCCL_NVLS_ENABLE=0 is set here unless the environment sets it).
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import MIXED, bwd_flops, fwd_flops  # noqa: E402

import raggedattn.cp as rcp  # noqa: E402
import raggedattn.torch as rt  # noqa: E402
from raggedattn.cp_shard import zigzag_shard  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
STRATEGIES = {"all_gather": rcp.attention, "ring": rcp.ring_attention}


def scaled_mix(tokens):
    """docs_mixed_32k's lengths scaled to `tokens` in all (the last absorbs the rounding)."""
    lens = [max(1, n * tokens // sum(MIXED)) for n in MIXED]
    lens[-1] += tokens - sum(lens)
    return lens


def timed(step, device, iters, warmup, group=None):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        if group is not None:
            dist.barrier(group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=DTYPES)
    ap.add_argument("--full", action="store_true", help="no mask (default: causal)")
    ap.add_argument("--strategy", default="all_gather", choices=STRATEGIES,
                    help="raggedattn.cp.attention (all_gather) or raggedattn.cp.ring_attention")
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", help="JSON of the result (rank 0)")
    args = ap.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", 0))) \
        if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    hq, hkv = (int(x) for x in args.heads.split("/"))
    dtype, causal = DTYPES[args.dtype], not args.full
    lens = scaled_mix(args.tokens)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    plan = zigzag_shard(cu, world)
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(args.tokens, h, args.dim, generator=g).to(device, dtype)
                     for h in (hq, hkv, hkv, hq))
    idx = torch.from_numpy(plan.rank_index(rank)).to(device)
    mine = [t.index_select(0, idx).requires_grad_(True) for t in (q, k, v)]
    mine_grad = grad.index_select(0, idx)

    attention = STRATEGIES[args.strategy]

    def cp_step():
        out = attention(*mine, plan, rank, causal=causal)
        torch.autograd.grad(out, mine, mine_grad)

    t_group = timed(cp_step, device, args.iters, args.warmup, group=dist.group.WORLD)
    t_group = torch.tensor([t_group], dtype=torch.float64, device=device)
    dist.all_reduce(t_group, op=dist.ReduceOp.MAX)  # the group is as fast as its slowest rank
    t_group = float(t_group.item())

    result = None
    if rank == 0:
        whole = [t.requires_grad_(True) for t in (q.clone(), k.clone(), v.clone())]
        cu_t = torch.from_numpy(cu).to(device)

        def one_step():
            out = rt.attention(*whole, cu_t, cu_t, max(lens), max(lens), causal=causal)
            torch.autograd.grad(out, whole, grad)

        t_one = timed(one_step, device, args.iters, args.warmup)
        flops = fwd_flops(lens, causal, hq, args.dim) + bwd_flops(lens, causal, hq, args.dim)
        result = {
            "gpus": world, "tokens": args.tokens, "documents": lens, "causal": causal,
            "strategy": args.strategy, "heads": [hq, hkv], "dim": args.dim, "dtype": args.dtype,
            "backend": args.backend,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "seconds_group": t_group, "seconds_one_device": t_one,
            "tokens_per_s_per_gpu": args.tokens / t_group / world,
            "tokens_per_s_one_device": args.tokens / t_one,
            "efficiency": (t_one / world) / t_group,
            "tflops_per_gpu": flops / t_group / world / 1e12,
        }
        print(json.dumps(result, indent=1))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

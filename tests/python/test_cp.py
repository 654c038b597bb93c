"""Context parallelism: the zigzag sharding (plain NumPy, everywhere); the all-gather and ring
attention over torch.distributed groups of 1, 2 and 4 CPU processes (gloo) against the whole batch
in one process, output and gradients row by row, for every mask each strategy takes (where torch
is installed), and the ring's refusal of windows; on a GPU with NCCL, both strategies over an NCCL
group of one in bf16 against the whole batch, and captured in a CUDA graph against eager runs."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from raggedattn.cp_shard import refuse_ring_window, zigzag_shard

LENGTHS = [[37, 1, 0, 20, 64], [5], [3, 2, 1], [130, 7, 50]]


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda l: "-".join(map(str, l)))
def test_every_token_on_one_rank_with_the_zigzag_pairs(lengths, cp):
    cu = np.concatenate([[0], np.cumsum(lengths)])
    plan = zigzag_shard(cu, cp)
    total = int(cu[-1])
    owned = np.concatenate([plan.rank_index(r) for r in range(cp)])
    assert sorted(owned.tolist()) == list(range(total))  # each token once
    perm, inverse = plan.permutation(), plan.inverse_permutation()
    assert np.array_equal(perm[inverse], np.arange(total))
    for b, n in enumerate(lengths):
        sizes = np.diff(plan.chunk_bounds[b])
        assert sizes.sum() == n and sizes.max() - sizes.min() <= 1  # near-equal, empty if short
    for r in range(cp):
        pieces = plan.rank_pieces(r)
        assert len(pieces) == 2 * len(lengths)
        for i, (b, lo, hi) in enumerate(pieces):  # chunks r, then 2cp - 1 - r, of each document
            c = [r, 2 * cp - 1 - r][i % 2]
            assert lo == cu[b] + plan.chunk_bounds[b, c] and hi == cu[b] + plan.chunk_bounds[b, c + 1]
        assert np.array_equal(np.diff(plan.rank_cu_seqlens(r)), pieces[:, 2] - pieces[:, 1])
        doc_of_row = np.searchsorted(cu, plan.rank_index(r), side="right") - 1
        assert np.array_equal(plan.positions(r), plan.rank_index(r) - cu[doc_of_row])


def test_causal_work_is_balanced():
    cu = np.array([0, 4096, 4096 + 1000, 4096 + 1000 + 3000])
    plan = zigzag_shard(cu, 4)
    work = []
    for r in range(4):
        pieces = plan.rank_pieces(r)
        doc_start = cu[pieces[:, 0]]
        # causal pairs of a piece: each query row sees its document's prefix up to itself
        work.append(sum(sum(range(lo - s + 1, hi - s + 1)) for (_, lo, hi), s in zip(pieces, doc_start)))
    assert max(work) / min(work) < 1.01


def test_bad_arguments():
    with pytest.raises(ValueError, match="cp=0"):
        zigzag_shard([0, 4], 0)
    with pytest.raises(ValueError, match="not decrease"):
        zigzag_shard([0, 5, 3], 2)


# --- the attention over a process group ----------------------------------------------------------

# The masks by name: (causal, window).
MASKS = {"causal": (True, (-1, -1)), "causal_window": (True, (24, 0)), "none": (False, (-1, -1))}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _import_before_the_group():
    """raggedattn.cp (and torch.distributed.rpc with it) imported before the process group
    exists. With torch 2.11 a gloo process that destroys its group aborts at exit in most runs
    ("terminate called without an active exception"), raggedattn or not, unless
    torch.distributed.rpc was imported before init_process_group."""
    import raggedattn.cp  # noqa: F401


def _worker(rank, world, port, lengths, masks, seed, deterministic=False, strategy="all_gather",
            with_sink=False):
    """Each mask of `masks` (MASKS' names) on this rank's shard across a gloo group of `world`,
    against the whole batch in this process: output and gradients row by row. The masks share one
    group, since every spawn costs seconds."""
    import torch
    import torch.distributed as dist

    _import_before_the_group()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        g = torch.Generator().manual_seed(seed)
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
        total, hq, hkv, d = int(cu[-1]), 4, 2, 64
        q, k, v = (torch.randn(total, h, d, generator=g) for h in (hq, hkv, hkv))
        grad = torch.randn(total, hq, d, generator=g)
        sink = torch.rand(hq, generator=g) * 4 - 1 if with_sink else None
        plan = zigzag_shard(cu.numpy(), world)
        idx = torch.from_numpy(plan.rank_index(rank))
        for mask in masks:
            what = f"{strategy} {mask}"
            run = _WholeAndShard(strategy, plan, rank, idx, (q, k, v), sink, grad, cu,
                                 max(lengths), mask, deterministic=deterministic)
            out, grads, ref, ref_grads = run.out, run.grads, run.ref, run.ref_grads
            if deterministic:  # a second run: bitwise the same gradients
                for a, b in zip(grads, run.shard()[1]):
                    assert torch.equal(a, b), what
            _assert_close(f"{what} out", out, ref[idx], 2e-5)
            for name, got, want in zip("qkv", grads, ref_grads):
                _assert_close(f"{what} d{name}", got, want[idx], 5e-5)
            if with_sink:  # each rank's share of the sinks' gradient; the group's sum is the whole
                d_sink = grads[3].clone()
                dist.all_reduce(d_sink, group=None)
                _assert_close(f"{what} d_sink", d_sink, ref_grads[3], 5e-5)
    finally:
        dist.destroy_process_group()


class _WholeAndShard:
    """One mask of `strategy` on this rank's shard across the group, and the whole batch in this
    process as the reference (raggedattn.torch.attention): out, grads (q, k, v and the sink's
    share), ref, ref_grads; `shard()` runs the shard again. q, k, v, sink: the whole batch's
    (sink None: none); idx: this rank's rows; longest: the longest document."""

    def __init__(self, strategy, plan, rank, idx, qkv, sink, d_out, cu, longest, mask,
                 **options):
        import torch

        import raggedattn.cp as rcp
        import raggedattn.torch as rt

        causal, window = MASKS[mask]
        extra = [] if sink is None else [sink]
        full = [t.clone().requires_grad_(True) for t in list(qkv) + extra]
        self.ref = rt.attention(*full[:3], cu, cu, longest, longest, causal=causal, window=window,
                                sink=full[3] if extra else None)
        self.ref_grads = torch.autograd.grad(self.ref, full, d_out)
        self._mine = [t[idx].clone().requires_grad_(True) for t in qkv] + \
            [t.clone().requires_grad_(True) for t in extra]
        self._attention = rcp.ring_attention if strategy == "ring" else rcp.attention
        self._call = dict(causal=causal, window=window, sink=self._mine[3] if extra else None,
                          **options)
        self._plan, self._rank, self._d_out = plan, rank, d_out[idx]
        self.out, self.grads = self.shard()

    def shard(self):
        import torch

        out = self._attention(*self._mine[:3], self._plan, self._rank, **self._call)
        return out, torch.autograd.grad(out, self._mine, self._d_out)


def _assert_close(what, got, want, tol):
    import torch

    torch.testing.assert_close(got, want, atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}")


def _spawn(world, lengths, masks, seed, deterministic=False, strategy="all_gather",
           with_sink=False):
    """_worker on `world` CPU processes (the library's CPU backend, gloo)."""
    pytest.importorskip("torch")
    pytest.importorskip("raggedattn.torch")
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(world, _free_port(), lengths, tuple(masks), seed, deterministic,
                            strategy, with_sink), nprocs=world, join=True)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_all_gather_attention_matches_one_process(world):
    _spawn(world, [70, 1, 0, 33, 128], ["causal", "causal_window", "none"], 11)


def test_deterministic_attention_matches_and_repeats():
    _spawn(2, [70, 1, 0, 33, 128], ["causal"], 12, deterministic=True)


@pytest.mark.parametrize("deterministic", [False, True])
def test_all_gather_attention_with_sinks(deterministic):
    _spawn(2, [70, 1, 0, 33, 128], ["causal"], 14, deterministic, "all_gather", with_sink=True)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ring_attention_matches_one_process(world):
    """Causal and full masks; the lengths hold a zero-length and a length-1 document, and one
    shorter than 2·cp (empty chunks on the ring)."""
    _spawn(world, [70, 1, 0, 33, 128, 5], ["causal", "none"], 13, strategy="ring")


def test_ring_attention_with_sinks():
    _spawn(2, [70, 1, 0, 33, 128, 5], ["causal", "none"], 15, strategy="ring", with_sink=True)


def test_ring_attention_refuses_windows():
    """A window on the ring raises before anything reaches the group (so there is none here),
    saying what was given, what the ring supports and which strategy takes windows."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("raggedattn.torch")
    import raggedattn.cp as rcp

    plan = zigzag_shard([0, 40, 41], 2)
    rows = len(plan.rank_index(1))
    q, kv = torch.zeros(rows, 4, 64), torch.zeros(rows, 2, 64)
    for causal, window in ((True, (24, 0)), (False, (8, 8)), (False, (-1, 0))):
        with pytest.raises(NotImplementedError) as error:
            rcp.ring_attention(q, kv, kv, plan, 1, causal=causal, window=window)
        message = str(error.value)
        assert message.startswith(f"raggedattn.cp.ring_attention: window={window};"), message
        assert "supports causal and full masks" in message, message
        assert "all-gather strategy, raggedattn.cp.attention(..., window=...)" in message, message
    # (-1, 0) under a causal mask is the causal mask itself, as attention() takes it.
    refuse_ring_window("raggedattn.cp.ring_attention", (-1, 0), "attention", causal=True)


# --- on GPUs: NCCL groups, bf16 -------------------------------------------------------------------

GPU_LENGTHS = [700, 1, 0, 257, 64, 7]  # zero-length and length-1 documents: empty chunks
# test_torch.py's floors for bfloat16 on CUDA (GPU_TOL): the output, the gradients.
GPU_BF16_TOL = {"out": 1e-2, "dq": 2e-2, "dk": 2e-2, "dv": 2e-2, "d_sink": 2e-2}


def _require_nccl_gpus(world):
    torch = pytest.importorskip("torch")
    pytest.importorskip("raggedattn.torch")
    import torch.distributed as dist

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not (dist.is_available() and dist.is_nccl_available()):
        pytest.skip("this PyTorch has no NCCL")
    if torch.cuda.device_count() < world:
        pytest.skip(f"a group of {world} needs {world} GPUs; {torch.cuda.device_count()} here")


def _spawn_gpu(worker, *args, world=1):
    """worker(rank, world, port, *args) in `world` processes of their own, rank r on GPU r: a
    failure there cannot leave this pytest process's CUDA context or NCCL state broken."""
    _require_nccl_gpus(world)
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(world, _free_port()) + args, nprocs=world, join=True)


def _nccl_group(rank, world, port):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    _import_before_the_group()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    return torch.device("cuda", rank)


def _relative_error(got, want) -> float:
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def _gpu_worker(rank, world, port, strategy, mask):
    """One strategy and mask over an NCCL group against raggedattn.torch.attention on the whole
    batch (every rank computes it, from the same seed): this rank's rows of the output and the
    gradients, each within bf16's error."""
    import torch
    import torch.distributed as dist

    device = _nccl_group(rank, world, port)
    try:
        g = torch.Generator(device=device).manual_seed(21)
        cu_np = np.concatenate([[0], np.cumsum(GPU_LENGTHS)]).astype(np.int32)
        cu = torch.from_numpy(cu_np).to(device)
        q, k, v, grad = (torch.randn(int(cu_np[-1]), h, 128, generator=g, device=device,
                                     dtype=torch.bfloat16) for h in (8, 2, 2, 8))
        plan = zigzag_shard(cu_np, world)
        idx = torch.from_numpy(plan.rank_index(rank)).to(device)
        run = _WholeAndShard(strategy, plan, rank, idx, (q, k, v), None, grad, cu,
                             max(GPU_LENGTHS), mask)
        for name, got, want in zip(("out", "dq", "dk", "dv"), (run.out,) + run.grads,
                                   (run.ref,) + run.ref_grads):
            assert got.dtype == torch.bfloat16 and bool(torch.isfinite(got).all()), name
            err = _relative_error(got, want[idx])
            assert err <= GPU_BF16_TOL[name], (
                f"{strategy} {mask} rank {rank} of {world} {name}: relative error {err:.3g} > "
                f"{GPU_BF16_TOL[name]}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("strategy, mask", [("all_gather", "causal"),
                                            ("all_gather", "causal_window"), ("ring", "causal"),
                                            ("ring", "none")])
def test_gpu_nccl_group_matches_whole_batch(strategy, mask, world):
    """Groups of more than one run where the machine has that many GPUs (the multi-GPU run)."""
    _spawn_gpu(_gpu_worker, strategy, mask, world=world)


def _graph_worker(rank, world, port, strategy, mask, with_sink):
    """Forward and backward of one strategy captured in a CUDA graph, replayed on fresh inputs
    copied into the static ones: bitwise an eager run's on the same inputs (deterministic=True)."""
    import torch
    import torch.distributed as dist

    import raggedattn.cp as rcp

    device = _nccl_group(rank, world, port)
    try:
        torch.manual_seed(22 + rank)
        plan = zigzag_shard(np.concatenate([[0], np.cumsum(GPU_LENGTHS)]), world)
        rows = len(plan.rank_index(rank))

        def random_sink():
            return torch.rand(8, device=device) * 4 - 1

        q, k, v = (torch.randn(rows, h, 128, device=device, dtype=torch.bfloat16)
                   .requires_grad_(True) for h in (8, 2, 2))
        d_out = torch.randn(rows, 8, 128, device=device, dtype=torch.bfloat16)
        sink = random_sink().requires_grad_(True) if with_sink else None
        leaves = [q, k, v] + ([sink] if with_sink else [])
        causal, window = MASKS[mask]
        attention = rcp.ring_attention if strategy == "ring" else rcp.attention

        def step():
            out = attention(q, k, v, plan, rank, causal=causal, window=window,
                            deterministic=True, sink=sink)
            return (out,) + torch.autograd.grad(out, leaves, d_out)

        # Warm-up on a side stream (torch.cuda.graph's rule): the plan's index tensors, the
        # library's plans and the NCCL communicator exist before the capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        names = ("out", "dq", "dk", "dv", "d_sink")
        for replay in range(3):
            with torch.no_grad():
                for x in (q, k, v, d_out):
                    x.copy_(torch.randn_like(x))
                if with_sink:
                    sink.copy_(random_sink())
            graph.replay()
            eager = step()
            torch.cuda.synchronize()
            for name, got, want in zip(names, captured, eager):
                gap = (got.float() - want.float()).abs().max().item()
                assert torch.equal(got, want), (
                    f"{strategy} {mask} rank {rank} of {world} replay {replay}: {name} differs "
                    f"from an eager run's by up to {gap:.3g}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("strategy, mask, sink", [("all_gather", "causal", "none"),
                                                  ("all_gather", "causal_window", "sink"),
                                                  ("ring", "causal", "none"),
                                                  ("ring", "none", "sink")])
@pytest.mark.parametrize("world", [1, 2])
def test_gpu_cuda_graph_replays_like_eager(strategy, mask, sink, world):
    _spawn_gpu(_graph_worker, strategy, mask, sink == "sink", world=world)


# --- the scaling benchmark's wiring ---------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["all_gather", "ring"])
def test_cp_scaling_runs_both_strategies(strategy, tmp_path):
    """bench/cp_scaling.py over two gloo processes on the CPU (the multi-GPU run's script, wired
    end to end): rank 0's JSON names the strategy and a positive time for the group and for one
    device."""
    pytest.importorskip("torch")
    pytest.importorskip("raggedattn.torch")
    import json
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "cp_scaling.py")
    out = tmp_path / "cp.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    f"--master-port={_free_port()}", script, "--backend", "gloo", "--device",
                    "cpu", "--tokens", "1024", "--heads", "4/2", "--dim", "64", "--dtype", "fp32",
                    "--iters", "1", "--warmup", "0", "--strategy", strategy, "--out", str(out)],
                   check=True, env=env, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["strategy"] == strategy and result["gpus"] == 2
    assert result["seconds_group"] > 0 and result["seconds_one_device"] > 0

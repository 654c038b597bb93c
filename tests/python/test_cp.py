"""Context parallelism: the zigzag sharding (plain NumPy, everywhere), and the all-gather
attention over a torch.distributed group of 2 and 4 CPU processes (gloo) against the whole batch
in one process, output and gradients row by row (where torch is installed)."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from raggedattn.cp_shard import zigzag_shard

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, lengths, causal, window, seed, deterministic=False,
            strategy="all_gather", with_sink=False):
    import torch
    import torch.distributed as dist

    import raggedattn.cp as rcp
    import raggedattn.torch as rt

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        g = torch.Generator().manual_seed(seed)
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
        total, hq, hkv, d = int(cu[-1]), 4, 2, 64
        q, k, v = (torch.randn(total, h, d, generator=g) for h in (hq, hkv, hkv))
        grad = torch.randn(total, hq, d, generator=g)
        sink = torch.rand(hq, generator=g) * 4 - 1 if with_sink else None
        # The whole batch in one process: the reference.
        full = [t.clone().requires_grad_(True) for t in (q, k, v)]
        if with_sink:
            full.append(sink.clone().requires_grad_(True))
        mx = max(lengths)
        ref = rt.attention(*full[:3], cu, cu, mx, mx, causal=causal, window=window,
                           sink=full[3] if with_sink else None)
        ref_grads = torch.autograd.grad(ref, full, grad)
        # This rank's shard across the group.
        plan = zigzag_shard(cu.numpy(), world)
        idx = torch.from_numpy(plan.rank_index(rank))
        mine = [t[idx].clone().requires_grad_(True) for t in (q, k, v)]
        if with_sink:
            mine.append(sink.clone().requires_grad_(True))
        options = dict(causal=causal, window=window, deterministic=deterministic,
                       sink=mine[3] if with_sink else None)
        if strategy == "ring":
            out = rcp.ring_attention(*mine[:3], plan, rank, deterministic=deterministic,
                                     sink=mine[3] if with_sink else None)
        else:
            out = rcp.attention(*mine[:3], plan, rank, **options)
        grads = torch.autograd.grad(out, mine, grad[idx])
        if deterministic:  # a second run: bitwise the same gradients
            again = rcp.attention(*mine[:3], plan, rank, **options)
            for a, b in zip(grads, torch.autograd.grad(again, mine, grad[idx])):
                assert torch.equal(a, b)
        torch.testing.assert_close(out, ref[idx], atol=2e-5, rtol=2e-5)
        for name, got, want in zip("qkv", grads, ref_grads):
            torch.testing.assert_close(got, want[idx], atol=5e-5, rtol=5e-5, msg=f"d{name}")
        if with_sink:  # each rank's share of the sinks' gradient; the group's sum is the whole
            d_sink = grads[3].clone()
            dist.all_reduce(d_sink, group=None)
            torch.testing.assert_close(d_sink, ref_grads[3], atol=5e-5, rtol=5e-5, msg="d_sink")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("mask", ["causal", "causal_window", "none"])
def test_all_gather_attention_matches_one_process(world, mask):
    torch = pytest.importorskip("torch")
    pytest.importorskip("raggedattn.torch")
    import torch.multiprocessing as mp

    causal = mask != "none"
    window = (24, 0) if mask == "causal_window" else (-1, -1)
    lengths = [70, 1, 0, 33, 128]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_worker, args=(world, _free_port(), lengths, causal, window, 11), nprocs=world,
             join=True)


def test_deterministic_attention_matches_and_repeats():
    torch = pytest.importorskip("torch")
    pytest.importorskip("raggedattn.torch")
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(2, _free_port(), [70, 1, 0, 33, 128], True, (-1, -1), 12, True),
             nprocs=2, join=True)


@pytest.mark.parametrize("deterministic", [False, True])
def test_all_gather_attention_with_sinks(deterministic):
    pytest.importorskip("torch")
    pytest.importorskip("raggedattn.torch")
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(2, _free_port(), [70, 1, 0, 33, 128], True, (-1, -1), 14,
                            deterministic, "all_gather", True), nprocs=2, join=True)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ring_attention_matches_one_process(world):
    pytest.importorskip("torch")
    pytest.importorskip("raggedattn.torch")
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(world, _free_port(), [70, 1, 0, 33, 128, 5], True, (-1, -1), 13,
                            False, "ring"), nprocs=world, join=True)


def test_ring_attention_with_sinks():
    pytest.importorskip("torch")
    pytest.importorskip("raggedattn.torch")
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(2, _free_port(), [70, 1, 0, 33, 128, 5], True, (-1, -1), 15,
                            False, "ring", True), nprocs=2, join=True)

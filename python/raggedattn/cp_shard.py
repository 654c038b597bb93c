"""Context-parallel sharding of a packed batch: which tokens each rank of a group of `cp` holds.

Every document is cut into 2·cp chunks of near-equal length, and rank r takes chunks r and
2·cp − 1 − r (the zigzag pairing): under a causal mask chunk i costs about i + 1/2 units of work,
so each rank's pair costs 2·cp units and the group is balanced document by document. Documents
shorter than 2·cp tokens leave some chunks empty (zero-length pieces). Full and sliding-window
masks shard the same way (their work is even already).

This module is plain NumPy, for a data loader: it shards the batch once (inputs, labels,
positions) with `ShardPlan.rank_index`, and the attention (raggedattn.cp) reads the same plan.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np

__all__ = ["ShardPlan", "zigzag_shard", "window_left", "row_ranges", "chunk_pair_mask",
           "refuse_ring_window"]


def row_ranges(starts, ends) -> np.ndarray:
    """int64: the rows [starts[i], ends[i]) of every i, back to back."""
    starts = np.asarray(starts, dtype=np.int64).reshape(-1)
    lengths = np.asarray(ends, dtype=np.int64).reshape(-1) - starts
    if lengths.sum() == 0:
        return np.zeros(0, dtype=np.int64)
    # Each row is its range's start plus its offset inside the range.
    first = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(starts, lengths) + np.arange(int(lengths.sum()), dtype=np.int64) - first


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """The zigzag sharding of one packed batch over `cp` ranks.

    cu_seqlens: the batch's int32 [B + 1] document boundaries.
    chunk_bounds: int64 [B, 2·cp + 1], chunk c of document b is tokens
        [cu_seqlens[b] + chunk_bounds[b, c], cu_seqlens[b] + chunk_bounds[b, c + 1]).

    The plan does not change, so what is derived from it is computed once (`derived`): the arrays
    its methods return are shared between calls; read them, do not write to them.
    """

    cu_seqlens: np.ndarray
    cp: int
    chunk_bounds: np.ndarray
    _memo: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def derived(self, key, make):
        """make() the first time `key` is asked for, the same value after: the attention calls
        of every layer and step of a batch share the plan's index arrays."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    @property
    def num_docs(self) -> int:
        return len(self.cu_seqlens) - 1

    def rank_chunks(self, rank: int) -> List[int]:
        """The chunk numbers rank `rank` holds of every document, in its local order."""
        return [rank, 2 * self.cp - 1 - rank]

    def rank_pieces(self, rank: int) -> np.ndarray:
        """int64 [2·B, 3]: (document, first token, end token) of each of the rank's pieces in its
        local order (document by document, chunk r then chunk 2·cp − 1 − r); global token rows."""
        return self.derived(("pieces", rank), lambda: self._pieces(rank))

    def _pieces(self, rank: int) -> np.ndarray:
        pieces = []
        for b in range(self.num_docs):
            start = int(self.cu_seqlens[b])
            for c in self.rank_chunks(rank):
                lo, hi = self.chunk_bounds[b, c], self.chunk_bounds[b, c + 1]
                pieces.append((b, start + lo, start + hi))
        return np.asarray(pieces, dtype=np.int64).reshape(-1, 3)

    def rank_index(self, rank: int) -> np.ndarray:
        """int64 [local tokens]: the global row of each of the rank's local rows (shard an input
        with `x[plan.rank_index(rank)]`)."""
        pieces = self.rank_pieces(rank)
        return self.derived(("index", rank), lambda: row_ranges(pieces[:, 1], pieces[:, 2]))

    def rank_cu_seqlens(self, rank: int) -> np.ndarray:
        """int32 [2·B + 1]: the rank's local rows as one segment per piece (zero-length pieces
        included), the query segments of its attention."""
        lengths = np.diff(self.rank_pieces(rank)[:, 1:], axis=1).reshape(-1)
        return self.derived(("cu", rank), lambda: np.concatenate(
            [[0], np.cumsum(lengths)]).astype(np.int32))

    def permutation(self) -> np.ndarray:
        """int64 [total]: the global rows in rank order (rank 0's local rows, then rank 1's...)."""
        return self.derived("perm", lambda: np.concatenate(
            [self.rank_index(r) for r in range(self.cp)]))

    def inverse_permutation(self) -> np.ndarray:
        """int64 [total]: where each global row sits in rank order (undoes `permutation`)."""
        def make():
            perm = self.permutation()
            inverse = np.empty_like(perm)
            inverse[perm] = np.arange(len(perm), dtype=np.int64)
            return inverse

        return self.derived("inverse", make)

    def positions(self, rank: int) -> np.ndarray:
        """int64 [local tokens]: each local row's position inside its document."""
        pieces = self.rank_pieces(rank)
        doc_start = self.cu_seqlens[pieces[:, 0]].astype(np.int64)
        return self.rank_index(rank) - np.repeat(doc_start, pieces[:, 2] - pieces[:, 1])


def zigzag_shard(cu_seqlens, cp: int) -> ShardPlan:
    """The zigzag ShardPlan of a packed batch (`cu_seqlens`: int [B + 1], non-decreasing, from 0)
    over `cp` ranks."""
    cu = np.asarray(cu_seqlens, dtype=np.int64).reshape(-1)
    if cp < 1:
        raise ValueError(f"cp={cp}; need a group of at least one rank")
    if cu.size < 2 or cu[0] != 0 or np.any(np.diff(cu) < 0):
        raise ValueError(f"cu_seqlens must start at 0 and not decrease; got {cu.tolist()[:8]}...")
    lengths = np.diff(cu)
    pieces = 2 * cp
    steps = np.arange(pieces + 1, dtype=np.int64)
    bounds = (lengths[:, None] * steps[None, :]) // pieces  # near-equal, every token once
    return ShardPlan(cu_seqlens=cu.astype(np.int32), cp=cp, chunk_bounds=bounds)


def window_left(where: str, causal: bool, window) -> int:
    """The left side of a context-parallel attention's window (-1: unbounded), after checking the
    mask is one that the chunks' key ranges express: causal (with a left window) or none."""
    left, right = (int(x) for x in window)
    if causal and right > 0:
        raise ValueError(f"{where}: window={tuple(window)} with causal: the right side must be 0 "
                         "or -1")
    if not causal and (left >= 0 or right >= 0):
        raise NotImplementedError(
            f"{where}: window={tuple(window)} without a causal mask; context parallelism takes "
            "causal masks (with a left window) and unmasked attention")
    return left


def chunk_pair_mask(i: int, j: int, causal: bool) -> Optional[str]:
    """How query chunk i of a document sees key chunk j of the same document, for the ring
    strategies (raggedattn.cp, raggedattn.jax_cp), which run chunk against chunk: "full" (every
    query sees every key), "causal" (the diagonal, j == i: the same chunk, so a causal mask of
    either alignment) or None (not at all). Without a causal mask every pair is "full"; under one,
    an earlier key chunk is "full" and a later one is not seen."""
    if not causal:
        return "full"
    if j > i:
        return None
    return "causal" if j == i else "full"


def refuse_ring_window(where: str, window, all_gather: str, causal: bool = True) -> None:
    """Raises NotImplementedError for a ring strategy given a sliding window: anything but
    (-1, -1), or (-1, 0) under a causal mask, which is the causal mask itself; `all_gather` names
    the call that takes windows."""
    given = tuple(int(x) for x in window)
    if given != (-1, -1) and not (causal and given == (-1, 0)):
        raise NotImplementedError(
            f"{where}: window={given}; the ring strategy supports causal and full masks "
            f"(window=(-1, -1)); sliding windows use the all-gather strategy, {all_gather}")

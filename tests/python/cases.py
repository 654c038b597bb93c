"""Named test configurations and the framework-free parts of the references.

Each case is a packing (segment lengths, optional padding between segments) plus heads, head dims
and options. Tests compare every segment separately, so an error confined to segments past the
first shows, and check that padding rows stay zero.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import numpy as np


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    lens_q: Tuple[int, ...]
    lens_kv: Optional[Tuple[int, ...]] = None  # None: self-attention, the lengths of q
    hq: int = 2
    hkv: int = 2
    dqk: int = 64
    dv: Optional[int] = None  # None: dqk
    causal: bool = False
    alignment: str = "top_left"
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    softmax_scale: Optional[float] = None
    padded: bool = False  # gaps between segments (seq_offsets), and padding after the last

    @property
    def kv_lens(self) -> Tuple[int, ...]:
        return self.lens_kv if self.lens_kv is not None else self.lens_q

    @property
    def head_dim_v(self) -> int:
        return self.dv if self.dv is not None else self.dqk

    @property
    def scale(self) -> float:
        return self.softmax_scale if self.softmax_scale is not None else self.dqk**-0.5

    def options(self) -> dict:
        return dict(
            causal=self.causal,
            causal_alignment=self.alignment,
            window=self.window,
            softcap=self.softcap,
            softmax_scale=self.softmax_scale,
        )


CASES = [
    Case("mha", (5, 17, 1, 30)),
    Case("causal_gqa", (9, 33, 16, 2), hq=4, hkv=2, causal=True),
    Case("cross_bottom_right", (3, 12, 0, 7), (8, 12, 5, 2), causal=True, alignment="bottom_right"),
    Case("cross_top_left", (6, 1, 20), (2, 9, 20), hq=2, hkv=1, causal=True),
    Case("window", (24, 7, 40), window=(5, 3)),
    Case("window_causal_bottom_right", (10, 30), (16, 30), causal=True, window=(6, 0),
         alignment="bottom_right"),
    Case("softcap_scale", (12, 19), softcap=5.0, softmax_scale=0.3),
    Case("mqa_192_128", (7, 21, 3), hq=4, hkv=1, dqk=192, dv=128, causal=True),
    Case("padded", (6, 0, 13, 1), (6, 4, 13, 9), padded=True),
    Case("padded_causal_gqa", (11, 3, 25), hq=6, hkv=2, causal=True, padded=True),
    Case("zero_and_one", (0, 1, 0, 5, 1)),
    Case("head_dim_96", (8, 15), dqk=96),
]

CASES_BY_NAME = {c.name: c for c in CASES}


@dataclasses.dataclass
class Packing:
    """Where each segment's rows are: arrays for the library, row indices for the checks."""

    cu_q: np.ndarray  # int32 [B + 1]
    cu_kv: np.ndarray
    off_q: Optional[np.ndarray]  # int32 [B + 1] (last: total) or None
    off_kv: Optional[np.ndarray]
    total_q: int
    total_kv: int
    rows_q: List[np.ndarray]  # rows of segment b in Q/O
    rows_kv: List[np.ndarray]

    @property
    def padding_q(self) -> np.ndarray:
        used = np.zeros(self.total_q, bool)
        for r in self.rows_q:
            used[r] = True
        return np.nonzero(~used)[0]


def _layout(lens, padded: bool, rng: np.random.Generator):
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    if not padded:
        rows = [np.arange(cu[b], cu[b + 1]) for b in range(len(lens))]
        return cu, None, int(cu[-1]), rows
    offsets, rows, cursor = [], [], 0
    for n in lens:
        cursor += int(rng.integers(1, 4))  # a gap before every segment
        offsets.append(cursor)
        rows.append(np.arange(cursor, cursor + n))
        cursor += n
    total = cursor + 2  # and padding after the last
    return cu, np.array(offsets + [total], np.int32), total, rows


def make_packing(case: Case, seed: int = 0) -> Packing:
    rng = np.random.default_rng(seed)
    cu_q, off_q, total_q, rows_q = _layout(case.lens_q, case.padded, rng)
    cu_kv, off_kv, total_kv, rows_kv = _layout(case.kv_lens, case.padded, rng)
    return Packing(cu_q, cu_kv, off_q, off_kv, total_q, total_kv, rows_q, rows_kv)


def visible(case: Case, len_q: int, len_kv: int) -> np.ndarray:
    """[len_q, len_kv] bool: which keys each query of one segment sees."""
    i = np.arange(len_q)[:, None]
    j = np.arange(len_kv)[None, :]
    diag = i + (len_kv - len_q if case.alignment == "bottom_right" else 0)
    left, right = case.window
    if case.causal:
        right = 0
    ok = np.ones((len_q, len_kv), bool)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def full_mask(case: Case, packing: Packing) -> np.ndarray:
    """[total_q, total_kv] bool: the block-diagonal mask of the whole packed batch."""
    mask = np.zeros((packing.total_q, packing.total_kv), bool)
    for rq, rk in zip(packing.rows_q, packing.rows_kv):
        mask[np.ix_(rq, rk)] = visible(case, len(rq), len(rk))
    return mask


def random_inputs(case: Case, packing: Packing, seed: int = 0):
    """float32 q, k, v, and a cotangent for o."""
    rng = np.random.default_rng(seed + 1)
    q = rng.standard_normal((packing.total_q, case.hq, case.dqk), np.float32)
    k = rng.standard_normal((packing.total_kv, case.hkv, case.dqk), np.float32)
    v = rng.standard_normal((packing.total_kv, case.hkv, case.head_dim_v), np.float32)
    d_o = rng.standard_normal((packing.total_q, case.hq, case.head_dim_v), np.float32)
    return q, k, v, d_o


def segment_ids_for(rows: List[List[int]], seq: int) -> np.ndarray:
    """MaxText-style ids [len(rows), seq]: row r packs segments of the given lengths, ids 1, 2, ...
    from its start, then zeros (padding)."""
    ids = np.zeros((len(rows), seq), np.int32)
    for r, lens in enumerate(rows):
        cursor = 0
        for n, length in enumerate(lens):
            ids[r, cursor : cursor + length] = n + 1
            cursor += length
        assert cursor <= seq
    return ids


def mask_from_segment_ids(ids: np.ndarray, causal: bool) -> np.ndarray:
    """[T, T] bool for ids [rows, seq] flattened: same row, same non-zero id (and causal)."""
    rows, seq = ids.shape
    flat = ids.reshape(-1)
    row = np.repeat(np.arange(rows), seq)
    pos = np.tile(np.arange(seq), rows)
    mask = (flat[:, None] == flat[None, :]) & (flat[:, None] != 0) & (row[:, None] == row[None, :])
    if causal:
        mask &= pos[None, :] <= pos[:, None]
    return mask


# --- comparison, per segment -------------------------------------------------------------------


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    denom = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / denom) if denom > 0 else float(np.abs(got).max(initial=0))


def assert_segments_close(what: str, got, want, rows: List[np.ndarray], tol: float,
                          axis: int = 0) -> None:
    """Relative error of every segment's rows (along `axis`) within tol; names the segment."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    for b, r in enumerate(rows):
        if len(r) == 0:
            continue
        g = np.take(got, r, axis=axis)
        w = np.take(want, r, axis=axis)
        finite = np.isfinite(w)
        assert np.array_equal(finite, np.isfinite(g)), f"{what}: segment {b}: non-finite mismatch"
        err = relative_error(np.where(finite, g, 0), np.where(finite, w, 0))
        assert err <= tol, f"{what}: segment {b} (rows {r[0]}..{r[-1]}): relative error {err:.3g} > {tol}"


def assert_zero_rows(what: str, got, rows: np.ndarray, axis: int = 0) -> None:
    if len(rows) == 0:
        return
    block = np.take(np.asarray(got, np.float64), rows, axis=axis)
    assert np.all(block == 0), f"{what}: padding rows {rows.tolist()} are not zero"

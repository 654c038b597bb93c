// The forward CTA's prologue, shared by the portable (mma.sync) and Hopper (wgmma) forward
// kernels: which query tile of which segment the CTA owns and the band of keys its rows see, and
// the outputs of a tile that sees none.
#pragma once

#include "cuda/common/math.cuh"
#include "cuda/common/params.hpp"

namespace raggedattn {
namespace gpu {

// Query tile tc of its segment (BM rows): rows [m0, m0 + rows), and the keys
// [key_lo, key_hi) that any of its rows sees (empty when key_lo >= key_hi).
struct QueryTileWork {
  Segment seg;
  int m0, rows;
  int key_lo, key_hi;
};
template <int BM>
__device__ __forceinline__ QueryTileWork query_tile_work(const FwdParams& p, const TileCoord& tc) {
  QueryTileWork w;
  w.seg = p.segs.get(tc.segment);
  w.m0 = tc.tile * BM;
  w.rows = min(BM, w.seg.len_q - w.m0);
  w.key_lo = p.mask.key_begin(w.m0, w.seg.len_q, w.seg.len_kv);
  w.key_hi = p.mask.key_end(w.m0 + w.rows - 1, w.seg.len_q, w.seg.len_kv);
  return w;
}

// The key tiles of BN keys that a query tile's rows see, [first, first + count) (count 0 where
// w.key_lo >= w.key_hi): the one count a kernel's K/V producer and its consumers share, by the
// span rule of MaskSpec::key_tiles (core/mask.hpp's tiles_of).
template <int BN>
__device__ __forceinline__ TileSpan key_tiles(const QueryTileWork& w) {
  return tiles_of(w.key_lo, w.key_hi, BN);
}

// Head h's sink logit in the log2 domain of the kernels' running maxima; -inf without sinks (a
// column that adds nothing).
__device__ __forceinline__ float sink_log2(const FwdParams& p, int h) {
  return p.sink ? __ldg(p.sink + h) * kLog2e : -INFINITY;
}

// The end of a row's online softmax: `m` its running maximum (log2 domain; -inf: it saw no key),
// `l` the sum of exp2(score - m) over its keys, `sink2` the head's sink_log2. The sink joins the
// sum as one more column. Both terms are taken relative to top = max(m, sink2), so a sink far
// above the row's scores neither overflows nor needs the accumulators rescaled: O = acc * inv,
// and lse is the natural-log LSE. Without a sink, inv = 1 / l and lse = m ln2 + log(l) exactly.
struct RowScale {
  float inv, lse;
};
__device__ __forceinline__ RowScale finish_row(float m, float l, float sink2) {
  const float top = fmaxf(m, sink2);
  if (top == -INFINITY) return {0.f, -INFINITY};  // no key and no sink
  const float a = fast_exp2(m - top);             // 1 unless the sink is above m; 0 for no key
  const float total = l * a + fast_exp2(sink2 - top);
  return {a / total, top * kLn2 + logf(total)};
}

// A query tile no row of which sees a key (w.key_lo >= w.key_hi): O = 0 and LSE = the sink's
// logit (-inf without sinks) for its rows of head h, written by n threads, this one being the t-th.
template <class T, int DV>
__device__ __forceinline__ void write_unseen_tile(const FwdParams& p, const QueryTileWork& w, int h,
                                                  int t, int n) {
  T* o = static_cast<T*>(p.o) + p.o_layout.offset(w.seg.q_row0 + w.m0, h);
  float* lse = p.lse + p.stats.offset(h, w.seg.q_row0 + w.m0);
  for (int c = t; c < w.rows * (DV / 8); c += n) {
    const int r = c / (DV / 8), col = (c % (DV / 8)) * 8;
    *reinterpret_cast<uint4*>(o + r * p.o_layout.token_stride + col) = make_uint4(0, 0, 0, 0);
  }
  const float row_lse = p.sink ? p.sink[h] : -INFINITY;
  for (int r = t; r < w.rows; r += n) lse[r] = row_lse;
}

}  // namespace gpu
}  // namespace raggedattn

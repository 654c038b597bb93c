// The forward CTA's prologue, shared by the portable (mma.sync) and Hopper (wgmma) forward
// kernels: which query tile of which segment the CTA owns and the band of keys its rows see.
#pragma once

#include "cuda/portable/params.hpp"

namespace raggedattn {
namespace portable {

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

}  // namespace portable
}  // namespace raggedattn

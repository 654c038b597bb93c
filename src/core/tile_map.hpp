// The ragged tile map: one linear index space for the row tiles of every segment, in closed form.
//
// Segment b's tiles start at first(b) = floor((cu[b] + b * tile) / tile). Consecutive segments are
// at least ceil((len + 1) / tile) tiles apart, so no two segments share a tile, the index space
// is at most ceil((total + B * tile) / tile) tiles, and no prefix sum over segment lengths is ever
// needed: a kernel turns its block index into (segment, tile) with a binary search over
// cu_seqlens, and the same formula, times `tile`, is the compact dQ-scratch slot of a segment.
#pragma once

#include <cstddef>

#include "core/defs.hpp"

namespace raggedattn {

struct TileCoord {
  int32_t segment;  // -1: this index falls in a gap between segments (no work)
  int32_t tile;     // tile index within the segment
};

// A tile and the head a CTA takes it for: the Hopper backward's schedule entries (key tile, KV
// head; sm90/schedule.cuh).
struct HeadTile {
  TileCoord tc;
  int32_t head;
};

// Where the schedule puts head h of key tile k of a segment whose K key tiles sort to positions
// [first, first + K) of the key-tile order: the segment's CTAs take positions [first * heads,
// (first + K) * heads), tile by tile with its heads together (interleaved) or head by head.
// Either way a permutation of the segment's range (tests/cpu: ScheduleSlots).
RATTN_HD int64_t schedule_slot(int64_t first, int k, int K, int h, int heads, bool interleaved) {
  return first * heads + (interleaved ? int64_t(k) * heads + h : int64_t(h) * K + k);
}

struct RaggedTiles {
  int32_t tile_rows;
  int32_t batch;

  // floor((cu_b + b * tile) / tile) == b + floor(cu_b / tile) for cu_b >= 0: one 32-bit division
  // (a 64-bit one costs a kernel's binary search a software division per step).
  RATTN_HD int64_t first(int b, int32_t cu_b) const {
    return static_cast<int64_t>(b) +
           static_cast<int64_t>(static_cast<uint32_t>(cu_b) / static_cast<uint32_t>(tile_rows));
  }
  RATTN_HD int64_t count(int32_t len) const { return ceil_div(len, tile_rows); }

  // Size of the index space for segments whose valid rows total at most `total_rows`.
  static int64_t bound(int64_t total_rows, int32_t batch, int32_t tile_rows) {
    return ceil_div(total_rows + static_cast<int64_t>(batch) * tile_rows, tile_rows);
  }

  RATTN_HD TileCoord locate(int64_t t, const int32_t* cu) const {
    int lo = 0, hi = batch - 1;  // largest b with first(b) <= t; first(0) == 0 <= t
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (first(mid, cu[mid]) <= t)
        lo = mid;
      else
        hi = mid - 1;
    }
    return at(lo, t, cu);
  }

  // Index t as a tile of segment b, where b is the largest segment with first(b) <= t (locate's
  // search, or the post kernels' CTA-wide one: post::locate_cta).
  RATTN_HD TileCoord at(int b, int64_t t, const int32_t* cu) const {
    const int64_t local = t - first(b, cu[b]);
    TileCoord c;
    c.segment = local < count(cu[b + 1] - cu[b]) ? b : -1;
    c.tile = static_cast<int32_t>(local);
    return c;
  }
};

// Part `part` of `parts` of n items split evenly in contiguous ranges [begin, end): the ranges
// cover [0, n) once, in order; parts past the end get empty ranges. The dot(dO, O) kernel zeroes
// the dQ scratch this way, one part per CTA (cuda/common/bwd_post.cuh).
struct EvenShare {
  size_t begin, end;
};
RATTN_HD EvenShare even_share(size_t n, size_t part, size_t parts) {
  const size_t per = (n + parts - 1) / parts;
  const size_t begin = part * per < n ? part * per : n;
  return {begin, begin + per < n ? begin + per : n};
}

}  // namespace raggedattn

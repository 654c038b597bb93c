// The attention mask of one segment, as ranges: query row i sees keys [key_begin(i), key_end(i)).
//
// Everything (causal top-left / bottom-right, sliding window) is a band around one diagonal:
// diag(i) = i + (bottom_right ? len_kv - len_q : 0), and key j is visible when
//   diag(i) - left <= j <= diag(i) + right,   with left/right = -1 meaning unbounded.
// Causal is right = 0. Both range ends are non-decreasing in i, which is what lets kernels skip
// whole tiles and mask only the tiles that straddle a band edge.
#pragma once

#include "core/defs.hpp"

namespace raggedattn {

// Tiles [first, first + count) of a segment.
struct TileSpan {
  int first = 0, count = 0;
};
// The tiles of `size` rows (or keys) that hold any of [begin, end): none where begin >= end.
RATTN_HD TileSpan tiles_of(int begin, int end, int size) {
  TileSpan t;
  t.first = begin / size;
  t.count = begin < end ? (end - 1) / size - t.first + 1 : 0;
  return t;
}

struct MaskSpec {
  int32_t left = -1;   // -1: unbounded
  int32_t right = -1;  // -1: unbounded; 0: causal
  int32_t bottom_right = 0;

  RATTN_HD int64_t diag_shift(int len_q, int len_kv) const {
    return bottom_right ? static_cast<int64_t>(len_kv) - len_q : 0;
  }
  RATTN_HD int key_begin(int64_t i, int len_q, int len_kv) const {
    if (left < 0) return 0;
    return static_cast<int>(clamp64(i + diag_shift(len_q, len_kv) - left, 0, len_kv));
  }
  RATTN_HD int key_end(int64_t i, int len_q, int len_kv) const {
    if (right < 0) return len_kv;
    return static_cast<int>(clamp64(i + diag_shift(len_q, len_kv) + right + 1, 0, len_kv));
  }
  // Query rows that see key j: [query_begin(j), query_end(j)).
  RATTN_HD int query_begin(int64_t j, int len_q, int len_kv) const {
    if (right < 0) return 0;
    return static_cast<int>(clamp64(j - diag_shift(len_q, len_kv) - right, 0, len_q));
  }
  RATTN_HD int query_end(int64_t j, int len_q, int len_kv) const {
    if (left < 0) return len_q;
    return static_cast<int>(clamp64(j - diag_shift(len_q, len_kv) + left + 1, 0, len_q));
  }
  // The query rows that see any of keys [j0, j0 + keys), keys >= 1: [query_begin(j0),
  // query_end(j0 + keys - 1)), empty where begin >= end (both ends are non-decreasing in the key).
  struct RowSpan {
    int begin, end;
  };
  RATTN_HD RowSpan query_rows(int j0, int keys, int len_q, int len_kv) const {
    return {query_begin(j0, len_q, len_kv), query_end(j0 + keys - 1, len_q, len_kv)};
  }
  // The backward's steps for keys [n0, n0 + keys) (one key tile): the query tiles of `bm` rows
  // that hold a row seeing any of those keys (count 0 where none does).
  RATTN_HD TileSpan query_tiles(int n0, int keys, int bm, int len_q, int len_kv) const {
    const RowSpan q = query_rows(n0, keys, len_q, len_kv);
    return tiles_of(q.begin, q.end, bm);
  }
  // The backward's order over a key tile's query tiles t (query_tiles): step qt of a query head
  // is tile t.first + (qt + rot) mod t.count, with rot = query_rotation(...). Key tiles whose
  // steps cover the whole segment's query tiles (no mask bound on their side: the keys of a
  // non-causal segment, the first ones of a bottom-right causal segment with more keys than
  // queries) all step through the same tiles; in the same order their CTAs would add into one dQ
  // tile at the same step, so each starts at its own tile instead (key tile k at k mod count).
  // Elsewhere, and where the additions take turns (`ordered`: the deterministic mode, whose key
  // tiles add in key order), rot is 0.
  RATTN_HD static int query_rotation(TileSpan t, int key_tile, int bm, int len_q, bool ordered) {
    const bool whole = t.first == 0 && t.count > 0 && t.count == tiles_of(0, len_q, bm).count;
    return whole && !ordered ? key_tile % t.count : 0;
  }
  RATTN_HD static int rotated_tile(TileSpan t, int rot, int qt) {
    const int r = qt + rot;
    return t.first + (r < t.count ? r : r - t.count);
  }
  // The forward's key tiles for query rows [m0, m0 + rows), rows >= 1: the key tiles of `bn` keys
  // that hold a key any of those rows sees (count 0 where none does).
  RATTN_HD TileSpan key_tiles(int m0, int rows, int bn, int len_q, int len_kv) const {
    return tiles_of(key_begin(m0, len_q, len_kv), key_end(m0 + rows - 1, len_q, len_kv), bn);
  }
  // The backward's deterministic order on the query tile of `bm` rows from row m0: the key tiles
  // of `bn` keys whose query_tiles hold it are key_begin(m0) / bn, + 1, ... (one run, no gap), and
  // key tile n adds its dQ at turn n - key_begin(m0) / bn. Every kernel's turn comes from here;
  // a CPU test checks the run over masks and lengths (a gap would leave a turn never taken).
  RATTN_HD int key_tile_turn(int key_tile, int64_t m0, int bn, int len_q, int len_kv) const {
    return key_tile - key_begin(m0, len_q, len_kv) / bn;
  }
  RATTN_HD bool visible(int64_t i, int64_t j, int len_q, int len_kv) const {
    return j >= key_begin(i, len_q, len_kv) && j < key_end(i, len_q, len_kv);
  }
  // True when every (row, key) of rows [i0, i1) x keys [j0, j1) is visible (no per-element mask).
  RATTN_HD bool block_full(int i0, int i1, int j0, int j1, int len_q, int len_kv) const {
    return i1 <= len_q && j1 <= len_kv && j0 >= key_begin(i1 - 1, len_q, len_kv) &&
           j1 <= key_end(i0, len_q, len_kv);
  }
};

}  // namespace raggedattn

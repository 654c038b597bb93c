// DqAccumLayout: the one description of the backward's dQ accumulation scratch.
//
// The workspace size, the main kernel's write address and the post kernel's read address all come
// from one instance of this struct, stored in the Plan. The schemes:
//   Compact      [nsplits, heads, rows, dim]; segment b's slot starts at the ragged tile map's
//                first(b) * align, so every slot is `align`-row aligned, no two segments share a
//                row, and rows <= total_q + B * align. The default for both element types.
//   PaddedBatch  [nsplits, B, heads, round_up(max_seqlen_q, align), dim]: a slot per segment of
//                the longest segment's size. B x max_seqlen rows: kept for comparison only.
//   PackedTokens [nsplits, heads, total_q, dim], row = cu_q[b] + i: segments adjacent with no
//                alignment. Not chosen by any plan; tests use it to rebuild the historical
//                write-one-layout-read-another failure and show the checks catch it.
// Within a slot, the tile order:
//   Rows       row i of the segment at slot row i, its columns contiguous.
//   Wgmma64    each 64-row tile of the segment (rows [64 t, 64 t + 64)) is dim / 8 panels of
//              64 rows x 8 columns, a panel in the order of a wgmma m64n8 accumulator: warpgroup
//              thread u = 32 (r / 16) + 4 (r % 8) + (c % 8) / 2 holds (r, c), (r, c + 1),
//              (r + 8, c), (r + 8, c + 1) for even c and r % 16 < 8, stored as 4 consecutive
//              elements at 4 u of its panel. A warpgroup stores its dQ accumulators as one vector
//              per thread and panel (contiguous, free of bank conflicts) and copies the tile out
//              as one block. Needs whole tiles in every slot: the layout's align is a multiple of
//              64, and the scheme Compact or PaddedBatch.
#pragma once

#include "core/defs.hpp"
#include "core/tile_map.hpp"

namespace raggedattn {

// 16-bit modes accumulate in the input's own 16-bit format: bf16 data in bf16, fp16 data in
// fp16 (bf16's 8-bit mantissa would be coarser than a plain fp16 implementation of the math).
enum class AccumType : int32_t { F32 = 0, BF16 = 1, F16 = 2 };
enum class DqSlotScheme : int32_t { Compact = 0, PaddedBatch = 1, PackedTokens = 2 };
enum class DqTileOrder : int32_t { Rows = 0, Wgmma64 = 1 };

struct DqAccumLayout {
  AccumType type = AccumType::F32;
  DqSlotScheme scheme = DqSlotScheme::Compact;
  int32_t nsplits = 1;
  int32_t batch = 0;
  int32_t heads = 0;
  int32_t dim = 0;
  int32_t align = 1;
  int64_t rows = 0;  // rows of one (split, head) plane; PaddedBatch: rows of one segment's slot
  DqTileOrder order = DqTileOrder::Rows;

  static constexpr int kTileRows = 64;               // Wgmma64: rows of a tile
  static constexpr int kPanelElems = kTileRows * 8;  // Wgmma64: elements of a panel

  RATTN_HD int elem_bytes() const { return type == AccumType::F32 ? 4 : 2; }

  // First row of segment b's slot within a plane.
  RATTN_HD int64_t slot_row0(int b, int32_t cu_q_b) const {
    switch (scheme) {
      case DqSlotScheme::Compact:
        return RaggedTiles{align, batch}.first(b, cu_q_b) * align;
      case DqSlotScheme::PackedTokens:
        return cu_q_b;
      default:
        return 0;
    }
  }
  // Element offset of (split, segment b, head, row i of the segment, column 0).
  RATTN_HD int64_t offset(int split, int b, int32_t cu_q_b, int head, int64_t i) const {
    int64_t plane = scheme == DqSlotScheme::PaddedBatch
                        ? (static_cast<int64_t>(split) * batch + b) * heads + head
                        : static_cast<int64_t>(split) * heads + head;
    return (plane * rows + slot_row0(b, cu_q_b) + i) * dim;
  }
  // offset() is affine in the head and the row: offset(s, b, cu, head, i) ==
  // offset(s, b, cu, 0, 0) + head * head_stride() + i * dim in every scheme, so a kernel can make
  // the segment's base once and step through heads and rows with two products.
  RATTN_HD int64_t head_stride() const { return rows * dim; }
  // Element offset of (split, segment b, head, row i of the segment, column c): where a writer
  // puts and a reader finds one element, in either tile order.
  RATTN_HD int64_t at(int split, int b, int32_t cu_q_b, int head, int64_t i, int32_t c) const {
    return at_from(offset(split, b, cu_q_b, head, 0), i, c);
  }
  // The same from the (split, segment, head) slot's base, offset(split, b, cu_q_b, head, 0), so a
  // reader or writer of many elements of one slot makes that once (offset() is affine in the row).
  RATTN_HD int64_t at_from(int64_t base, int64_t i, int32_t c) const {
    if (order == DqTileOrder::Rows) return base + i * dim + c;
    const int64_t i0 = i - i % kTileRows;  // the tile's first row
    return base + i0 * dim + fragment_index(int32_t(i - i0), c);
  }
  // Wgmma64: (r, c) of a tile, r in [0, 64), within the tile's 64 x dim elements.
  RATTN_HD static int32_t fragment_index(int32_t r, int32_t c) {
    const int32_t u = 32 * (r / 16) + 4 * (r % 8) + (c % 8) / 2;
    return kPanelElems * (c / 8) + 4 * u + 2 * ((r % 16) / 8) + c % 2;
  }
  // Wgmma64: the tile row and panel column of vector u's first element, u in [0, 128): vector u
  // of a panel is the 4 elements at 4 u, (r, c), (r, c + 1), (r + 8, c), (r + 8, c + 1), the
  // fragment warpgroup thread u holds of an m64n8 accumulator. dq_convert reads tiles by vector.
  RATTN_HD static int32_t vector_row(int32_t u) { return 16 * (u / 32) + (u % 32) / 4; }
  RATTN_HD static int32_t vector_col(int32_t u) { return 2 * (u % 4); }
  // Wgmma64: the scratch's 64-row tiles numbered in memory order (every slot is whole tiles, so no
  // tile spans two slots): the tile holding the element at offset `off`, and how many there are.
  // The Hopper backward's claims (BwdWorkspace::dq_claims: which tiles some key tile has written)
  // are indexed by it, from the same offset() its writers and dq_convert address the tile at.
  RATTN_HD int64_t tile_elems() const { return int64_t(kTileRows) * dim; }
  RATTN_HD int64_t tile_of(int64_t off) const { return off / tile_elems(); }
  RATTN_HD int64_t tiles() const { return elements() / tile_elems(); }
  RATTN_HD int64_t elements() const {
    int64_t planes =
        static_cast<int64_t>(nsplits) * heads * (scheme == DqSlotScheme::PaddedBatch ? batch : 1);
    return planes * rows * dim;
  }
  int64_t bytes() const { return elements() * elem_bytes(); }
};

// The only constructor of layouts. total_q: rows of the Q tensor (an upper bound of cu_q[B]).
// order Wgmma64: takes where the scheme gives every segment whole 64-row tiles (Compact,
// PaddedBatch; align rounded up to a multiple of 64) and dim is whole panels; elsewhere the
// result keeps Rows, and its `order` says which was applied.
inline DqAccumLayout make_dq_accum_layout(DqSlotScheme scheme, AccumType type, int32_t nsplits,
                                          int32_t batch, int32_t heads, int32_t dim,
                                          int64_t total_q, int32_t max_seqlen_q, int32_t align,
                                          DqTileOrder order = DqTileOrder::Rows) {
  DqAccumLayout l;
  l.type = type;
  l.scheme = scheme;
  l.nsplits = nsplits;
  l.batch = batch;
  l.heads = heads;
  l.dim = dim;
  l.align = align;
  if (order == DqTileOrder::Wgmma64 && scheme != DqSlotScheme::PackedTokens && dim % 8 == 0) {
    l.order = DqTileOrder::Wgmma64;
    l.align = int32_t(round_up(align, DqAccumLayout::kTileRows));
    align = l.align;
  }
  switch (scheme) {
    case DqSlotScheme::Compact:
      l.rows = RaggedTiles::bound(total_q, batch, align) * align;
      break;
    case DqSlotScheme::PaddedBatch:
      l.rows = round_up(max_seqlen_q, align);
      break;
    case DqSlotScheme::PackedTokens:
      l.rows = total_q;
      break;
  }
  return l;
}

}  // namespace raggedattn

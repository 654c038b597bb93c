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
#pragma once

#include "core/defs.hpp"
#include "core/tile_map.hpp"

namespace raggedattn {

// 16-bit modes accumulate in the input's own 16-bit format: bf16 data in bf16, fp16 data in
// fp16 (bf16's 8-bit mantissa would be coarser than a plain fp16 implementation of the math).
enum class AccumType : int32_t { F32 = 0, BF16 = 1, F16 = 2 };
enum class DqSlotScheme : int32_t { Compact = 0, PaddedBatch = 1, PackedTokens = 2 };

struct DqAccumLayout {
  AccumType type = AccumType::F32;
  DqSlotScheme scheme = DqSlotScheme::Compact;
  int32_t nsplits = 1;
  int32_t batch = 0;
  int32_t heads = 0;
  int32_t dim = 0;
  int32_t align = 1;
  int64_t rows = 0;  // rows of one (split, head) plane; PaddedBatch: rows of one segment's slot

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
  RATTN_HD int64_t elements() const {
    int64_t planes =
        static_cast<int64_t>(nsplits) * heads * (scheme == DqSlotScheme::PaddedBatch ? batch : 1);
    return planes * rows * dim;
  }
  int64_t bytes() const { return elements() * elem_bytes(); }
};

// The only constructor of layouts. total_q: rows of the Q tensor (an upper bound of cu_q[B]).
inline DqAccumLayout make_dq_accum_layout(DqSlotScheme scheme, AccumType type, int32_t nsplits,
                                          int32_t batch, int32_t heads, int32_t dim,
                                          int64_t total_q, int32_t max_seqlen_q, int32_t align) {
  DqAccumLayout l;
  l.type = type;
  l.scheme = scheme;
  l.nsplits = nsplits;
  l.batch = batch;
  l.heads = heads;
  l.dim = dim;
  l.align = align;
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

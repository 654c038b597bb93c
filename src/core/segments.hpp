// Where segment b lives: the one place every backend and kernel asks.
//
// cu_seqlens give the valid lengths (len = cu[b+1] - cu[b]); without seq_offsets a segment's rows
// start at cu[b] (packed THD), with them at offsets[b] (padded THD: rows between segments are
// padding that nothing reads or writes).
#pragma once

#include "core/defs.hpp"

namespace raggedattn {

struct Segment {
  int64_t q_row0;   // first row of the segment in Q/O/dQ/dO/LSE
  int64_t kv_row0;  // first row in K/V/dK/dV
  int32_t cu_q;     // cu_seqlens_q[b]: the segment's rank among valid query rows (slot maps use it)
  int32_t cu_kv;
  int32_t len_q;
  int32_t len_kv;
};

struct SegmentArrays {
  const int32_t* cu_q;
  const int32_t* cu_kv;
  const int32_t* offsets_q;   // nullptr: packed
  const int32_t* offsets_kv;  // nullptr: packed

  RATTN_HD Segment get(int b) const {
    Segment s;
    s.cu_q = cu_q[b];
    s.cu_kv = cu_kv[b];
    s.len_q = cu_q[b + 1] - s.cu_q;
    s.len_kv = cu_kv[b + 1] - s.cu_kv;
    s.q_row0 = offsets_q ? offsets_q[b] : s.cu_q;
    s.kv_row0 = offsets_kv ? offsets_kv[b] : s.cu_kv;
    return s;
  }
};

// Whether tensor row `row` of one side (cu: cu_seqlens_q or _kv, offsets: seq_offsets_q or _kv or
// nullptr) lies inside a segment; every other row is padding, which only the zero_padding mode
// writes. Packed: rows [cu[0], cu[batch]). Padded: the offsets increase and the segments are
// disjoint (validation's rule), so the one candidate is the last segment starting at or before it.
RATTN_HD bool row_in_segment(const int32_t* cu, const int32_t* offsets, int32_t batch,
                             int64_t row) {
  if (batch <= 0) return false;
  if (offsets == nullptr) return row >= cu[0] && row < cu[batch];
  if (row < offsets[0]) return false;
  int lo = 0, hi = batch - 1;  // the largest b with offsets[b] <= row lies in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= row) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return row < int64_t(offsets[lo]) + (cu[lo + 1] - cu[lo]);
}

// Element offset of (row, head, 0) in a [rows, heads, dim] tensor with a contiguous last dim.
// 64-bit throughout: tensors of more than 2^31 elements are normal in packed training batches.
struct TensorLayout {
  int64_t token_stride;
  int64_t head_stride;
  RATTN_HD int64_t offset(int64_t row, int head) const {
    return row * token_stride + static_cast<int64_t>(head) * head_stride;
  }
};

// LSE and the backward's dot(dO, O) share one layout: fp32 [heads, total_q], indexed by tensor row.
struct RowStatLayout {
  int64_t total_q;
  RATTN_HD int64_t offset(int head, int64_t row) const {
    return static_cast<int64_t>(head) * total_q + row;
  }
  RATTN_HD int64_t elements(int heads) const { return static_cast<int64_t>(heads) * total_q; }
};

}  // namespace raggedattn

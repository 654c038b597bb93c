// The attention mask, re-derived from the problem definition in raggedattn.h rather than taken
// from src/core/mask.hpp: the dense brute force must not share code (or a misreading) with the
// backends it checks.
//
// Within one segment of len_q queries and len_kv keys, the diagonal is
//   diag(i) = i                       (top-left)
//   diag(i) = i + (len_kv - len_q)    (bottom-right)
// and key j is visible to query i when
//   j <= diag(i)                      if causal
//   j >= diag(i) - window_left        if window_left >= 0
//   j <= diag(i) + window_right       if window_right >= 0
#pragma once

#include <algorithm>
#include <cstdint>

#include "verify/case_spec.hpp"

namespace raggedattn {
namespace verify {

struct MaskRule {
  bool causal = false;
  bool bottom_right = false;
  int32_t left = -1;
  int32_t right = -1;

  static MaskRule of(const CaseSpec& s) {
    MaskRule m;
    m.causal = s.mask == RATTN_MASK_CAUSAL;
    m.bottom_right = s.alignment == RATTN_ALIGN_BOTTOM_RIGHT;
    m.left = s.window_left;
    m.right = s.window_right;
    return m;
  }

  int64_t diag(int64_t i, int64_t len_q, int64_t len_kv) const {
    return bottom_right ? i + (len_kv - len_q) : i;
  }

  bool visible(int64_t i, int64_t j, int64_t len_q, int64_t len_kv) const {
    if (i < 0 || i >= len_q || j < 0 || j >= len_kv) return false;
    const int64_t d = diag(i, len_q, len_kv);
    if (causal && j > d) return false;
    if (left >= 0 && j < d - left) return false;
    if (right >= 0 && j > d + right) return false;
    return true;
  }

  // Number of keys query i sees: the band is contiguous, so it is a clipped interval length.
  int64_t keys_seen(int64_t i, int64_t len_q, int64_t len_kv) const {
    const int64_t d = diag(i, len_q, len_kv);
    int64_t lo = left >= 0 ? d - left : 0;
    int64_t hi = len_kv - 1;
    if (causal) hi = std::min(hi, d);
    if (right >= 0) hi = std::min(hi, d + right);
    lo = std::max<int64_t>(lo, 0);
    return hi >= lo ? hi - lo + 1 : 0;
  }
};

}  // namespace verify
}  // namespace raggedattn

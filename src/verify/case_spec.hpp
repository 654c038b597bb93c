// A verification case: one named attention problem (segments, shapes, mask, dtype, backend).
//
// Cases are plain values so that the named suite, random draws and the command line all build the
// same thing, and a failing case can be printed, copied and re-run on its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "raggedattn/raggedattn.h"

namespace raggedattn {
namespace verify {

struct CaseSpec {
  std::string name;
  std::vector<int32_t> seqlens_q;
  std::vector<int32_t> seqlens_kv;  // empty: the same as seqlens_q (self-attention)
  int32_t hq = 8;
  int32_t hkv = 2;
  int32_t dqk = 128;
  int32_t dv = 128;
  rattn_dtype dtype = RATTN_DTYPE_BF16;
  rattn_mask mask = RATTN_MASK_NONE;
  rattn_alignment alignment = RATTN_ALIGN_TOP_LEFT;
  int32_t window_left = -1;  // -1: unbounded
  int32_t window_right = -1;
  float softcap = 0.f;
  // Learnable attention sinks (rattn_problem.has_sink): make_inputs draws one logit per query
  // head, and the backward's d_sink is checked against the reference's.
  bool sink = false;
  // The backward is given a random cotangent of the LSE (rattn_bwd_tensors.d_lse), which flows
  // into dQ, dK and d_sink; without it the backward's d_lse is null.
  bool lse_grad = false;
  // Padded THD: seq_offsets place the segments with random gaps of padding rows between them; the
  // padding of every output is filled with a sentinel that must survive the run.
  bool padded = false;
  // Input padding rows hold NaN instead of kInputPaddingValue: rows outside every segment may hold
  // anything, and a kernel that reads one into a result (even multiplied by a zero probability)
  // turns that result into NaN.
  bool nan_padding = false;
  // Rows past the last segment (both sides, after padded THD's last gap): padding in a packed
  // layout too, where the problem's total rows exceed cu_seqlens[batch].
  int32_t trailing_rows = 0;
  // The problem's zero_padding mode: the padding rows of every output must come out zero instead
  // of keeping their sentinel.
  bool zero_padding = false;
  rattn_dq_accum dq_accum = RATTN_DQ_ACCUM_FP32;
  bool deterministic = false;
  rattn_backend backend = RATTN_BACKEND_AUTO;

  const std::vector<int32_t>& kv_lens() const {
    return seqlens_kv.empty() ? seqlens_q : seqlens_kv;
  }
  int32_t batch() const { return int32_t(seqlens_q.size()); }
};

// The named configurations of the verification suite. GQA cases use heads_q / heads_kv; the
// MQA case uses heads_q / 1. Names are stable: scripts and bug reports refer to them.
std::vector<CaseSpec> named_suite(int32_t heads_q, int32_t heads_kv);

// Bounds of random_case draws. The defaults keep the dense float64 brute force (O(total^2) per
// head) within a fraction of a second per case.
struct RandomLimits {
  int32_t heads_q = 4;  // GQA/MQA draws divide this
  int32_t max_segments = 6;
  int32_t max_total = 384;  // rows of Q (and of K/V) over all segments, padding excluded
  rattn_dtype dtype = RATTN_DTYPE_BF16;
  rattn_backend backend = RATTN_BACKEND_AUTO;
  // Where set, only the head dims it accepts are drawn (a path that takes some of them: the
  // command passes sm90::path_supports for --backend cuda_sm90). Unset: all six, and a seed draws
  // the same case as without the field.
  bool (*takes_dims)(int dqk, int dv) = nullptr;
};

// A random ragged problem over the supported shapes: head dims {64, 96, 128, 192, 256} and
// 192/128; lengths that are not multiples of 16, 1 and 0; one long segment; GQA/MQA; q != kv
// lengths; every mask, alignment, window and softcap; padded or not; sinks and an LSE cotangent,
// each about one case in three. The same seed gives the same case; the case is named
// "random_<seed>".
CaseSpec random_case(uint64_t seed, const RandomLimits& limits = {});

// Visible (query, key) pairs of the case's mask over all segments, for FLOP counts.
int64_t visible_pairs(const CaseSpec& spec);

// FLOPs of one forward and one backward pass. Only visible pairs count: 2 * (Dqk + Dv) * Hq per
// pair forward (Q.K^T and P.V, a multiply-add being two FLOPs), and 2.5 times that backward (five
// matrix products instead of two: recomputing S, dP, dV, dQ and dK), the FlashAttention
// convention the project's benchmarks use.
double forward_flops(const CaseSpec& spec);
double backward_flops(const CaseSpec& spec);

// Short human-readable forms, used by reports and error messages.
const char* dtype_str(rattn_dtype t);
const char* backend_str(rattn_backend b);
const char* dq_accum_str(rattn_dq_accum a);
// The attention's math, e.g. "causal top-left, window (64, 0), softcap 2, sinks, lse grad".
std::string mask_str(const CaseSpec& spec);
std::string segments_str(const CaseSpec& spec);  // e.g. "[100,80,76]" or "q[37,90] kv[128,50]"

// Parsers of the same names; return false on an unknown name.
bool parse_dtype(const std::string& s, rattn_dtype* out);
bool parse_backend(const std::string& s, rattn_backend* out);
bool parse_dq_accum(const std::string& s, rattn_dq_accum* out);

}  // namespace verify
}  // namespace raggedattn

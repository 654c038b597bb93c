// Dense float64 brute force: the attention of the whole packed batch as one [total_q x total_kv]
// score matrix per head, with the block-diagonal and band mask written out element by element.
//
// It shares nothing with src/reference (nor with src/core's mask and segment code): segments come
// from cu_seqlens / seq_offsets as raggedattn.h defines them, the mask from verify/mask_rules.hpp.
// It checks the reference backend itself, so it is deliberately naive. Its cost is
// O(total_q * total_kv * heads * dim): keep cases small.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "verify/case_spec.hpp"
#include "verify/host_data.hpp"
#include "verify/mask_rules.hpp"

namespace raggedattn {
namespace verify {

// A dense [rows, heads, dim] tensor of doubles.
struct DenseTensor {
  int64_t rows = 0;
  int32_t heads = 0;
  int32_t dim = 0;
  std::vector<double> values;

  DenseTensor() = default;
  DenseTensor(int64_t r, int32_t h, int32_t d)
      : rows(r), heads(h), dim(d), values(size_t(r * h * d), 0.0) {}
  double* row(int64_t r, int32_t h) { return &values[size_t((r * heads + h) * dim)]; }
  const double* row(int64_t r, int32_t h) const { return &values[size_t((r * heads + h) * dim)]; }
  TensorView view() const;
};

DenseTensor to_dense(const TensorView& t, int64_t rows);

struct DenseProblem {
  int64_t rows_q = 0, rows_kv = 0;
  int32_t hq = 0, hkv = 0, dqk = 0, dv = 0;
  double scale = 0;
  double softcap = 0;
  MaskRule mask;
  // Row -> segment (-1: padding) and position within it; segment -> lengths.
  std::vector<int32_t> seg_q, pos_q, seg_kv, pos_kv;
  std::vector<int32_t> len_q, len_kv;
  // Attention sinks: query head h's logit, one more column of every row's softmax with no value
  // (raggedattn.h's has_sink). Empty: no sinks. dense_problem leaves it empty; they are inputs.
  std::vector<double> sink;

  // The explicit mask: can query row r see key row c?
  bool visible(int64_t r, int64_t c) const;
};

// Reads the segment placement from the layout's cu_seqlens and seq_offsets arrays.
DenseProblem dense_problem(const CaseSpec& spec, const PackLayout& layout);

struct DenseForward {
  DenseTensor o;    // [rows_q, hq, dv]; rows that see no key: 0
  DenseTensor lse;  // [rows_q, hq, 1]; rows that see no key: -inf, or the sink's logit
};
struct DenseBackward {
  DenseTensor dq, dk, dv;
  // dQ's and dK's terms, element by element, in absolute value: the sums over keys (queries) of
  // |dS| |K| (|dS| |Q|), with |dS_rj| taken as P_rj (|dP_rj| + |delta_r|). dS is a difference that
  // can nearly cancel (a short causal segment whose dP is nearly level across its keys); a
  // backend's rounding is relative to these, not to dQ and dK themselves.
  DenseTensor dq_magnitude, dk_magnitude;
  std::vector<double> d_sink;  // [hq] where the problem has sinks, else empty
  // [hq]: the sum over the head's rows of the magnitudes of their d_sink terms. The terms have
  // both signs and their sum can nearly cancel; a backend's rounding is relative to these.
  std::vector<double> d_sink_magnitude;
};

// Told how many of the pass's rows (query rows times query heads) are done, for progress reports
// of long checks. Called from the worker threads, one call at a time.
using RowProgress = std::function<void(int64_t done, int64_t total)>;

// The threads the brute force runs on for `hkv` KV heads; each holds score matrices of its own.
int dense_threads(int32_t hkv);

DenseForward dense_forward(const DenseProblem& p, const DenseTensor& q, const DenseTensor& k,
                           const DenseTensor& v, const RowProgress& progress = nullptr);
// `o` is the forward output the backward is given (as the API's backward is); P and the LSE are
// recomputed from the exact scores. `d_lse` ([rows_q, hq, 1], may be null: zeros) is the LSE's
// cotangent: d lse_r / d s_rc = P_rc, and d lse_r / d sink = P_r,sink.
DenseBackward dense_backward(const DenseProblem& p, const DenseTensor& q, const DenseTensor& k,
                             const DenseTensor& v, const DenseTensor& o, const DenseTensor& d_o,
                             const DenseTensor* d_lse = nullptr,
                             const RowProgress& progress = nullptr);

}  // namespace verify
}  // namespace raggedattn

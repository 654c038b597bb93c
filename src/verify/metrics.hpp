// Error metrics per segment and per tensor, and the pass rule of DESIGN.md "Verification".
//
// Every segment is compared on its own: an error confined to the segments past the first (the
// failure this project exists to prevent) cannot hide in a norm taken over the whole batch.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "verify/host_data.hpp"

namespace raggedattn {
namespace verify {

enum class Tensor : int { O = 0, Lse = 1, Dq = 2, Dk = 3, Dv = 4 };
constexpr int kNumTensors = 5;
const char* tensor_name(Tensor t);
// O, LSE and dQ have a row per query; dK and dV a row per key.
inline bool is_query_side(Tensor t) {
  return t == Tensor::O || t == Tensor::Lse || t == Tensor::Dq;
}

// DESIGN.md's rule: cosine >= 0.9999, and the relative error within twice the error a plain
// low-precision implementation of the same math makes against the exact reference...
constexpr double kMinCosine = 0.9999;
constexpr double kLowpFactor = 2.0;
// ...plus this floor. Where the plain implementation happens to be exact (a length-1 segment:
// O is a row of V; a segment whose outputs are representable), twice its error is zero and any
// re-association of fp32 sums would fail; 1e-3 is below half a bf16 ulp (2^-9), so it forgives
// fp32 noise but not one rounding step of bf16 data.
constexpr double kRelFloor = 1e-3;

// A reference that is all zero has no norm to be relative to; the bound is then on max abs error:
// lowp_factor x the low-precision implementation's max abs error, plus this. Such references are
// zero by structure (dK, dV of keys no query sees: any correct kernel writes exact zeros) or by
// cancellation (a length-1 segment has O = V, so dP - dot(dO, O) is 0 in exact arithmetic, and
// fp32 sums taken in another order leave ~1e-6). The inputs are N(0, 1) with gradients of
// 1e-2..1: 1e-3 forgives the cancellation and nothing a wrong address or a missed mask produces.
constexpr double kZeroRefAbsFloor = 1e-3;

struct Tolerance {
  double min_cos = kMinCosine;
  double lowp_factor = kLowpFactor;
  double rel_floor = kRelFloor;
  double zero_abs = kZeroRefAbsFloor;
  // The part of rel_floor that is relative to the sum's terms rather than to the sum (the
  // arithmetic's rounding, not the output's to its storage type): where the terms cancel, it
  // grows by their cancellation (check_tensor's `magnitude`, d_sink).
  double terms_floor = 0.0;
  Tolerance with_cancellation(double factor) const {
    Tolerance t = *this;
    t.rel_floor += terms_floor * (factor - 1.0);
    return t;
  }
};

struct Metrics {
  int64_t rows = 0;           // rows of this tensor in the segment; 0: empty, passes
  int64_t elements = 0;       // elements compared (those with a finite reference)
  double cos = 1.0;           // cosine similarity with the reference
  double rel = 0.0;           // ||x - ref|| / ||ref||
  double max_abs = 0.0;       // max |x - ref|
  double rel_lowp = 0.0;      // the low-precision implementation's rel (0 when none was given)
  double max_abs_lowp = 0.0;  // ...and its max abs error
  double cos_lowp = 1.0;      // ...and its cosine with the reference
  double bound = 0.0;         // the bound on rel (on max_abs, for a zero reference)
  int64_t nonfinite = 0;      // NaN/Inf outputs where the reference is finite
  int64_t inf_mismatch = 0;   // elements that are -inf in exactly one of output and reference
  bool zero_ref = false;      // the reference is all zero: max_abs is bounded instead of rel
  bool pass = true;

  bool empty() const { return rows == 0; }
};

// The comparison itself, over n values. Reference values of -inf (LSE of a row that sees no key)
// are not compared numerically: the output must be -inf exactly there, and must not be -inf
// anywhere else. `lowp` (may be null) is the plain low-precision implementation's output.
Metrics compare(const double* x, const double* ref, const double* lowp, int64_t n,
                const Tolerance& tol);

// Compares rows [row0, row0 + rows) of every head of host tensors `x` and `ref` (and `lowp`).
Metrics check_rows(const TensorView& x, const TensorView& ref, const TensorView* lowp, int64_t row0,
                   int64_t rows, const Tolerance& tol);

// How far a sum lies below the magnitudes of its terms, norm-wise (>= 1; 1 for a zero sum): the
// factor by which a rounding error relative to each term grows relative to the sum.
double cancellation(double sum_norm, double magnitude_norm);

// One tensor, every segment: element b is segment b's metrics. Callable on any host arrays, e.g.
// a dQ deliberately read through the wrong scratch layout. `magnitude` (may be null) holds the
// sums of the reference's terms in absolute value: each segment's tol.terms_floor then grows by
// its cancellation (Tolerance::with_cancellation).
std::vector<Metrics> check_tensor(Tensor which, const std::vector<SegmentRows>& segments,
                                  const TensorView& x, const TensorView& ref,
                                  const TensorView* lowp, const Tolerance& tol,
                                  const TensorView* magnitude = nullptr);

using TensorViews = std::array<TensorView, kNumTensors>;  // indexed by Tensor
using Tolerances = std::array<Tolerance, kNumTensors>;

struct SegmentCheck {
  int32_t len_q = 0;
  int32_t len_kv = 0;
  std::array<Metrics, kNumTensors> t;
  bool pass() const;
};

// Every tensor, every segment. `lowp` may be null (then the bound is the floor alone), and so may
// `magnitude` or any of its views (check_tensor; a view without data: no such allowance).
std::vector<SegmentCheck> check_all(const std::vector<SegmentRows>& segments, const TensorViews& x,
                                    const TensorViews& ref, const TensorViews* lowp,
                                    const Tolerances& tol, const TensorViews* magnitude = nullptr);

// Views of a set of outputs, in Tensor order.
TensorViews views(const HostOutputs& out);

}  // namespace verify
}  // namespace raggedattn

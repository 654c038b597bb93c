// The CPU backend: exact attention forward and backward (fp32 math, fp64 sums) over host tensors.
//
// It serves users without a GPU and is the reference every GPU path is checked against. With
// `emulate_low_precision` it instead rounds each intermediate (scores, probabilities, outputs,
// dP, dS) to the problem's dtype, as a plain bf16/fp16 implementation of the same math would:
// the checks bound a fast path's error by a multiple of that implementation's error.
#pragma once

#include "plan/plan_data.hpp"

namespace raggedattn {
namespace reference {

struct Options {
  bool emulate_low_precision = false;
  int threads = 0;  // 0: hardware concurrency
};

void forward(const PlanData& plan, const FwdTensors& t, const Options& opt = {});
void backward(const PlanData& plan, const BwdTensors& t, const Options& opt = {});

// The zero_padding mode on host tensors: zeros in every row outside the segments (row_in_segment)
// of the direction's outputs (forward: O and LSE's columns; backward: dQ, dK, dV).
void zero_padding(const PlanData& plan, const FwdTensors& t);
void zero_padding(const PlanData& plan, const BwdTensors& t);

}  // namespace reference
}  // namespace raggedattn

// The backward's launch sequence, shared by every CUDA path: clear the dQ scratch (and the
// deterministic mode's locks), dot(dO, O), the path's main kernel, dq_convert. A path supplies
// only its main kernel's launch; the scratch, its layout and the post kernels are the Plan's and
// are the same for all paths.
#pragma once

#include <cuda_runtime.h>

#include "common/status.hpp"
#include "cuda/common/params.hpp"
#include "plan/plan_data.hpp"

namespace raggedattn {
namespace cuda {

// `ctx`: what the path prepared for its launch before the sequence began (the Hopper path's TMA
// maps), passed through unchanged; null where a path needs nothing.
using BwdMainLaunch = cudaError_t (*)(const gpu::BwdParams& p, const PlanData& plan,
                                      const void* ctx, cudaStream_t stream);

Status run_backward(const PlanData& plan, const BwdTensors& t, void* workspace, void* stream,
                    BwdMainLaunch main_kernel, const void* ctx = nullptr);

}  // namespace cuda
}  // namespace raggedattn

// The backward's launch sequence, shared by every CUDA path: clear the dQ scratch (and the
// deterministic mode's locks), dot(dO, O), the path's main kernel, dq_convert. A path supplies
// only its main kernel's launch; the scratch, its layout and the post kernels are the Plan's and
// are the same for all paths.
#pragma once

#include <cuda_runtime.h>

#include "common/status.hpp"
#include "cuda/portable/params.hpp"
#include "plan/plan_data.hpp"

namespace raggedattn {
namespace cuda {

using BwdMainLaunch = cudaError_t (*)(const portable::BwdParams& p, const PlanData& plan,
                                      cudaStream_t stream);

Status run_backward(const PlanData& plan, const BwdTensors& t, void* workspace, void* stream,
                    BwdMainLaunch main_kernel);

}  // namespace cuda
}  // namespace raggedattn

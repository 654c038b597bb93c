// Host-side launchers of the portable kernels (templates instantiated in inst_*.cu).
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/params.hpp"
#include "plan/plan_data.hpp"

namespace raggedattn {
namespace portable {

template <class T, int DQK, int DV>
cudaError_t launch_fwd(const gpu::FwdParams& p, const LaunchShape& shape, int heads_q,
                       cudaStream_t stream);

template <class T, int DQK, int DV>
cudaError_t launch_bwd(const gpu::BwdParams& p, const LaunchShape& shape, int heads_kv,
                       cudaStream_t stream);

}  // namespace portable
}  // namespace raggedattn

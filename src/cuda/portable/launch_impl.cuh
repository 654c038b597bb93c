// Definitions of the launchers; included only by the inst_*.cu translation units.
#pragma once

#include "cuda/common/launch_kernel.cuh"
#include "cuda/portable/bwd_kernel.cuh"
#include "cuda/portable/fwd_kernel.cuh"
#include "cuda/portable/launch.cuh"

namespace raggedattn {
namespace portable {

template <class T, int DQK, int DV>
cudaError_t launch_fwd(const gpu::FwdParams& p, const LaunchShape& shape, int heads_q,
                       cudaStream_t stream) {
  return cuda::launch_kernel(fwd_kernel<T, DQK, DV>, shape, heads_q, p, stream);
}

template <class T, int DQK, int DV>
cudaError_t launch_bwd(const gpu::BwdParams& p, const LaunchShape& shape, int heads_kv,
                       cudaStream_t stream) {
  return cuda::launch_kernel(bwd_kernel<T, DQK, DV>, shape, heads_kv, p, stream);
}

}  // namespace portable
}  // namespace raggedattn

#define RATTN_INSTANTIATE_PORTABLE(DQK, DV)                                                        \
  namespace raggedattn {                                                                           \
  namespace portable {                                                                             \
  template cudaError_t launch_fwd<__nv_bfloat16, DQK, DV>(const gpu::FwdParams&,                   \
                                                          const LaunchShape&, int, cudaStream_t);  \
  template cudaError_t launch_fwd<__half, DQK, DV>(const gpu::FwdParams&, const LaunchShape&, int, \
                                                   cudaStream_t);                                  \
  template cudaError_t launch_bwd<__nv_bfloat16, DQK, DV>(const gpu::BwdParams&,                   \
                                                          const LaunchShape&, int, cudaStream_t);  \
  template cudaError_t launch_bwd<__half, DQK, DV>(const gpu::BwdParams&, const LaunchShape&, int, \
                                                   cudaStream_t);                                  \
  }                                                                                                \
  }

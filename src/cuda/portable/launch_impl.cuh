// Definitions of the launchers; included only by the inst_*.cu translation units.
#pragma once

#include "cuda/portable/bwd_kernel.cuh"
#include "cuda/portable/fwd_kernel.cuh"
#include "cuda/portable/launch.cuh"

namespace raggedattn {
namespace portable {

template <class T, int DQK, int DV>
cudaError_t launch_fwd(const FwdParams& p, const LaunchShape& shape, int heads_q,
                       cudaStream_t stream) {
  auto kernel = fwd_kernel<T, DQK, DV>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(shape.smem_bytes));
  if (e != cudaSuccess) return e;
  kernel<<<dim3(unsigned(shape.tiles), unsigned(heads_q)), shape.threads, shape.smem_bytes,
           stream>>>(p);
  return cudaGetLastError();
}

template <class T, int DQK, int DV>
cudaError_t launch_bwd(const BwdParams& p, const LaunchShape& shape, int heads_kv,
                       cudaStream_t stream) {
  auto kernel = bwd_kernel<T, DQK, DV>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(shape.smem_bytes));
  if (e != cudaSuccess) return e;
  kernel<<<dim3(unsigned(shape.tiles), unsigned(heads_kv)), shape.threads, shape.smem_bytes,
           stream>>>(p);
  return cudaGetLastError();
}

}  // namespace portable
}  // namespace raggedattn

#define RATTN_INSTANTIATE_PORTABLE(DQK, DV)                                                     \
  namespace raggedattn {                                                                        \
  namespace portable {                                                                          \
  template cudaError_t launch_fwd<__nv_bfloat16, DQK, DV>(const FwdParams&, const LaunchShape&, \
                                                          int, cudaStream_t);                   \
  template cudaError_t launch_fwd<__half, DQK, DV>(const FwdParams&, const LaunchShape&, int,   \
                                                   cudaStream_t);                               \
  template cudaError_t launch_bwd<__nv_bfloat16, DQK, DV>(const BwdParams&, const LaunchShape&, \
                                                          int, cudaStream_t);                   \
  template cudaError_t launch_bwd<__half, DQK, DV>(const BwdParams&, const LaunchShape&, int,   \
                                                   cudaStream_t);                               \
  }                                                                                             \
  }

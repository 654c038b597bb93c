// One kernel launch from a Plan's LaunchShape: opt in to its dynamic shared memory, then launch
// grid (shape.tiles, grid_y) with shape.threads threads, or (shape.item_ctas, 1) for a persistent
// kernel that takes the same tiles x grid_y work items from a counter. Every CUDA path launches
// through this.
#pragma once

#include <cuda_runtime.h>

#include "plan/plan_data.hpp"

namespace raggedattn {
namespace cuda {

template <class Params>
cudaError_t launch_kernel(void (*kernel)(Params), const LaunchShape& shape, int grid_y,
                          const Params& p, cudaStream_t stream) {
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(shape.smem_bytes));
  if (e != cudaSuccess) return e;
  const dim3 grid = shape.item_ctas > 0 ? dim3(unsigned(shape.item_ctas), 1u)
                                        : dim3(unsigned(shape.tiles), unsigned(grid_y));
  kernel<<<grid, shape.threads, shape.smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace raggedattn

// One kernel launch from a Plan's LaunchShape: opt in to its dynamic shared memory, then launch
// shape.grid(grid_y) with shape.threads threads: (shape.tiles, grid_y), (shape.tiles * n,
// grid_y / n) where n heads are the inner index (LaunchShape::inner_heads), or (shape.item_ctas, 1)
// for a persistent kernel that takes the same tiles x grid_y work items from a counter. Every CUDA
// path launches through this.
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
  const LaunchShape::Grid g = shape.grid(grid_y);  // within the device's limits (make_plan)
  const dim3 grid(unsigned(g.x), unsigned(g.y));
  kernel<<<grid, shape.threads, shape.smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace raggedattn

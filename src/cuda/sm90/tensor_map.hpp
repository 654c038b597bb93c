// TMA tensor maps of the THD tensors, made on the host from a Plan's layout. A map views one
// tensor as 3-d: dim 0 the head dim (contiguous), dim 1 the head, dim 2 the row, with the Plan's
// strides; a box is 64 elements (one 128-byte swizzle panel) of one head over `box_rows` rows,
// written to shared memory in the 128-byte-swizzled panel layout the wgmma descriptors read
// (hopper.cuh). Rows past the tensor read as zeros; rows past a segment but inside the tensor are
// the next rows' data, so kernels use TMA only for tiles that lie inside their segment.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "common/status.hpp"
#include "core/segments.hpp"

namespace raggedattn {
namespace cuda {

// The driver's encoder, found once through the runtime (the library does not link libcuda).
// `where` (forward, backward) and `name` name the call and the tensor in the error; `dtype` is the
// problem's 16-bit type (the Hopper path takes no other).
inline Status make_thd_map(const char* where, const char* name, CUtensorMap* map, rattn_dtype dtype,
                           const void* base, const TensorLayout& layout, int heads, int64_t rows,
                           int dim, int box_rows) {
  const CUtensorMapDataType type = dtype == RATTN_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  using Encode =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<Encode>(fn);
  }();
  if (!encode) {
    return not_supported(where,
                         "the Hopper path needs the driver's cuTensorMapEncodeTiled "
                         "(CUDA 12.0 or newer driver), which this driver does not provide");
  }
  constexpr cuuint64_t kElem = 2;  // 16-bit elements
  const cuuint64_t size[3] = {cuuint64_t(dim), cuuint64_t(heads), cuuint64_t(rows > 0 ? rows : 1)};
  const cuuint64_t stride[2] = {cuuint64_t(layout.head_stride) * kElem,
                                cuuint64_t(layout.token_stride) * kElem};
  const cuuint32_t box[3] = {64, 1, cuuint32_t(box_rows)};
  const cuuint32_t elem_stride[3] = {1, 1, 1};
  const CUresult r = encode(map, type, 3, const_cast<void*>(base), size, stride, box, elem_stride,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    // The Plan's validation already requires 16-byte aligned pointers and strides, which is what
    // the encoder checks; a failure here is a driver limit the library does not know of.
    return not_supported(where, "the Hopper path could not describe ", name,
                         " to the TMA unit (cuTensorMapEncodeTiled returned ", int(r),
                         " for base=", base, ", ", rows, " rows, ", heads, " heads of dim ", dim,
                         ", strides token=", layout.token_stride, " head=", layout.head_stride,
                         " elements)");
  }
  return Status::Ok();
}

}  // namespace cuda
}  // namespace raggedattn

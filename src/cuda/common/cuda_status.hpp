// A CUDA runtime error as the library's Status: where it happened, the error's name and text.
#pragma once

#include <cuda_runtime.h>

#include "common/status.hpp"

namespace raggedattn {
namespace cuda {

inline Status cuda_status(const char* where, cudaError_t e) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(RATTN_ERROR_CUDA, str_cat("raggedattn: ", where, ": ", cudaGetErrorName(e), ": ",
                                          cudaGetErrorString(e)));
}

}  // namespace cuda
}  // namespace raggedattn

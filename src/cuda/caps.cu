// Device capabilities and small runtime helpers of the CUDA backends.
#include <cuda_runtime.h>

#include "common/status.hpp"
#include "cuda/backend.hpp"

namespace raggedattn {
namespace cuda {

DeviceCaps query_device(int device) {
  DeviceCaps c = cpu_caps();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return c;
  }
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) return c;
  cudaDeviceProp prop;
  if (device >= count || cudaGetDeviceProperties(&prop, device) != cudaSuccess) return c;
  c.cuda = 1;
  c.device = device;
  c.cc_major = prop.major;
  c.cc_minor = prop.minor;
  c.num_sms = prop.multiProcessorCount;
  c.smem_per_block_optin = int64_t(prop.sharedMemPerBlockOptin);
  c.l2_bytes = int64_t(prop.l2CacheSize);
  return c;
}

Status copy_to_host(const int32_t* device_ptr, int64_t count, int32_t* host, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e =
      cudaMemcpyAsync(host, device_ptr, size_t(count) * sizeof(int32_t), cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) {
    return Status(RATTN_ERROR_CUDA, str_cat("raggedattn: check_segments: copying segment arrays "
                                            "to the host failed: ",
                                            cudaGetErrorString(e)));
  }
  return Status::Ok();
}

}  // namespace cuda
}  // namespace raggedattn

// Device capabilities and small runtime helpers of the CUDA backends.
#include <cuda.h>
#include <cuda_runtime.h>

#include "common/status.hpp"
#include "cuda/backend.hpp"
#include "cuda/common/cuda_status.hpp"

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

// A host thread that has made no CUDA call yet (a framework's autograd worker, say) has no current
// context. The runtime would bind one on the thread's first launch, but the Hopper path's first
// call is the driver's tensor-map encoder, which fails there with CUDA_ERROR_INVALID_CONTEXT; and
// the runtime's choice would be its own current device, not necessarily the plan's. The thread
// gets the plan's device's primary context instead. A current context is left as it is: it is the
// caller's (a framework's own, or one made current on purpose).
Status bind_thread_context(int device, const char* where) {
  using GetCurrent = CUresult (*)(CUcontext*);
  static const GetCurrent get_current = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<GetCurrent>(fn);
  }();
  CUcontext current = nullptr;
  if (get_current && get_current(&current) == CUDA_SUCCESS && current) return Status::Ok();
  if (device < 0) {
    const cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return cuda_status(where, e);
  }
  const cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) return Status::Ok();
  cudaGetLastError();
  return Status(RATTN_ERROR_CUDA,
                str_cat("raggedattn: ", where, ": making CUDA device ", device,
                        "'s context current on this thread (it had none) failed: ",
                        cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
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

// Entry points of the CUDA backends, called by the dispatcher (src/api) only.
#pragma once

#include "plan/plan_data.hpp"

namespace raggedattn {
namespace cuda {

DeviceCaps query_device(int device);

// Makes `device`'s primary context current on the calling thread where the thread has none, before
// a direction's first CUDA call (caps.cu says why); a thread with a current context keeps it.
Status bind_thread_context(int device, const char* where);

Status portable_forward(const PlanData& plan, const FwdTensors& t, void* workspace, void* stream);
Status portable_backward(const PlanData& plan, const BwdTensors& t, void* workspace, void* stream);
// The Hopper path (wgmma, sm_90a builds only).
Status sm90_forward(const PlanData& plan, const FwdTensors& t, void* workspace, void* stream);
Status sm90_backward(const PlanData& plan, const BwdTensors& t, void* workspace, void* stream);

// The zero_padding mode (padding.cu): zeros in the direction's output rows outside every segment,
// on `stream`, after the path's kernels; both CUDA paths.
Status zero_padding(const PlanData& plan, const FwdTensors& t, void* stream);
Status zero_padding(const PlanData& plan, const BwdTensors& t, void* stream);

// Copies `count` int32 values from device memory (synchronizing `stream`), for the debug check.
Status copy_to_host(const int32_t* device_ptr, int64_t count, int32_t* host, void* stream);

}  // namespace cuda
}  // namespace raggedattn

// The portable path's entry points: params from the Plan, then its kernels (the backward's
// through the shared launch sequence, cuda/common/bwd_sequence.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/status.hpp"
#include "cuda/backend.hpp"
#include "cuda/common/bwd_sequence.hpp"
#include "cuda/common/cuda_status.hpp"
#include "cuda/common/dispatch_dims.cuh"
#include "cuda/common/params.hpp"
#include "cuda/portable/instantiations.hpp"
#include "cuda/portable/launch.cuh"

namespace raggedattn {
namespace cuda {
namespace {

using gpu::BwdParams;
using gpu::FwdParams;

// The portable instantiations (instantiations.hpp); the Plan admits only the listed shapes.
RATTN_DEFINE_DIMS_DISPATCH(dispatch, RATTN_PORTABLE_HEAD_DIMS)

struct FwdLauncher {
  const gpu::FwdParams& p;
  const PlanData& d;
  cudaStream_t s;
  template <class T, int DQK, int DV>
  cudaError_t operator()() const {
    return portable::launch_fwd<T, DQK, DV>(p, d.fwd, d.problem.num_heads_q, s);
  }
};

struct BwdLauncher {
  const gpu::BwdParams& p;
  const PlanData& d;
  cudaStream_t s;
  template <class T, int DQK, int DV>
  cudaError_t operator()() const {
    return portable::launch_bwd<T, DQK, DV>(p, d.bwd, d.problem.num_heads_kv, s);
  }
};

cudaError_t launch_portable_bwd(const gpu::BwdParams& p, const PlanData& d, const void*,
                                cudaStream_t s) {
  return dispatch(d.problem, BwdLauncher{p, d, s});
}

}  // namespace

Status portable_forward(const PlanData& d, const FwdTensors& t, void* /*workspace*/, void* stream) {
  if (d.problem.total_q == 0) return Status::Ok();
  const gpu::FwdParams p = gpu::make_fwd_params(d, t);
  return cuda_status("forward",
                     dispatch(d.problem, FwdLauncher{p, d, static_cast<cudaStream_t>(stream)}));
}

Status portable_backward(const PlanData& d, const BwdTensors& t, void* workspace, void* stream) {
  if (d.bwd_ws.dq_accum.order != DqTileOrder::Rows) {  // the Plan orders tiles for Hopper only
    return not_supported("backward",
                         "the portable backward adds into the dQ scratch in row order; this plan's "
                         "scratch is in the Hopper backward's tile order");
  }
  if (d.bwd_ws.dq_accum.dim != d.problem.head_dim_qk) {  // the kernel's row stride is its DQK
    return not_supported(
        "backward",
        str_cat("the portable backward's dQ scratch rows are the head dim (", d.problem.head_dim_qk,
                ") apart; this plan's scratch has rows of ", d.bwd_ws.dq_accum.dim));
  }
  if (d.bwd_ws.dq_claims.bytes != 0) {  // the scratch would not be zeroed for its additions
    return not_supported("backward",
                         "the portable backward adds into a zeroed dQ scratch; this plan has the "
                         "Hopper backward's claimed dQ tiles");
  }
  if (d.bwd_ws.schedule.bytes != 0) {  // likewise the key tiles' order
    return not_supported("backward",
                         "the portable backward takes its key tiles in grid order; this plan has "
                         "the Hopper backward's schedule");
  }
  return run_backward(d, t, workspace, stream, &launch_portable_bwd);
}

}  // namespace cuda
}  // namespace raggedattn

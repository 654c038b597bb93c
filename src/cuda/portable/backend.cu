// The portable path's entry points: params from the Plan, then the launch sequence.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/status.hpp"
#include "cuda/backend.hpp"
#include "cuda/bwd_sequence.hpp"
#include "cuda/dispatch_dims.cuh"
#include "cuda/portable/instantiations.hpp"
#include "cuda/portable/launch.cuh"
#include "cuda/portable/params.hpp"
#include "cuda/post/bwd_post.cuh"

namespace raggedattn {
namespace cuda {
namespace {

using portable::BwdParams;
using portable::FwdParams;

Status cuda_status(const char* where, cudaError_t e) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(RATTN_ERROR_CUDA, str_cat("raggedattn: ", where, ": ", cudaGetErrorName(e), ": ",
                                          cudaGetErrorString(e)));
}

// The portable instantiations (instantiations.hpp); the Plan admits only the listed shapes.
RATTN_DEFINE_DIMS_DISPATCH(dispatch, RATTN_PORTABLE_HEAD_DIMS)

struct FwdLauncher {
  const FwdParams& p;
  const PlanData& d;
  cudaStream_t s;
  template <class T, int DQK, int DV>
  cudaError_t operator()() const {
    return portable::launch_fwd<T, DQK, DV>(p, d.fwd, d.problem.num_heads_q, s);
  }
};

struct BwdLauncher {
  const BwdParams& p;
  const PlanData& d;
  cudaStream_t s;
  template <class T, int DQK, int DV>
  cudaError_t operator()() const {
    return portable::launch_bwd<T, DQK, DV>(p, d.bwd, d.problem.num_heads_kv, s);
  }
};

cudaError_t launch_portable_bwd(const BwdParams& p, const PlanData& d, const void*,
                                cudaStream_t s) {
  return dispatch(d.problem, BwdLauncher{p, d, s});
}

template <class T>
cudaError_t launch_post(const PlanData& d, const BwdParams& p, void* workspace, bool convert,
                        cudaStream_t s) {
  const Problem& pr = d.problem;
  const RaggedTiles tiles{post::kPostRows, pr.batch};
  const dim3 grid = post::post_grid(pr.total_q, pr.batch, pr.num_heads_q);
  if (!convert) {
    // The dQ scratch is zeroed by this kernel too (bwd_post.cuh), in 16-byte words, or, where the
    // main kernel claims its tiles (BwdWorkspace::dq_claims), only the claims.
    const Region& cleared = d.bwd_ws.cleared();
    uint4* clear = cleared.in<uint4>(workspace);
    const size_t clear_words = cleared.bytes / sizeof(uint4);
    post::DotParams dp{p.o,     p.d_o, p.dpsum,       p.segs, p.o_layout, p.do_layout,
                       p.stats, tiles, pr.head_dim_v, pr.num_heads_q, clear,  clear_words};
    post::dot_do_o_kernel<T><<<grid, post::kPostThreads, 0, s>>>(dp);
  } else {
    post::ConvertParams cp{p.dq_accum_ptr, p.dq_claims, p.dq_accum, p.dq,
                           p.segs,         p.dq_layout, tiles,      p.scale, pr.num_heads_q};
    post::dq_convert_kernel<T><<<grid, post::kPostThreads, 0, s>>>(cp);
  }
  return cudaGetLastError();
}

}  // namespace

Status portable_forward(const PlanData& d, const FwdTensors& t, void* /*workspace*/, void* stream) {
  if (d.problem.total_q == 0) return Status::Ok();
  const FwdParams p = portable::make_fwd_params(d, t);
  return cuda_status("forward",
                     dispatch(d.problem, FwdLauncher{p, d, static_cast<cudaStream_t>(stream)}));
}

Status run_backward(const PlanData& d, const BwdTensors& t, void* workspace, void* stream,
                    BwdMainLaunch main_kernel, const void* ctx) {
  const Problem& pr = d.problem;
  if (pr.total_q == 0 && pr.total_kv == 0) return Status::Ok();
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const BwdParams p = portable::make_bwd_params(d, t, workspace);
  const BwdWorkspace& ws = d.bwd_ws;
  // The dQ scratch (or, where the main kernel claims its tiles, the claims) is zeroed by the
  // dot(dO, O) kernel below, which runs whenever there are query rows (without them nothing adds
  // into or reads the scratch). It clears 16-byte words: the region must be made of them (the
  // Plan's regions are 256-byte aligned, the scratch's rows a multiple of 16 bytes at every head
  // dim, the claims rounded up to 16 bytes).
  const Region& cleared = ws.cleared();
  if (cleared.bytes % sizeof(uint4) != 0 || cleared.offset % sizeof(uint4) != 0 ||
      reinterpret_cast<uintptr_t>(workspace) % sizeof(uint4) != 0) {
    return Status(RATTN_ERROR_INTERNAL,
                  str_cat("backward: the ", p.dq_claims ? "dQ claims" : "dQ scratch", " (",
                          cleared.bytes, " bytes) are not made of aligned 16-byte words"));
  }
  if (p.locks) {
    RATTN_RETURN_IF_ERROR(cuda_status("backward: clearing the locks",
                                      cudaMemsetAsync(p.locks, 0, ws.locks.bytes, s)));
  }
  const bool bf16 = pr.dtype == RATTN_DTYPE_BF16;
  if (pr.total_q > 0) {
    RATTN_RETURN_IF_ERROR(cuda_status("backward: dot(dO, O)",
                                      bf16 ? launch_post<__nv_bfloat16>(d, p, workspace, false, s)
                                           : launch_post<__half>(d, p, workspace, false, s)));
  }
  RATTN_RETURN_IF_ERROR(cuda_status("backward", main_kernel(p, d, ctx, s)));
  if (pr.total_q > 0) {
    RATTN_RETURN_IF_ERROR(cuda_status("backward: dq_convert",
                                      bf16 ? launch_post<__nv_bfloat16>(d, p, workspace, true, s)
                                           : launch_post<__half>(d, p, workspace, true, s)));
  }
  return Status::Ok();
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

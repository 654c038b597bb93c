// The backward's launch sequence, shared by every CUDA path (bwd_sequence.hpp).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/status.hpp"
#include "cuda/common/bwd_post.cuh"
#include "cuda/common/bwd_sequence.hpp"
#include "cuda/common/cuda_status.hpp"
#include "cuda/common/params.hpp"

namespace raggedattn {
namespace cuda {
namespace {

template <class T>
cudaError_t launch_post(const PlanData& d, const gpu::BwdParams& p, void* workspace, bool convert,
                        cudaStream_t s) {
  const Problem& pr = d.problem;
  const RaggedTiles tiles{post::kPostRows, pr.batch};
  const dim3 grid = post::post_grid(p.post_tiles, pr.num_heads_q);
  if (!convert) {
    // The dQ scratch is zeroed by this kernel too (bwd_post.cuh), in 16-byte words, or, where the
    // main kernel claims its tiles (BwdWorkspace::dq_claims), only the claims.
    const Region& cleared = d.bwd_ws.cleared();
    uint4* clear = cleared.in<uint4>(workspace);
    const size_t clear_words = cleared.bytes / sizeof(uint4);
    post::DotParams dp{p.o,     p.d_o, p.dpsum,       p.segs,         p.o_layout, p.do_layout,
                       p.stats, tiles, pr.head_dim_v, pr.num_heads_q, clear,      clear_words,
                       p.d_lse, p.lse, p.sink,        p.sink_partials};
    post::dot_do_o_kernel<T><<<grid, post::kPostThreads, 0, s>>>(dp);
  } else {
    post::ConvertParams cp{p.dq_accum_ptr, p.dq_claims, p.dq_accum, p.dq,          p.segs,
                           p.dq_layout,    tiles,       p.scale,    pr.num_heads_q};
    post::dq_convert_kernel<T><<<grid, post::kPostThreads, 0, s>>>(cp);
  }
  return cudaGetLastError();
}

// d_sink from the dot(dO, O) kernel's shares (none where there are no query rows: zeros).
cudaError_t launch_sink_grad(const PlanData& d, const gpu::BwdParams& p, cudaStream_t s) {
  const post::SinkGradParams sp{p.sink_partials, d.problem.total_q > 0 ? p.post_tiles : 0,
                                p.d_sink};
  post::sink_grad_kernel<<<d.problem.num_heads_q, post::kPostThreads, 0, s>>>(sp);
  return cudaGetLastError();
}

}  // namespace

Status run_backward(const PlanData& d, const BwdTensors& t, void* workspace, void* stream,
                    BwdMainLaunch main_kernel, const void* ctx) {
  const Problem& pr = d.problem;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const gpu::BwdParams p = gpu::make_bwd_params(d, t, workspace);
  if (pr.total_q == 0 && pr.total_kv == 0) {
    return p.d_sink ? cuda_status("backward: d_sink", launch_sink_grad(d, p, s)) : Status::Ok();
  }
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
  if (p.d_sink) RATTN_RETURN_IF_ERROR(cuda_status("backward: d_sink", launch_sink_grad(d, p, s)));
  return Status::Ok();
}

}  // namespace cuda
}  // namespace raggedattn

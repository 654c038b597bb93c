// The Hopper forward's entry point (compiled for sm_90a only): params from the Plan, one launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/status.hpp"
#include "cuda/backend.hpp"
#include "cuda/common/cuda_status.hpp"
#include "cuda/common/dispatch_dims.cuh"
#include "cuda/common/launch_kernel.cuh"
#include "cuda/sm90/fwd_kernel.cuh"
#include "cuda/sm90/schedule.cuh"
#include "cuda/sm90/tensor_map.hpp"

namespace raggedattn {
namespace cuda {
namespace {

// One forward launch at head dims DQK / DV after the query tiles' order (schedule.cuh; its tiles
// are the kernel's, from fwd_config): the grid kernel or the persistent kernel (the Plan's
// LaunchShape::item_ctas picks). The instantiations: bf16 and fp16 at each pair of
// RATTN_SM90_FWD_HEAD_DIMS.
struct FwdLauncher {
  const sm90::FwdTmaParams& a;
  const PlanData& d;
  cudaStream_t s;
  template <class T, int DQK, int DV>
  cudaError_t operator()() const {
    const int hq = d.problem.num_heads_q;
    // The grid kernel reads its (query tile, head) as grid_slot's over a GQA group.
    if (d.fwd.item_ctas == 0 && d.fwd.inner_heads != hq / d.problem.num_heads_kv) {
      return cudaErrorInvalidConfiguration;
    }
    const bool persistent = d.fwd.item_ctas > 0;
    // Both kernels have the same tiles (the Plan's d.fwd.tiles counts them once), so one order.
    constexpr sm90::FwdConfig c = sm90::fwd_config(DQK, DV, false);
    constexpr sm90::FwdConfig cp = sm90::fwd_config(DQK, DV, true);
    static_assert(c.block_m == cp.block_m && c.block_n == cp.block_n,
                  "the persistent and grid forward kernels share the query tiles' order");
    sm90::fwd_lpt_schedule<c.block_m, c.block_n><<<1, sm90::kScheduleThreads, 0, s>>>(
        a.p, const_cast<TileCoord*>(a.schedule), int(d.fwd.tiles));
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return persistent ? launch_kernel(sm90::fwd_persistent_kernel<T, DQK, DV>, d.fwd, hq, a, s)
                      : launch_kernel(sm90::fwd_kernel<T, DQK, DV>, d.fwd, hq, a, s);
  }
};
RATTN_DEFINE_DIMS_DISPATCH(dispatch, RATTN_SM90_FWD_HEAD_DIMS)

}  // namespace

Status sm90_forward(const PlanData& d, const FwdTensors& t, void* workspace, void* stream) {
  const Problem& pr = d.problem;
  if (pr.total_q == 0) return Status::Ok();
  if (!sm90::fwd_supports(pr.head_dim_qk, pr.head_dim_v)) {  // the Plan never sends these here
    return not_supported("forward",
                         "the Hopper forward has no kernel for head_dim_qk=", pr.head_dim_qk,
                         ", head_dim_v=", pr.head_dim_v);
  }
  sm90::FwdTmaParams a{};
  a.p = gpu::make_fwd_params(d, t);
  a.work_tiles = d.fwd.tiles;
  a.heads = pr.num_heads_q;
  a.work_counter = d.fwd_ws.work_counter.in<unsigned long long>(workspace);
  a.schedule = d.fwd_ws.schedule.in<TileCoord>(workspace);
  RATTN_RETURN_IF_ERROR(make_thd_map("forward", "q", &a.q_map, pr.dtype, t.q, d.q(), pr.num_heads_q,
                                     pr.total_q, pr.head_dim_qk, d.fwd.block_m));
  RATTN_RETURN_IF_ERROR(make_thd_map("forward", "k", &a.k_map, pr.dtype, t.k, d.k(),
                                     pr.num_heads_kv, pr.total_kv, pr.head_dim_qk, d.fwd.block_n));
  RATTN_RETURN_IF_ERROR(make_thd_map("forward", "v", &a.v_map, pr.dtype, t.v, d.v(),
                                     pr.num_heads_kv, pr.total_kv, pr.head_dim_v, d.fwd.block_n));
  if (d.fwd.item_ctas > 0 && a.work_counter == nullptr) {  // the Plan sizes the workspace for it
    return not_supported("forward",
                         "the persistent Hopper forward takes work items from a counter in the "
                         "forward's workspace; this plan has ",
                         d.fwd.item_ctas, " CTAs and no work counter");
  }
  if (a.schedule == nullptr) {  // the Plan sizes the workspace for it
    return not_supported("forward",
                         "the Hopper forward takes its query tiles' order from the forward's "
                         "workspace; this plan has no schedule region");
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // The work counter starts at zero on every call (in a captured graph: a memset node).
  cudaError_t e = cudaSuccess;
  if (d.fwd.item_ctas > 0) e = cudaMemsetAsync(a.work_counter, 0, sizeof(unsigned long long), s);
  if (e == cudaSuccess) {
    e = dispatch(pr, FwdLauncher{a, d, s});
  }
  return cuda_status("forward (sm90)", e);
}

}  // namespace cuda
}  // namespace raggedattn

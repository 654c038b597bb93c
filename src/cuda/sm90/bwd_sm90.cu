// The Hopper backward's entry point (compiled for sm_90a only): the shared launch sequence
// (cuda/common/bwd_sequence.hpp) with the wgmma main kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/status.hpp"
#include "cuda/backend.hpp"
#include "cuda/common/bwd_sequence.hpp"
#include "cuda/common/dispatch_dims.cuh"
#include "cuda/common/launch_kernel.cuh"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/schedule.cuh"
#include "cuda/sm90/tensor_map.hpp"

namespace raggedattn {
namespace cuda {
namespace {

// One backward main launch at head dims DQK / DV, after the key tiles' order where the Plan asks
// for one (schedule.cuh; its tiles are the kernel's, from bwd_config). The instantiations: bf16
// and fp16 at each pair of RATTN_SM90_BWD_HEAD_DIMS with dQ through the shared-memory tile, and
// where the column split takes dQ from registers that kernel too: the Plan's LaunchShape::dq_staged
// picks.
struct BwdLauncher {
  const sm90::BwdTmaParams& a;
  const PlanData& d;
  cudaStream_t s;
  template <class T, int DQK, int DV>
  cudaError_t operator()() const {
    // With a schedule the kernel's grid is its entries (LaunchShape::inner_heads: every KV head),
    // without one (tiles, KV heads).
    const int hkv = d.problem.num_heads_kv;
    if (d.bwd.inner_heads != (a.p.schedule != nullptr ? hkv : 0)) {
      return cudaErrorInvalidConfiguration;
    }
    constexpr sm90::BwdConfig c = sm90::bwd_config(DQK, DV, false);
    if (a.p.schedule != nullptr) {
      sm90::bwd_lpt_schedule<c.block_m, c.block_n>
          <<<1, sm90::kScheduleThreads, 0, s>>>(a.p, const_cast<HeadTile*>(a.p.schedule),
                                                int(d.bwd.tiles), hkv, d.bwd_ws.interleave_rows);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
    }
    if constexpr (sm90::bwd_column_split(DQK, DV)) {
      if (!d.bwd.dq_staged) {
        return launch_kernel(sm90::bwd_kernel<T, DQK, DV, true>, d.bwd, d.problem.num_heads_kv, a,
                             s);
      }
    }
    return launch_kernel(sm90::bwd_kernel<T, DQK, DV, false>, d.bwd, d.problem.num_heads_kv, a, s);
  }
};
RATTN_DEFINE_DIMS_DISPATCH(dispatch, RATTN_SM90_BWD_HEAD_DIMS)

// `ctx`: the kernel's parameters with the TMA maps made by sm90_backward before the launch
// sequence (run_backward's context); the launch adds the sequence's BwdParams.
cudaError_t launch(const gpu::BwdParams& p, const PlanData& d, const void* ctx,
                   cudaStream_t s) {
  sm90::BwdTmaParams a = *static_cast<const sm90::BwdTmaParams*>(ctx);
  a.p = p;
  return dispatch(d.problem, BwdLauncher{a, d, s});
}

}  // namespace

Status sm90_backward(const PlanData& d, const BwdTensors& t, void* workspace, void* stream) {
  const Problem& pr = d.problem;
  // The Plan never sends other shapes here; the kernel's tile, stages and shared memory are the
  // Plan's (core/sm90_shapes.hpp), for the way its dQ goes (LaunchShape::dq_staged).
  const bool dq_regs = !d.bwd.dq_staged;
  const sm90::BwdConfig c = sm90::bwd_config(pr.head_dim_qk, pr.head_dim_v, dq_regs);
  // dQ from registers: only the column split has that kernel, and it adds 16-bit values with no
  // turns (no deterministic mode).
  const bool dq_regs_ok = !dq_regs || (sm90::bwd_column_split(pr.head_dim_qk, pr.head_dim_v) &&
                                       !pr.deterministic && pr.dq_accum != RATTN_DQ_ACCUM_FP32);
  if (!sm90::bwd_supports(pr.head_dim_qk, pr.head_dim_v) || d.bwd.block_m != c.block_m ||
      d.bwd.block_n != c.block_n || d.bwd.stages != c.stages || !dq_regs_ok ||
      d.bwd.smem_bytes != sm90::bwd_smem(pr.head_dim_qk, pr.head_dim_v, dq_regs).bytes) {
    return not_supported(
        "backward", "the Hopper backward has no kernel for head_dim_qk=", pr.head_dim_qk,
        ", head_dim_v=", pr.head_dim_v, " with tiles ", d.bwd.block_m, "x", d.bwd.block_n, ", ",
        d.bwd.stages, " stages, ", d.bwd.smem_bytes, " bytes of shared memory and dQ ",
        dq_regs ? "from registers" : "through shared memory");
  }
  // The kernel stages each dQ tile in its accumulators' order and adds it into the scratch as
  // one block, so the scratch must be in that order with whole 64-row tiles (the Plan's).
  const DqAccumLayout& dq = d.bwd_ws.dq_accum;
  if (dq.order != DqTileOrder::Wgmma64 || dq.align % d.bwd.block_m != 0 ||
      d.bwd.block_m != DqAccumLayout::kTileRows) {
    return not_supported("backward",
                         "the Hopper backward writes the dQ scratch in 64-row wgmma tiles; this "
                         "plan's scratch has tile order ",
                         int(dq.order), ", alignment ", dq.align, " for query tiles of ",
                         d.bwd.block_m);
  }
  // Warp 1 claims the dQ tiles wherever the Plan reserved claims (BwdWorkspace::dq_claims), and
  // dot(dO, O) cleared them instead of the scratch. Claims need a claim for every tile, warp 1
  // adding the tiles (not the registers) and no turns: deterministic mode adds into a zeroed
  // scratch.
  const bool claimed = d.bwd_ws.dq_claims.bytes != 0;
  if (claimed && (dq_regs || pr.deterministic ||
                  d.bwd_ws.dq_claims.bytes < size_t(dq.tiles()) * sizeof(int32_t))) {
    return not_supported("backward",
                         "the Hopper backward claims its dQ tiles from warp 1 outside "
                         "deterministic mode; this plan reserves ",
                         d.bwd_ws.dq_claims.bytes, " bytes of claims for ", dq.tiles(), " tiles",
                         dq_regs ? " with dQ from registers" : "",
                         pr.deterministic ? " in deterministic mode" : "");
  }
  sm90::BwdTmaParams maps{};
  RATTN_RETURN_IF_ERROR(make_thd_map("backward", "q", &maps.q_map, pr.dtype, t.q, d.q(),
                                     pr.num_heads_q, pr.total_q, pr.head_dim_qk, d.bwd.block_m));
  RATTN_RETURN_IF_ERROR(make_thd_map("backward", "d_o", &maps.do_map, pr.dtype, t.d_o, d.d_o(),
                                     pr.num_heads_q, pr.total_q, pr.head_dim_v, d.bwd.block_m));
  RATTN_RETURN_IF_ERROR(make_thd_map("backward", "k", &maps.k_map, pr.dtype, t.k, d.k(),
                                     pr.num_heads_kv, pr.total_kv, pr.head_dim_qk, d.bwd.block_n));
  RATTN_RETURN_IF_ERROR(make_thd_map("backward", "v", &maps.v_map, pr.dtype, t.v, d.v(),
                                     pr.num_heads_kv, pr.total_kv, pr.head_dim_v, d.bwd.block_n));
  return run_backward(d, t, workspace, stream, &launch, &maps);
}

}  // namespace cuda
}  // namespace raggedattn

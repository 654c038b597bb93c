// Backward main kernel of the Hopper path (sm_90a): one CTA per (key tile of a segment, KV head),
// the portable backward's tile map and loop, with every product on wgmma. Warp-specialized, each
// role in its own file:
//   producer warpgroup (producer_regs registers):
//     warp 0   bwd_load.cuh       K/V once, then the Q/dO/LSE/dot(dO,O) ring (Q, dO by TMA)
//     warp 1   bwd_dq_writer.cuh  each step's dQ tile into the scratch (bulk copies; claims or
//                                 the deterministic turns), except where dQ leaves from the
//                                 consumers' registers (DQ_REGS)
//     warps 2-3 exit.
//   two consumer warpgroups (consumer_regs registers), c = 0, 1, sharing the work as
//   sm90_shapes.hpp's bwd_config and bwd_columns say: at D = 64, 128 and 192/128 (key split) each
//   owns 64 of the CTA's 128 keys and all their columns; at D = 256 (column split) both work on
//   the CTA's 64 keys and each owns half of the columns of dK, dV and dQ. The step loop is
//   bwd_consumer.cuh (scores: bwd_scores.cuh), the epilogue bwd_epilogue.cuh.
// What the roles share (shape, parameters, barriers, the CTA's work): bwd_cta.cuh. Shared-memory
// tiles use the 128-byte-swizzled panel layout of sm90_shapes.hpp (hopper.cuh).
#pragma once

#include <type_traits>

#include "cuda/sm90/bwd_consumer.cuh"
#include "cuda/sm90/bwd_cta.cuh"
#include "cuda/sm90/bwd_dq_writer.cuh"
#include "cuda/sm90/bwd_load.cuh"

namespace raggedattn {
namespace sm90 {

template <class T, int DQK, int DV, bool DQ_REGS>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_kernel(const __grid_constant__ BwdTmaParams a) {
  using S = BwdShape<T, DQK, DV, DQ_REGS>;
  const BwdParams& p = a.p;
  extern __shared__ unsigned char smem_raw[];
  BwdCta cta;
  cta.smem = aligned_smem(smem_raw);

  const int tid = threadIdx.x;
  const int wg = tid / 128;  // 0: producer; 1..consumers: consumer warpgroups
  // The CTA's key tile and KV head: the schedule's x-th entry (most work first) where the Plan made
  // one (its grid is the schedule's entries), the tile map's x-th for KV head y otherwise.
  const HeadTile at = p.schedule != nullptr
                          ? p.schedule[blockIdx.x]
                          : HeadTile{p.kv_tiles.locate(blockIdx.x, p.segs.cu_kv), int(blockIdx.y)};
  cta.tc = at.tc;
  if (cta.tc.segment < 0) return;
  cta.b = cta.tc.segment;
  cta.hk = at.head;
  cta.w = gpu::key_tile_work<S::BM, S::BN>(p, cta.tc);
  cta.bars = BwdBarriers::at<S>(cta.smem);
  if (tid == 0) cta.bars.init<S>();
  __syncthreads();  // barriers initialized before anyone arrives or waits

  if (wg == 0) {
    regs_dealloc<S::C.producer_regs>();
    const int warp = tid / 32, lane = tid % 32;
    if (warp == 0) {
      bwd_load_warp<S>(a, cta, lane);
    } else if (!DQ_REGS && warp == 1 && lane == 0) {
      bwd_dq_writer<S>(p, cta);
    }
    return;
  }
  regs_alloc<S::C.consumer_regs>();
  const BwdConsumer me = BwdConsumer::make<S>(cta.smem, tid, wg);
  // Both consumers have the same widths (bwd_columns_ok): one instantiation of the loop.
  constexpr BwdColumns widths = bwd_columns(DQK, DV, 0);
  const BwdColumns mine = bwd_columns(DQK, DV, me.c);
  bwd_consumer<S, widths.dkn, widths.dvn, widths.dqn>(p, cta, me, mine.dk0, mine.dv0, mine.dq0);
}

}  // namespace sm90
}  // namespace raggedattn

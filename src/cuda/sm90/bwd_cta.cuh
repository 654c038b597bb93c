// What every role of the Hopper backward kernel shares: its compile-time shape (BwdShape), its
// parameters (BwdTmaParams), the CTA's work item and its mbarriers (BwdCta). The roles:
// bwd_load.cuh (producer warp 0), bwd_dq_writer.cuh (producer warp 1), bwd_consumer.cuh (the two
// consumer warpgroups' loop), bwd_epilogue.cuh (dK and dV out); bwd_kernel.cuh assembles them.
#pragma once

#include <cstdint>

#include "core/sm90_shapes.hpp"
#include "cuda/common/bwd_work.cuh"
#include "cuda/sm90/hopper.cuh"

namespace raggedattn {
namespace sm90 {

using gpu::BwdParams;

// The kernel's parameters: the shared backward parameters and the TMA maps (tensor_map.hpp).
struct BwdTmaParams {
  BwdParams p;
  CUtensorMap q_map, do_map;  // boxes of block_m rows
  CUtensorMap k_map, v_map;   // boxes of block_n rows
};

// The kernel's compile-time shape at head dims DQK / DV (sm90_shapes.hpp), the way its dQ goes
// (DQ_REGS: from the consumers' registers into a 16-bit scratch, not through the shared dQ tile
// and warp 1) and element type T.
template <class T_, int DQK_, int DV_, bool DQ_REGS_>
struct BwdShape {
  using T = T_;
  using Mma = gpu::MmaType<T>;
  static constexpr int DQK = DQK_, DV = DV_;
  static constexpr bool DQ_REGS = DQ_REGS_;
  static constexpr BwdConfig C = bwd_config(DQK, DV, DQ_REGS);
  static constexpr bool SPLIT = bwd_column_split(DQK, DV);  // the consumers split columns, not keys
  // S^T, then P^T packed, then dP^T (not both score products in flight): where a consumer's dK
  // and dV accumulators leave no room for both (key split at Dqk 192: 160 registers).
  static constexpr bool kScoresInTurn = bwd_scores_in_turn(DQK, DV);
  static constexpr int BM = C.block_m, BN = C.block_n;
  static constexpr int QSTEPS = BM / 16;  // k16 steps over the step's queries (dV, dK)
  static constexpr int NSTEPS = BN / 16;  // k16 steps over the CTA's keys (dQ)
  static constexpr int PANEL = 64;        // 16-bit elements per 128-byte panel row
  static constexpr BwdSmem L = bwd_smem(DQK, DV, DQ_REGS);
  static constexpr int STAGES = C.stages;
  static constexpr int kConsumerThreads = 128 * C.consumers;
  // One dS^T buffer for both consumers (key split at Dqk 192, bwd_ds_buffers): each waits for the
  // other's dQ of the previous step before writing it (bwd_consumer.cuh's DsHandOff).
  static constexpr bool kOneDsBuffer = !SPLIT && L.ds_buffers == 1;
  // Where the accumulators take most of the register file (the column split, scores in turn), the
  // consumers derive their stmatrix and dQ addresses from the lane anew at every step: hoisted out
  // of the step loop, the addresses spill. Elsewhere hoisting them costs nothing and saves the
  // step their arithmetic.
  static constexpr bool kAddressesPerStep = SPLIT || kScoresInTurn;
  // The step's products in the order dV, dQ, dK (D = 128): the consumer writes its dQ slice out
  // while its dK runs on the tensor core. Elsewhere dV and dK land before dQ is issued: under the
  // column split (up to 128 columns of dQ) their operands die first, so dQ's accumulators do not
  // add to the live registers, and at D = 64 (32 columns) the slice is short.
  static constexpr bool kDkAfterDq = !SPLIT && DQK == 128;
  // Consumer c's columns of the dQ tile are one contiguous slice of it (the tile is panel-major,
  // DqAccumLayout::fragment_index), written and reduced apart from the other's.
  static constexpr int kDqSliceCols = bwd_columns(DQK, DV, 0).dqn;
  static_assert(C.consumers == 2 && bwd_columns(DQK, DV, 1).dq0 == kDqSliceCols,
                "consumer c's dQ columns start at c slices");
  static_assert(!DQ_REGS || SPLIT, "dQ from registers: the column split's kernel only");
  static_assert(bwd_supports(DQK, DV), "the head dims of bwd_columns");
  static_assert(BM == PANEL, "dS^T rows are one panel: the dQ product reads them M-major");
  static_assert(BM == DqAccumLayout::kTileRows, "a query step's dQ is one tile of the scratch");
  static_assert(SPLIT || L.ds_buffers == 1 || L.ds_buffers == 2, "key split: one or two dS^T");
};

// The byte offset of a column in a [rows][dim] panel-major tile of `rows` rows (64 columns per
// panel).
__device__ __forceinline__ uint32_t col_offset(int col, int rows) {
  return uint32_t((col / 64) * rows * kSwizzleBytes + (col % 64) * 2);
}

// The CTA's mbarriers, in the shared memory's barrier region (bwd_barriers).
struct BwdBarriers {
  uint64_t* kv_full;   // K and V have landed (warp 0's 32 arrivals)
  uint64_t* full;      // [STAGES]: a Q/dO stage has landed (warp 0's 32 arrivals)
  uint64_t* empty;     // [STAGES]: both consumers are done with a stage
  uint64_t* dq_full;   // [consumers]: consumer c wrote its slice of the step's dQ tile
  uint64_t* dq_empty;  // [consumers]: warp 1 has read slice c out
  uint64_t* partial;   // warp 0: a partial tile's TMA boxes have landed

  template <class S>
  __device__ __forceinline__ static BwdBarriers at(unsigned char* smem) {
    BwdBarriers bars;
    bars.kv_full = reinterpret_cast<uint64_t*>(smem + S::L.bars);
    bars.full = bars.kv_full + 1;
    bars.empty = bars.full + S::STAGES;
    bars.dq_full = bars.empty + S::STAGES;
    bars.dq_empty = bars.dq_full + S::C.consumers;
    bars.partial = bars.dq_empty + S::C.consumers;
    return bars;
  }
  // By thread 0, before the CTA's __syncthreads.
  template <class S>
  __device__ __forceinline__ void init() const {
    mbar_init(kv_full, 32);
    for (int s = 0; s < S::STAGES; ++s) {
      mbar_init(&full[s], 32);
      mbar_init(&empty[s], S::kConsumerThreads);
    }
    for (int c = 0; c < S::C.consumers; ++c) {
      mbar_init(&dq_full[c], 128);
      mbar_init(&dq_empty[c], 1);
    }
    mbar_init(partial, 1);
  }
};

// The CTA's work: its key tile of segment b for KV head hk, the query steps it streams (w: every
// role counts them through w.next_step), its shared memory and barriers.
struct BwdCta {
  unsigned char* smem;
  TileCoord tc;
  int b, hk;
  gpu::KeyTileWork w;
  BwdBarriers bars;
};

}  // namespace sm90
}  // namespace raggedattn

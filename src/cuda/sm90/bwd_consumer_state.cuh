// One consumer warpgroup of the Hopper backward: who it is and where its operands are.
#pragma once

#include <cstdint>

#include "cuda/sm90/bwd_cta.cuh"

namespace raggedattn {
namespace sm90 {

struct BwdConsumer {
  int tid, lane;
  int c;           // the consumer's index, 0 or 1
  int warp_in_wg;  // this warp in the warpgroup
  int key0;        // the warpgroup's first key row in the CTA tile (0 under the column split)
  int row_a;       // this thread's key rows: row_a and row_a + 8 (the wgmma accumulator layout)
  uint32_t k_addr, v_addr, q_addr, do_addr, ds_addr;  // the tiles' shared-memory addresses

  // The consumer's index is read through a shuffle from lane 0, so that the compiler knows it is
  // warp-uniform: what derives from it (the warpgroup's keys and columns, so its operand
  // descriptors) stays in uniform registers, where the wgmmas read their descriptors.
  template <class S>
  __device__ __forceinline__ static BwdConsumer make(unsigned char* smem, int tid, int wg) {
    BwdConsumer me;
    me.tid = tid;
    me.lane = tid % 32;
    me.c = __shfl_sync(0xffffffffu, wg - 1, 0);
    me.warp_in_wg = (tid % 128) / 32;
    me.k_addr = gpu::smem_addr(smem + S::L.k);
    me.v_addr = gpu::smem_addr(smem + S::L.v);
    me.q_addr = gpu::smem_addr(smem + S::L.q);
    me.do_addr = gpu::smem_addr(smem + S::L.d_o);
    me.ds_addr = gpu::smem_addr(smem + S::L.ds);
    me.key0 = S::SPLIT ? 0 : me.c * 64;
    me.row_a = me.key0 + me.warp_in_wg * 16 + me.lane / 4;
    return me;
  }
  // The key row this lane addresses in an x4 stmatrix over the warp's 16 key rows (lane l gives
  // row l % 8 of 8x8 tile l / 8; tiles 1 and 3 hold rows 8-15): dS^T's rows and the epilogue's.
  // Computed where it is used: kept live across the step loop, it raises the spills.
  __device__ __forceinline__ int stmatrix_row() const {
    return key0 + warp_in_wg * 16 + lane % 8 + 8 * ((lane / 8) % 2);
  }
};

}  // namespace sm90
}  // namespace raggedattn

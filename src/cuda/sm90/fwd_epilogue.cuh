// The Hopper forward's epilogue, one consumer warpgroup's: its rows' LSE in natural log, and O
// normalized, stored straight from the accumulator or staged in shared memory (fwd_consume copies
// the staged rows out: that loop, as a function of its own, compiles differently).
#pragma once

#include <cstdint>

#include "cuda/common/math.cuh"
#include "cuda/common/warp.cuh"
#include "cuda/sm90/hopper.cuh"

namespace raggedattn {
namespace sm90 {

// This thread's two rows (row_a and row_a + 8 of the tile, `rows` of them inside the segment):
// their LSE, written by the quad's first lane, and the factor their O is scaled by.
__device__ __forceinline__ void finish_rows(const float (&row_max)[2], const float (&row_sum)[2],
                                            float sink2, float* lse, int rows, int row_a, int lane,
                                            float (&inv)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const gpu::RowScale fin = gpu::finish_row(row_max[half], gpu::quad_sum(row_sum[half]), sink2);
    inv[half] = fin.inv;
    const int r = row_a + 8 * half;
    if (r < rows && lane % 4 == 0) lse[r] = fin.lse;
  }
}

// O scaled by inv and stored from the accumulator layout: 4-byte pieces of eight rows per
// instruction.
template <class T, int DV>
__device__ __forceinline__ void store_o_direct(const float (&acc_o)[DV / 8][4],
                                               const float (&inv)[2], T* o, int64_t o_stride,
                                               int rows, int row_a, int lane) {
  using Mma = gpu::MmaType<T>;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row_a + 8 * half;
    if (r < rows) {
      T* orow = o + r * o_stride + 2 * (lane % 4);
#pragma unroll
      for (int f = 0; f < DV / 8; ++f) {
        *reinterpret_cast<uint32_t*>(orow + f * 8) =
            Mma::pack(acc_o[f][2 * half] * inv[half], acc_o[f][2 * half + 1] * inv[half]);
      }
    }
  }
}

// O scaled by inv, staged in consumer cw's 64 rows of the BM-row Q buffer at q_addr by stmatrix
// .x4 of fragments f and f + 1, both row halves: lanes 8i .. 8i + 7 address tile i's rows (tile i:
// fragment f + i / 2, rows 8 (i % 2) onwards of the warp's 16). The other consumer reads only its
// own rows, and the panels are the Q tile's swizzled ones, so these writes and the 16-byte row
// reads that store the rows (fwd_consume) are free of bank conflicts.
template <class T, int BM, int DV>
__device__ __forceinline__ void stage_o(const float (&acc_o)[DV / 8][4], const float (&inv)[2],
                                        uint32_t q_addr, int cw, int warp_in_wg, int lane) {
  using Mma = gpu::MmaType<T>;
  const int tile = lane / 8;
  const int srow = cw * 64 + warp_in_wg * 16 + (tile % 2) * 8 + lane % 8;
#pragma unroll
  for (int f = 0; f < DV / 8; f += 2) {
    const uint32_t r4[4] = {Mma::pack(acc_o[f][0] * inv[0], acc_o[f][1] * inv[0]),
                            Mma::pack(acc_o[f][2] * inv[1], acc_o[f][3] * inv[1]),
                            Mma::pack(acc_o[f + 1][0] * inv[0], acc_o[f + 1][1] * inv[0]),
                            Mma::pack(acc_o[f + 1][2] * inv[1], acc_o[f + 1][3] * inv[1])};
    stmatrix_x4(q_addr + swizzled_offset(BM, srow, f + tile / 2), r4);
  }
}

}  // namespace sm90
}  // namespace raggedattn

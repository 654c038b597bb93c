// Warp-level matrix products of the portable (sm80+) kernels: mma.sync m16n8k16, its fragment
// loaders and warp tiles (the shared primitives they use: cuda/common/warp.cuh).
//
// Fragment conventions (PTX ISA, mma.m16n8k16 with .row.col), per lane l, g = l / 4, t = l % 4:
//   A (16x16, m x k): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 =
//   A[g+8][2t+8..] B (16x8,  k x n): b0 = B[2t..2t+1][g],  b1 = B[2t+8..2t+9][g] C (16x8,  m x n):
//   c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1]
// A C fragment pair covering 16 columns therefore re-packs into an A fragment without shuffles:
// that is how probabilities go from one product into the next in registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/warp.cuh"

namespace raggedattn {
namespace portable {

// c += a * b, fp32 accumulation.
template <class T>
__device__ __forceinline__ void mma_16x8x16(float c[4], const uint32_t a[4], const uint32_t b0,
                                            const uint32_t b1) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Fragment loaders. `base` points at a [rows][pitch] tile of 16-bit elements in shared memory.

// A fragment (16x16) of a row-major [m][k] tile at (m0, k0).
__device__ __forceinline__ void load_a(uint32_t a[4], const void* base, int pitch, int m0, int k0,
                                       int lane) {
  const auto* p =
      static_cast<const uint16_t*>(base) + (m0 + (lane & 15)) * pitch + k0 + (lane >> 4) * 8;
  gpu::ldmatrix_x4(a, gpu::smem_addr(p));
}
// A fragment (16x16) of A = S^T where S is stored row-major [k][m]: element A[m][k] = S[k][m].
__device__ __forceinline__ void load_a_trans(uint32_t a[4], const void* base, int pitch, int m0,
                                             int k0, int lane) {
  const int idx = lane >> 3;
  const auto* p = static_cast<const uint16_t*>(base) + (k0 + (lane & 7) + (idx >> 1) * 8) * pitch +
                  m0 + (idx & 1) * 8;
  gpu::ldmatrix_x4_trans(a, gpu::smem_addr(p));
}
// Two B fragments (k16 x n8 each, n-tiles n0 and n0+8) of B = N^T where N is stored [n][k]
// (keys for Q K^T). b[0], b[1]: n-tile n0; b[2], b[3]: n-tile n0 + 8.
__device__ __forceinline__ void load_b_nk(uint32_t b[4], const void* base, int pitch, int n0,
                                          int k0, int lane) {
  const int idx = lane >> 3;
  const auto* p = static_cast<const uint16_t*>(base) + (n0 + (lane & 7) + (idx >> 1) * 8) * pitch +
                  k0 + (idx & 1) * 8;
  gpu::ldmatrix_x4(b, gpu::smem_addr(p));
}
// Two B fragments of B stored [k][n] (V for P V). Same register order as load_b_nk.
__device__ __forceinline__ void load_b_kn(uint32_t b[4], const void* base, int pitch, int n0,
                                          int k0, int lane) {
  const int idx = lane >> 3;
  const auto* p = static_cast<const uint16_t*>(base) + (k0 + (lane & 7) + (idx & 1) * 8) * pitch +
                  n0 + (idx >> 1) * 8;
  gpu::ldmatrix_x4_trans(b, gpu::smem_addr(p));
}

// Copies rows [0, rows) of a [tokens, heads, dim] tile (head fixed) into shared memory with a
// padded pitch; rows at or past `valid` are zero-filled. All `threads` threads take part.
// Where the threads cover whole rows (THREADS a multiple of the row's 16-byte chunks, every
// supported head dim but 96 and 192), each thread owns one column chunk and every
// (THREADS / chunks)-th row: its addresses are made once and advanced by a constant, and the copy
// takes a handful of instructions per chunk instead of a division and 64-bit products per chunk.
template <int ROWS, int DIM, int THREADS, class T>
__device__ __forceinline__ void load_tile_async(void* smem, int pitch, const T* gmem_row0,
                                                int64_t token_stride, int valid, int tid) {
  constexpr int kChunksPerRow = DIM / 8;  // 16-byte chunks
  constexpr int kChunks = ROWS * kChunksPerRow;
  if constexpr (THREADS % kChunksPerRow == 0 && ROWS % (THREADS / kChunksPerRow) == 0) {
    constexpr int kRowStep = THREADS / kChunksPerRow;
    const int r0 = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
    const T* src = gmem_row0 + r0 * token_stride + col;
    uint16_t* dst = static_cast<uint16_t*>(smem) + r0 * pitch + col;
    const int64_t src_step = kRowStep * token_stride;
#pragma unroll
    for (int k = 0; k < ROWS / kRowStep; ++k) {
      const bool ok = r0 + k * kRowStep < valid;
      gpu::cp_async_16(dst + k * kRowStep * pitch, ok ? src : gmem_row0, ok);
      src += src_step;
    }
  } else {
#pragma unroll
    for (int c = tid; c < kChunks; c += THREADS) {
      const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      const bool ok = r < valid;
      const T* src = ok ? gmem_row0 + r * token_stride + col : gmem_row0;
      gpu::cp_async_16(static_cast<uint16_t*>(smem) + r * pitch + col, src, ok);
    }
  }
}

// acc[MF][NF] (a warp tile of (16 MF) x (8 NF), fp32) += A(rows m0.., k) * B(k, cols n0..) for
// k in [0, K). A is read row-major [m][k] (A_TRANS: stored [k][m]); B is stored [n][k] (B_KN:
// [k][n]). Each k step loads MF A fragments and NF/2 paired B fragments, then issues MF x NF
// tensor-core instructions: the larger the warp tile, the fewer shared-memory bytes per FLOP.
template <class T, int MF, int NF, int K, bool A_TRANS, bool B_KN>
__device__ __forceinline__ void warp_gemm(float (&acc)[MF][NF][4], const void* sA, int a_pitch,
                                          int m0, const void* sB, int b_pitch, int n0, int lane) {
  static_assert(NF % 2 == 0 && K % 16 == 0, "warp tile");
#pragma unroll
  for (int k = 0; k < K; k += 16) {
    uint32_t a[MF][4];
#pragma unroll
    for (int mf = 0; mf < MF; ++mf) {
      if constexpr (A_TRANS) {
        load_a_trans(a[mf], sA, a_pitch, m0 + mf * 16, k, lane);
      } else {
        load_a(a[mf], sA, a_pitch, m0 + mf * 16, k, lane);
      }
    }
#pragma unroll
    for (int nn = 0; nn < NF / 2; ++nn) {
      uint32_t b[4];
      if constexpr (B_KN) {
        load_b_kn(b, sB, b_pitch, n0 + nn * 16, k, lane);
      } else {
        load_b_nk(b, sB, b_pitch, n0 + nn * 16, k, lane);
      }
#pragma unroll
      for (int mf = 0; mf < MF; ++mf) {
        mma_16x8x16<T>(acc[mf][2 * nn], a[mf], b[0], b[1]);
        mma_16x8x16<T>(acc[mf][2 * nn + 1], a[mf], b[2], b[3]);
      }
    }
  }
}

template <int MF, int NF>
__device__ __forceinline__ void zero(float (&acc)[MF][NF][4]) {
#pragma unroll
  for (int mf = 0; mf < MF; ++mf)
#pragma unroll
    for (int f = 0; f < NF; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mf][f][e] = 0.f;
}

}  // namespace portable
}  // namespace raggedattn

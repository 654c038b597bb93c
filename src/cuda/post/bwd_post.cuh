// The backward's small kernels around the main one:
//   dot_do_o    D[h, row] = sum_d dO * O in fp32 (the softmax-gradient row term);
//   dq_convert  dQ = scale * (sum over splits of the scratch), read at DqAccumLayout::at — the
//               same function, from the same Plan object, the main kernel wrote through (in
//               either tile order).
// Both walk the rows of every segment with the ragged tile map (kPostRows rows per CTA).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/dq_accum_layout.hpp"
#include "core/segments.hpp"
#include "core/tile_map.hpp"

namespace raggedattn {
namespace post {

constexpr int kPostRows = 32;
constexpr int kPostThreads = 256;

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float(float x) {
  return __float2half_rn(x);
}

struct DotParams {
  const void* o;
  const void* d_o;
  float* dpsum;
  SegmentArrays segs;
  TensorLayout o_layout, do_layout;
  RowStatLayout stats;
  RaggedTiles tiles;  // kPostRows rows
  int dv;
};

// One warp per row, 16 bytes of O and dO per lane and load (lanes past the row's 16-byte chunks
// idle); grid (tiles, heads).
template <class T>
__global__ void __launch_bounds__(kPostThreads)
    dot_do_o_kernel(const __grid_constant__ DotParams p) {
  const TileCoord tc = p.tiles.locate(blockIdx.x, p.segs.cu_q);
  if (tc.segment < 0) return;
  const Segment seg = p.segs.get(tc.segment);
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = tc.tile * kPostRows + warp; r < min((tc.tile + 1) * kPostRows, seg.len_q);
       r += kPostThreads / 32) {
    const int64_t row = seg.q_row0 + r;
    const T* o = static_cast<const T*>(p.o) + p.o_layout.offset(row, h);
    const T* d_o = static_cast<const T*>(p.d_o) + p.do_layout.offset(row, h);
    float sum = 0.f;
    for (int c = lane * 8; c < p.dv; c += 256) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o + c);
      const uint4 dv = *reinterpret_cast<const uint4*>(d_o + c);
      const T* oe = reinterpret_cast<const T*>(&ov);
      const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += to_float(oe[e]) * to_float(de[e]);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) p.dpsum[p.stats.offset(h, row)] = sum;
  }
}

// acc[2q], acc[2q + 1] += the pair of columns (col + 2q, col + 2q + 1) of row r, for q < 4: in
// either tile order of DqAccumLayout a pair is two adjacent elements (8 bytes in fp32, 4 in 16
// bits), and in row order the four pairs are adjacent too.
__device__ __forceinline__ void add_pair(float* acc, const float* src) {
  const float2 x = *reinterpret_cast<const float2*>(src);
  acc[0] += x.x;
  acc[1] += x.y;
}
template <class E>
struct alignas(2 * sizeof(E)) Pair {
  E x, y;
};
template <class E>
__device__ __forceinline__ void add_pair(float* acc, const E* src) {
  const Pair<E> x = *reinterpret_cast<const Pair<E>*>(src);
  acc[0] += to_float(x.x);
  acc[1] += to_float(x.y);
}
// base: the (split, segment, head) slot's base (DqAccumLayout::at_from).
template <class E>
__device__ __forceinline__ void add_8(float (&acc)[8], const E* accum, const DqAccumLayout& l,
                                      int64_t base, int r, int col) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    add_pair(acc + 2 * q, accum + l.at_from(base, r, col + 2 * q));
  }
}

struct ConvertParams {
  const void* accum;
  DqAccumLayout layout;
  void* dq;
  SegmentArrays segs;
  TensorLayout dq_layout;
  RaggedTiles tiles;  // kPostRows rows
  float scale;
};

// 8 columns (16 output bytes) per thread; grid (tiles, heads).
template <class T>
__global__ void __launch_bounds__(kPostThreads)
    dq_convert_kernel(const __grid_constant__ ConvertParams p) {
  const TileCoord tc = p.tiles.locate(blockIdx.x, p.segs.cu_q);
  if (tc.segment < 0) return;
  const int b = tc.segment, h = blockIdx.y;
  const Segment seg = p.segs.get(b);
  const int r0 = tc.tile * kPostRows;
  const int rows = min(kPostRows, seg.len_q - r0);
  const int chunks = p.layout.dim / 8;
  // The slot's base once per thread (offset() divides in 64 bits), each element at_from it.
  const int64_t base0 = p.layout.offset(0, b, seg.cu_q, h, 0);
  for (int c = threadIdx.x; c < rows * chunks; c += kPostThreads) {
    const int r = r0 + c / chunks, col = (c % chunks) * 8;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int split = 0; split < p.layout.nsplits; ++split) {
      const int64_t base = split == 0 ? base0 : p.layout.offset(split, b, seg.cu_q, h, 0);
      if (p.layout.type == AccumType::F32) {
        add_8(acc, static_cast<const float*>(p.accum), p.layout, base, r, col);
      } else if (p.layout.type == AccumType::BF16) {
        add_8(acc, static_cast<const __nv_bfloat16*>(p.accum), p.layout, base, r, col);
      } else {
        add_8(acc, static_cast<const __half*>(p.accum), p.layout, base, r, col);
      }
    }
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = from_float<T>(acc[e] * p.scale);
    *reinterpret_cast<uint4*>(static_cast<T*>(p.dq) + p.dq_layout.offset(seg.q_row0 + r, h) + col) =
        out;
  }
}

}  // namespace post
}  // namespace raggedattn

// The backward's small kernels around the main one:
//   dot_do_o    D[h, row] = sum_d dO * O in fp32 (the softmax-gradient row term), and the dQ
//               scratch zeroed on the way (its whole region, split evenly over the grid's CTAs:
//               one pass of reads and writes instead of a memset's pass and then this one's);
//               With an LSE cotangent, D is lowered by it (d lse_i / d s_ij = p_ij); with sinks,
//               each CTA also leaves its rows' share of each head's d_sink;
//   sink_grad   d_sink[h] = the sum of those shares, in a fixed order;
//   dq_convert  dQ = scale * (sum over splits of the scratch), read at DqAccumLayout::at_from — the
//               same function, from the same Plan object, the main kernel wrote through (in
//               either tile order).
// Both walk the rows of every segment with the ragged tile map (kPostRows rows per CTA), each CTA
// finding its segment once with locate_cta and then taking kPostHeads query heads of its rows in
// turn (grid: post_grid).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "core/dq_accum_layout.hpp"
#include "core/segments.hpp"
#include "core/tile_map.hpp"

namespace raggedattn {
namespace post {

// A CTA's rows: one 64-row tile of DqAccumLayout's Wgmma64 order, which dq_convert reads whole.
constexpr int kPostRows = DqAccumLayout::kTileRows;
constexpr int kPostThreads = 256;
// Query heads per CTA: the segment search and the CTA's start are paid once for all of them.
constexpr int kPostHeads = 4;
// 16-byte chunks of a row at the largest head dim (256): the loops' trip bound.
constexpr int kMaxChunks = 32;

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

// RaggedTiles::locate for the whole CTA: the largest b with first(b) <= t by a kPostThreads-ary
// search, each round one probe per thread and one barrier counting the probes that pass (the
// predicate holds on a prefix of b: first() is increasing). Up to kPostThreads + 1 segments it
// takes one round of loads (the binary search took log2(batch) dependent ones, the post kernels'
// CTAs are short, and that chain was a quarter of dq_convert on many short documents), two up to
// about 65 000. Every thread of the CTA must call it, with the same t; all get the same answer.
__device__ __forceinline__ TileCoord locate_cta(const RaggedTiles& m, int64_t t,
                                                const int32_t* cu) {
  int lo = 0, hi = m.batch - 1;  // the answer lies in [lo, hi]; first(0) == 0 <= t
  while (lo < hi) {
    const int step = (hi - lo + kPostThreads - 1) / kPostThreads;
    const int b = lo + step * (int(threadIdx.x) + 1);  // probes lo + step, lo + 2 step, ...
    const bool pass = b <= hi && m.first(b, cu[b]) <= t;
    lo += step * __syncthreads_count(pass);  // the last probe that passes (lo: none did)
    hi = min(hi, lo + step - 1);             // the next probe failed or lies past hi
  }
  return m.at(lo, t, cu);
}

// The post kernels' grid for a problem: (ragged tiles of kPostRows rows, groups of kPostHeads query
// heads); the kernels read the head count from their params and skip the heads past it.
// post_tiles: BwdWorkspace::post_tiles, the Plan's count of kPostRows-row tiles (it also sizes the
// sinks' shares, one per CTA and head).
inline dim3 post_grid(int64_t post_tiles, int32_t num_heads_q) {
  return dim3(unsigned(post_tiles), unsigned(ceil_div(num_heads_q, kPostHeads)));
}

// This CTA's query heads: [first, end).
struct HeadRange {
  int first, end;
};
__device__ __forceinline__ HeadRange cta_heads(int num_heads_q) {
  const int first = int(blockIdx.y) * kPostHeads;
  return {first, min(num_heads_q, first + kPostHeads)};
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
  int num_heads_q;
  // The dQ scratch's region (BwdWorkspace::dq_accum_region) in 16-byte words, zeroed by the grid
  // before the main kernel adds into it; clear_words == 0: nothing to zero.
  uint4* clear;
  size_t clear_words;
  const float* d_lse;    // null: no LSE cotangent
  const float* lse;      // read with sinks only
  const float* sink;     // null: no sinks
  float* sink_partials;  // with sinks: [num_heads_q][gridDim.x], this grid's shares of d_sink
};

// CTA `cta` of `ctas` zeroes its contiguous share of `words` 16-byte words at `dst`.
__device__ __forceinline__ void clear_share(uint4* dst, size_t words, size_t cta, size_t ctas) {
  const EvenShare r = even_share(words, cta, ctas);
  for (size_t i = r.begin + threadIdx.x; i < r.end; i += kPostThreads) {
    dst[i] = make_uint4(0, 0, 0, 0);
  }
}

// The CTA's share of head h's d_sink: the sum of its rows' terms (threads [0, kPostRows)), by
// warp shuffles and then over the warps in order, stored at sink_partials[h][blockIdx.x].
__device__ __forceinline__ void add_sink_share(const DotParams& p, int h, float term) {
  static_assert(kPostRows % 32 == 0 && kPostRows <= kPostThreads, "rows are whole warps");
  constexpr int kRowWarps = kPostRows / 32;
  __shared__ float warp_sum[kRowWarps];
  for (int off = 16; off > 0; off /= 2) term += __shfl_xor_sync(0xffffffffu, term, off);
  const int warp = int(threadIdx.x) / 32;
  if (warp < kRowWarps && threadIdx.x % 32 == 0) warp_sum[warp] = term;
  __syncthreads();
  if (threadIdx.x == 0) {
    float share = 0.f;
    for (int w = 0; w < kRowWarps; ++w) share += warp_sum[w];
    p.sink_partials[int64_t(h) * gridDim.x + blockIdx.x] = share;
  }
  // warp_sum is next written after the next head's first barrier, which thread 0 reaches only
  // after this read.
}

// Each thread loads 16-byte chunks of O and dO, 4 of each before the first product; the chunks'
// partial sums meet in shared memory and one thread per row adds them up in column order.
template <class T>
__global__ void __launch_bounds__(kPostThreads)
    dot_do_o_kernel(const __grid_constant__ DotParams p) {
  __shared__ float part[kPostRows][kMaxChunks + 1];  // +1: conflict-free row reads
  // Every CTA clears its share, also one whose tile lies past the last segment.
  clear_share(p.clear, p.clear_words, size_t(blockIdx.y) * gridDim.x + blockIdx.x,
              size_t(gridDim.x) * gridDim.y);
  const TileCoord tc = locate_cta(p.tiles, blockIdx.x, p.segs.cu_q);
  const HeadRange heads = cta_heads(p.num_heads_q);
  if (tc.segment < 0) {  // past the last segment: its shares of d_sink are zero
    if (p.sink && threadIdx.x == 0) {
      for (int h = heads.first; h < heads.end; ++h) {
        p.sink_partials[int64_t(h) * gridDim.x + blockIdx.x] = 0.f;
      }
    }
    return;
  }
  const Segment seg = p.segs.get(tc.segment);
  const int r0 = tc.tile * kPostRows;
  const int rows = min(kPostRows, seg.len_q - r0), chunks = p.dv / 8, n = rows * chunks;
  for (int h = heads.first; h < heads.end; ++h) {
    const T* o = static_cast<const T*>(p.o) + p.o_layout.offset(seg.q_row0 + r0, h);
    const T* d_o = static_cast<const T*>(p.d_o) + p.do_layout.offset(seg.q_row0 + r0, h);
    // Groups of 4 chunks per thread (the whole tile at D <= 128): 8 loads in flight, then products.
    constexpr int kGroup = 4;
    for (int k0 = threadIdx.x; k0 < n; k0 += kGroup * kPostThreads) {
      uint4 ov[kGroup], dv[kGroup];
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        const int i = k0 + k * kPostThreads;
        if (i < n) {
          const int r = i / chunks, col = (i % chunks) * 8;
          ov[k] = *reinterpret_cast<const uint4*>(o + r * p.o_layout.token_stride + col);
          dv[k] = *reinterpret_cast<const uint4*>(d_o + r * p.do_layout.token_stride + col);
        }
      }
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        const int i = k0 + k * kPostThreads;
        if (i < n) {
          const T* oe = reinterpret_cast<const T*>(&ov[k]);
          const T* de = reinterpret_cast<const T*>(&dv[k]);
          float sum = 0.f;
#pragma unroll
          for (int e = 0; e < 8; ++e) sum += to_float(oe[e]) * to_float(de[e]);
          part[i / chunks][i % chunks] = sum;
        }
      }
    }
    __syncthreads();
    float sink_term = 0.f;
    if (int(threadIdx.x) < rows) {
      float sum = 0.f;
      for (int c = 0; c < chunks; ++c) sum += part[threadIdx.x][c];
      const int64_t stat = p.stats.offset(h, seg.q_row0 + r0 + threadIdx.x);
      if (p.d_lse) sum -= p.d_lse[stat];
      p.dpsum[stat] = sum;
      // The sink's column: its dS is p_sink * (0 - D), p_sink = exp(sink - lse).
      if (p.sink) sink_term = -expf(p.sink[h] - p.lse[stat]) * sum;
    }
    if (p.sink) add_sink_share(p, h, sink_term);
    __syncthreads();  // part is the next head's
  }
}

struct SinkGradParams {
  const float* partials;  // [heads][shares]
  int64_t shares;         // 0: no query rows, d_sink = 0
  float* d_sink;
};

// One CTA per head: d_sink[h] = the sum of the head's shares, each thread taking a fixed stride
// and the threads' sums meeting in a fixed tree, so the result is the same from run to run.
__global__ void __launch_bounds__(kPostThreads)
    sink_grad_kernel(const __grid_constant__ SinkGradParams p) {
  __shared__ float sums[kPostThreads];
  const float* row = p.partials + int64_t(blockIdx.x) * p.shares;
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < p.shares; i += kPostThreads) s += row[i];
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int half = kPostThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.d_sink[blockIdx.x] = sums[0];
}

// Adds N consecutive scratch elements (16- or 8-byte aligned) into acc.
template <int N>
__device__ __forceinline__ void add_run(float* acc, const float* src) {
#pragma unroll
  for (int q = 0; q < N / 4; ++q) {
    const float4 x = reinterpret_cast<const float4*>(src)[q];
    acc[4 * q] += x.x;
    acc[4 * q + 1] += x.y;
    acc[4 * q + 2] += x.z;
    acc[4 * q + 3] += x.w;
  }
}
template <int N, class E>
__device__ __forceinline__ void add_run(float* acc, const E* src) {
  using Vec = std::conditional_t<N == 8, uint4, uint2>;
  static_assert(N * sizeof(E) == sizeof(Vec), "one vector load");
  const Vec x = *reinterpret_cast<const Vec*>(src);
  const E* e = reinterpret_cast<const E*>(&x);
#pragma unroll
  for (int q = 0; q < N; ++q) acc[q] += to_float(e[q]);
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  const T x[2] = {from_float<T>(a), from_float<T>(b)};
  return *reinterpret_cast<const uint32_t*>(x);
}

struct ConvertParams {
  const void* accum;
  // BwdWorkspace::dq_claims, or null: a tile whose claim is 0 was written by no key tile, and its
  // dQ is zero (the scratch there was never cleared).
  const int32_t* claims;
  DqAccumLayout layout;
  void* dq;
  SegmentArrays segs;
  TensorLayout dq_layout;
  RaggedTiles tiles;  // kPostRows rows
  float scale;
  int num_heads_q;
};

// dQ of one 64-row tile and head. Every element is read at DqAccumLayout::at_from of its slot's
// base, as the main kernel wrote it: in Wgmma64 order the tile is contiguous and the thread reads
// it vector by vector (vector v at 4 v: rows vector_row, + 8 and columns vector_col, + 1 of panel
// v / 128), whole 16-byte loads in fp32, and the tile goes out through shared memory in 16-byte
// row chunks; in Rows order, 8 columns of a row per load and store.
template <class T, class E>
__device__ __forceinline__ void convert_tile(const ConvertParams& p, int b, const Segment& seg,
                                             int h, int r0, int rows, uint32_t* staged) {
  const DqAccumLayout& l = p.layout;
  const E* accum = static_cast<const E*>(p.accum);
  T* dq = static_cast<T*>(p.dq) + p.dq_layout.offset(seg.q_row0 + r0, h);
  const int64_t stride = p.dq_layout.token_stride;
  // Groups of loads (8 vectors, or 4 row chunks: 128 bytes of fp32 per thread) issued before the
  // first store; at D = 128 a thread's whole share of the tile is one group.
  if (l.order == DqTileOrder::Wgmma64) {
    // The converted tile in row order in shared memory (each vector's two pairs land in two rows),
    // then stored 16 bytes per row chunk. Row pitch: dim / 2 words + 4, so a warp's pair writes
    // (8 rows x 4 columns of a panel) hit 32 banks and every row stays 16-byte aligned.
    const int pitch = l.dim / 2 + 4;
    constexpr int kGroup = 8;
    const int n = kPostRows * l.dim / 4;  // vectors of the tile
    for (int v0 = threadIdx.x; v0 < n; v0 += kGroup * kPostThreads) {
      float acc[kGroup][4] = {};
      for (int split = 0; split < l.nsplits; ++split) {
        const int64_t tile = l.at_from(l.offset(split, b, seg.cu_q, h, 0), r0, 0);
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const int v = v0 + k * kPostThreads;
          if (v < n) add_run<4>(acc[k], accum + tile + 4 * v);
        }
      }
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        const int v = v0 + k * kPostThreads;
        const int u = v % 128, r = DqAccumLayout::vector_row(u);
        const int c = 8 * (v / 128) + DqAccumLayout::vector_col(u);
        if (v < n) {
          staged[r * pitch + c / 2] = pack2<T>(acc[k][0] * p.scale, acc[k][1] * p.scale);
          staged[(r + 8) * pitch + c / 2] = pack2<T>(acc[k][2] * p.scale, acc[k][3] * p.scale);
        }
      }
    }
    __syncthreads();
    const int chunks = l.dim / 8;
    for (int i = threadIdx.x; i < rows * chunks; i += kPostThreads) {
      const int r = i / chunks, ch = i % chunks;
      *reinterpret_cast<uint4*>(dq + r * stride + ch * 8) =
          *reinterpret_cast<const uint4*>(staged + r * pitch + ch * 4);
    }
  } else {
    constexpr int kGroup = 4;
    const int chunks = l.dim / 8, n = rows * chunks;
    for (int i0 = threadIdx.x; i0 < n; i0 += kGroup * kPostThreads) {
      float acc[kGroup][8] = {};
      for (int split = 0; split < l.nsplits; ++split) {
        const int64_t base = l.offset(split, b, seg.cu_q, h, 0);
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const int i = i0 + k * kPostThreads;
          if (i < n) {
            add_run<8>(acc[k], accum + l.at_from(base, r0 + i / chunks, (i % chunks) * 8));
          }
        }
      }
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        const int i = i0 + k * kPostThreads;
        if (i < n) {
          uint4 out;
          T* o = reinterpret_cast<T*>(&out);
#pragma unroll
          for (int e = 0; e < 8; ++e) o[e] = from_float<T>(acc[k][e] * p.scale);
          *reinterpret_cast<uint4*>(dq + (i / chunks) * stride + (i % chunks) * 8) = out;
        }
      }
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kPostThreads)
    dq_convert_kernel(const __grid_constant__ ConvertParams p) {
  const TileCoord tc = locate_cta(p.tiles, blockIdx.x, p.segs.cu_q);
  if (tc.segment < 0) return;
  const Segment seg = p.segs.get(tc.segment);
  const int r0 = tc.tile * kPostRows, rows = min(kPostRows, seg.len_q - r0);
  // Wgmma64's staged tile: 64 rows of up to 8 * kMaxChunks 16-bit columns, pitch + 4 words.
  __shared__ __align__(16) uint32_t staged[kPostRows * (kMaxChunks * 4 + 4)];
  const HeadRange heads = cta_heads(p.num_heads_q);
  for (int h = heads.first; h < heads.end; ++h) {
    if (p.claims != nullptr) {
      // Claimed tiles are Wgmma64's (the Plan's): this CTA's rows are one tile of the scratch.
      const DqAccumLayout& l = p.layout;
      const int64_t tile = l.tile_of(l.offset(0, tc.segment, seg.cu_q, h, r0));
      if (p.claims[tile] == 0) {  // no key tile wrote it: dQ = 0
        T* dq = static_cast<T*>(p.dq) + p.dq_layout.offset(seg.q_row0 + r0, h);
        const int chunks = l.dim / 8;
        for (int i = threadIdx.x; i < rows * chunks; i += kPostThreads) {
          *reinterpret_cast<uint4*>(dq + (i / chunks) * p.dq_layout.token_stride +
                                    (i % chunks) * 8) = make_uint4(0u, 0u, 0u, 0u);
        }
        continue;  // the same for every thread: one tile, one head
      }
    }
    if (p.layout.type == AccumType::F32) {
      convert_tile<T, float>(p, tc.segment, seg, h, r0, rows, staged);
    } else if (p.layout.type == AccumType::BF16) {
      convert_tile<T, __nv_bfloat16>(p, tc.segment, seg, h, r0, rows, staged);
    } else {
      convert_tile<T, __half>(p, tc.segment, seg, h, r0, rows, staged);
    }
    __syncthreads();  // staged is the next head's
  }
}

}  // namespace post
}  // namespace raggedattn

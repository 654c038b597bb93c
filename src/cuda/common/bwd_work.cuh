// Device pieces of the backward main kernels: for both, the work of one key tile and the
// deterministic mode's lock per dQ tile; the dQ scratch additions through the Plan's
// DqAccumLayout (the portable kernel; the Hopper kernel copies whole tiles out); for the Hopper
// kernel, the score-gradient pieces and the mask of one key row. The portable kernel keeps that
// math and the turn-taking written inline in its loop, where the compiler schedules them better
// than through these helpers.
#pragma once

#include <type_traits>

#include "cuda/common/math.cuh"
#include "cuda/common/params.hpp"
#include "cuda/common/warp.cuh"

namespace raggedattn {
namespace gpu {

// What one backward CTA covers: key tile tc of its segment (for one KV head), and the query tiles
// of BM rows that see any of its keys, [m_first, m_first + m_count), for each of the GQA group's
// query heads (in the order query_tile(0), query_tile(1), ...): steps = m_count * group.
struct KeyTileWork {
  Segment seg;
  int n0, keys;
  int m_first, m_count, steps;
  int m_rot;  // step qt of a query head is query tile query_tile(qt) (MaskSpec::query_rotation)
  __device__ __forceinline__ int query_tile(int qt) const {
    return MaskSpec::rotated_tile(TileSpan{m_first, m_count}, m_rot, qt);
  }
  // The next step's (tile, head) counted, not divided: qt from the rotation m_rot on, wrapping
  // at m_count; the head qh moves on when qt is back at m_rot. Every loop over a CTA's steps
  // counts through this one helper, so its producers and consumers agree step by step.
  __device__ __forceinline__ void next_step(int& qt, int& qh) const {
    qt = qt + 1 == m_count ? 0 : qt + 1;
    qh += qt == m_rot;
  }
};
template <int BM, int BN>
__device__ __forceinline__ KeyTileWork key_tile_work(const BwdParams& p, const TileCoord& tc) {
  KeyTileWork w;
  w.seg = p.segs.get(tc.segment);
  w.n0 = tc.tile * BN;
  w.keys = min(BN, w.seg.len_kv - w.n0);
  const TileSpan q = p.mask.query_tiles(w.n0, w.keys, BM, w.seg.len_q, w.seg.len_kv);
  w.m_first = q.first;
  w.m_count = q.count;
  w.steps = w.m_count * p.group;
  w.m_rot = MaskSpec::query_rotation(q, tc.tile, BM, w.seg.len_q, p.locks != nullptr);
  return w;
}

// The query rows that see key j of a segment: [lo, hi), empty for rows past the segment's keys.
struct KeyRowMask {
  int lo, hi;
  __device__ __forceinline__ bool sees(int i) const { return i >= lo && i < hi; }
};
__device__ __forceinline__ KeyRowMask key_row_mask(const MaskSpec& m, int j, const Segment& seg) {
  if (j >= seg.len_kv) return {0, 0};
  return {m.query_begin(j, seg.len_q, seg.len_kv), m.query_end(j, seg.len_q, seg.len_kv)};
}

// The soft cap's pieces of the score gradient, for kernels that split it in passes (the Hopper
// kernel computes P while dP is in flight; without a cap it needs none: P = exp2(x * scale *
// log2(e) - lse2)): t = tanh(x * scale / cap), P = exp2(t * cap * log2(e) - lse2), and the chain
// rule brings tanh' = 1 - t^2 into dS.
__device__ __forceinline__ float capped_tanh(const BwdParams& p, float x) {
  return fast_tanh(x * (p.scale / p.softcap));
}
__device__ __forceinline__ float capped_prob(const BwdParams& p, float t, float lse2,
                                             bool visible) {
  return visible ? fast_exp2(t * (p.softcap * kLog2e) - lse2) : 0.f;
}

__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) {
  return __bfloat1622float2(v);
}
__device__ __forceinline__ float2 to_float2(__half2 v) {
  return __half22float2(v);
}
template <class Pair>
__device__ __forceinline__ Pair from_float2(float x, float y);
template <>
__device__ __forceinline__ __nv_bfloat162 from_float2(float x, float y) {
  return __floats2bfloat162_rn(x, y);
}
template <>
__device__ __forceinline__ __half2 from_float2(float x, float y) {
  return __floats2half2_rn(x, y);
}

template <class Pair, bool kOrdered, int NF, class Elem>
__device__ __forceinline__ void add_16bit_pairs(Elem* base, const float (&dq)[NF][4], int half) {
  Pair* dst = reinterpret_cast<Pair*>(base);
#pragma unroll
  for (int f = 0; f < NF; ++f) {
    Pair* d = dst + f * 4;
    if constexpr (kOrdered) {
      const unsigned int raw = __ldcg(reinterpret_cast<const unsigned int*>(d));
      const float2 cur = to_float2(*reinterpret_cast<const Pair*>(&raw));
      *d = from_float2<Pair>(cur.x + dq[f][2 * half], cur.y + dq[f][2 * half + 1]);
    } else {
      atomicAdd(d, from_float2<Pair>(dq[f][2 * half], dq[f][2 * half + 1]));
    }
  }
}

// Adds one fragment row (columns 8f, 8f + 1 for every f from `dst`, the row's first column of the
// thread in the scratch at the Plan's DqAccumLayout offset: the mma.sync and wgmma accumulator
// layout) of a dQ tile into the scratch. kF32: the fp32 scratch, else the 16-bit one, always in
// the input's own format (the Plan's AccumType), so a kernel instance for T compiles two element
// types, not three. kOrdered: deterministic mode, where the CTA holds the tile's turn, so a plain
// read-modify-write is race free (__ldcg skips a possibly stale L1); else atomic adds.
template <class T, bool kF32, bool kOrdered, int NF, class Elem>
__device__ __forceinline__ void add_dq_fragments(Elem* dst, const float (&dq)[NF][4], int half) {
  if constexpr (kF32) {
    static_assert(std::is_same<Elem, float>::value, "the fp32 scratch");
#pragma unroll
    for (int f = 0; f < NF; ++f) {
      const float x = dq[f][2 * half], y = dq[f][2 * half + 1];
      float* d = dst + f * 8;
      if constexpr (kOrdered) {
        const float2 cur = __ldcg(reinterpret_cast<const float2*>(d));
        *reinterpret_cast<float2*>(d) = make_float2(cur.x + x, cur.y + y);
      } else {
#if __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float2*>(d), make_float2(x, y));
#else
        atomicAdd(d, x);
        atomicAdd(d + 1, y);
#endif
      }
    }
  } else {
    static_assert(std::is_same<Elem, T>::value, "the 16-bit scratch is in the input's format");
    add_16bit_pairs<typename MmaType<T>::Pair, kOrdered>(dst, dq, half);
  }
}

// Deterministic mode: the lock of the dQ tile of BM query rows from query tile m_tile of segment b,
// head h, where the key tiles that add into it take their turns (MaskSpec::key_tile_turn). One
// int32 per (query tile of the ragged map, query head): plan_bwd_workspace sizes
// BwdWorkspace::locks from the same tile count.
template <int BM>
__device__ __forceinline__ int32_t* dq_tile_lock(const BwdParams& p, int b, const Segment& seg,
                                                 int h, int m_tile) {
  return p.locks + (RaggedTiles{BM, p.kv_tiles.batch}.first(b, seg.cu_q) + m_tile) * p.heads_q + h;
}

}  // namespace gpu
}  // namespace raggedattn

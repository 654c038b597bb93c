// The portable backward's step, after the score products: P^T = exp(S^T - LSE) and
// dS^T = P^T (dP^T - D) (times tanh' under a soft cap) of one warp's [S_KW keys x S_QW queries],
// stored into shared memory as [key][query] for the products that follow.
#pragma once

#include <cmath>

#include "cuda/portable/bwd_shape.cuh"

namespace raggedattn {
namespace portable {

// Where a step's scores come from and go: the stage's row statistics, the P^T and dS^T tiles and
// their pitch, and the step's first query and the CTA's first key within the segment.
template <class T>
struct ScoreTiles {
  const float* s_lse;
  const float* s_dp;
  T* sPT;
  T* sdST;
  int s_pitch;
  int m0, n0;
};

// Query columns outermost: each column pair's row statistics are read from shared memory once and
// live only for that pair's scores (held for every pair across the phase, they made the kernel
// spill at D = 96 and 128, where the phase is its register peak). The soft cap and the mask are
// template choices (no test per element): a step the mask leaves whole takes the exponentials
// alone; a masked one selects the exponent (ex2(-inf) = 0) rather than the result, so no element
// takes a branch either way.
template <class W, bool kSoftcap, bool kMasked>
__device__ __forceinline__ void score_tile(const gpu::BwdParams& p, const Segment& seg,
                                           const BwdWarpOrigin& o,
                                           const ScoreTiles<typename W::T>& t, int lane,
                                           const float (&st)[W::S_MF][W::S_NF][4],
                                           const float (&dpt)[W::S_MF][W::S_NF][4]) {
  using Mma = typename W::Mma;
#pragma unroll
  for (int f = 0; f < W::S_NF; ++f) {
    const int qc0 = o.s_q0 + f * 8 + 2 * (lane % 4);  // this thread's two query columns
    const float2 lse = *reinterpret_cast<const float2*>(t.s_lse + qc0);
    const float2 dsum = *reinterpret_cast<const float2*>(t.s_dp + qc0);
    const float lse2[2] = {lse.x * gpu::kLog2e, lse.y * gpu::kLog2e}, dsm[2] = {dsum.x, dsum.y};
#pragma unroll
    for (int mf = 0; mf < W::S_MF; ++mf)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int kr = o.s_key0 + mf * 16 + lane / 4 + 8 * half;  // key row in the tile
        const int j = t.n0 + kr;
        float pr[2], ds[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float x = st[mf][f][2 * half + e], dtanh = 1.f;
          if constexpr (kSoftcap) {
            const float th = gpu::fast_tanh(x * (p.scale / p.softcap));
            x = th * (p.softcap * gpu::kLog2e);
            dtanh = 1.f - th * th;
          } else {
            x *= p.scale_log2;
          }
          x -= lse2[e];
          if constexpr (kMasked) {
            // Key j sees queries [query_begin(j), query_end(j)).
            const int i = t.m0 + qc0 + e;
            x = j < seg.len_kv && i >= p.mask.query_begin(j, seg.len_q, seg.len_kv) &&
                        i < p.mask.query_end(j, seg.len_q, seg.len_kv)
                    ? x
                    : -INFINITY;
          }
          pr[e] = gpu::fast_exp2(x);
          ds[e] = pr[e] * (dpt[mf][f][2 * half + e] - dsm[e]) * dtanh;
        }
        *reinterpret_cast<uint32_t*>(t.sPT + kr * t.s_pitch + qc0) = Mma::pack(pr[0], pr[1]);
        *reinterpret_cast<uint32_t*>(t.sdST + kr * t.s_pitch + qc0) = Mma::pack(ds[0], ds[1]);
      }
  }
}

// The step's variant: the soft cap's (masked: right for whole steps too), a whole step's, or a
// masked one's.
template <class W>
__device__ __forceinline__ void scores_to_smem(const gpu::BwdParams& p, const Segment& seg,
                                               const BwdWarpOrigin& o,
                                               const ScoreTiles<typename W::T>& t, bool full,
                                               int lane, const float (&st)[W::S_MF][W::S_NF][4],
                                               const float (&dpt)[W::S_MF][W::S_NF][4]) {
  if (p.softcap > 0.f) {
    score_tile<W, true, true>(p, seg, o, t, lane, st, dpt);
  } else if (full) {
    score_tile<W, false, false>(p, seg, o, t, lane, st, dpt);
  } else {
    score_tile<W, false, true>(p, seg, o, t, lane, st, dpt);
  }
}

}  // namespace portable
}  // namespace raggedattn

// The Hopper backward's score step, in a consumer warpgroup: S^T = K_c Q^T and dP^T = V_c dO^T on
// wgmma, then P^T and dS^T = w (dP^T - dot(dO, O)) on the registers, packed into the A operands
// of dV += P^T dO and dK += dS^T Q (w = P^T, or under a soft cap P^T (1 - t^2), t the capped
// score). Columns are queries: their statistics (LSE, dot(dO, O)) come from the stage's
// shared-memory copies, one column pair at a time.
#pragma once

#include <type_traits>

#include "cuda/sm90/bwd_cta.cuh"
#include "cuda/sm90/wgmma_ops.hpp"

namespace raggedattn {
namespace sm90 {

// One score product over the head dim, [64 keys x 64 queries], both operands K-major: `keys` and
// `queries` are the descriptors of the operands' first k-step (desc_advance), ksteps the k16
// steps (Dqk for S^T, Dv for dP^T; constants at both calls). Committed as one group.
template <class S>
__device__ __forceinline__ void issue_scores(int ksteps, float (&acc)[S::BM / 8][4], uint64_t keys,
                                             uint64_t queries) {
#pragma unroll
  for (int kk = 0; kk < ksteps; ++kk) {
    const uint32_t panel = kk / 4, within = (kk % 4) * 32;
    ss_m64n64k16<typename S::T>(acc, desc_advance(keys, panel * S::BN * kSwizzleBytes + within),
                                desc_advance(queries, panel * S::BM * kSwizzleBytes + within),
                                kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// P^T's element of a score and dS^T's factor w at it: w = P^T, or under a soft cap P^T (1 - t^2),
// t the capped score (tanh's value, which the score's register holds by then; lse2: its query's
// LSE, log2-scaled; seen: the mask shows the key to the query).
template <bool kSoftcap>
__device__ __forceinline__ float2 prob_factor(const BwdParams& p, float t, float lse2, bool seen) {
  if constexpr (kSoftcap) {
    const float pr = gpu::capped_prob(p, t, lse2, seen);
    return make_float2(pr, pr * (1.f - t * t));
  } else {
    return make_float2(t, t);
  }
}

// What one step's score phase reads: the stage's statistics, the step's first query row, whether
// the mask leaves the step's block whole, and this thread's first key row (the second is 8 on) in
// its segment.
struct ScoreStep {
  const float* s_lse;
  const float* s_dp;
  int m0;
  bool whole;
  int key_row;
  const Segment* seg;
};

// The queries this thread's two key rows see, made only for a step the mask does not leave
// whole (the same for the warpgroup).
struct RowMasks {
  gpu::KeyRowMask km[2];
  __device__ __forceinline__ RowMasks(const BwdParams& p, const ScoreStep& step) : km{} {
    if (!step.whole) {
      km[0] = gpu::key_row_mask(p.mask, step.key_row, *step.seg);
      km[1] = gpu::key_row_mask(p.mask, step.key_row + 8, *step.seg);
    }
  }
};

// P^T without a branch per element: a whole step takes the exponentials alone; another sends its
// hidden scores to exp2(-inf) = 0.
template <class S, bool kMasked>
__device__ __forceinline__ void probabilities(const BwdParams& p, const ScoreStep& step,
                                              const RowMasks& rows, float (&st)[S::BM / 8][4],
                                              int lane) {
#pragma unroll
  for (int f = 0; f < S::BM / 8; ++f) {
    const int qc = f * 8 + 2 * (lane % 4);
    const float2 lse = *reinterpret_cast<const float2*>(step.s_lse + qc);
    const float lse2[2] = {lse.x * gpu::kLog2e, lse.y * gpu::kLog2e};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = st[f][e] * p.scale_log2 - lse2[e % 2];
      if constexpr (kMasked) {
        x = rows.km[e / 2].sees(step.m0 + qc + e % 2) ? x : -INFINITY;
      }
      st[f][e] = gpu::fast_exp2(x);
    }
  }
}

// The query's LSE pair, log2-scaled, where the soft cap's probabilities need it (zeros otherwise).
template <bool kSoftcap>
__device__ __forceinline__ float2 lse2_pair(const float* s_lse, int qc) {
  float2 lse2 = make_float2(0.f, 0.f);
  if constexpr (kSoftcap) {
    lse2 = *reinterpret_cast<const float2*>(s_lse + qc);
    lse2.x *= gpu::kLog2e;
    lse2.y *= gpu::kLog2e;
  }
  return lse2;
}

// P^T and dS^T into a_p and a_ds (a[kc] holds columns 16kc .. 16kc + 15: fragment pairs 2kc and
// 2kc + 1), with dP^T in flight behind S^T: the first pass (P^T, or tanh of the scores under a
// soft cap) runs while dP^T is still in flight; the second forms dS^T once it has landed.
template <class S, bool kSoftcap>
__device__ __forceinline__ void scores_to_operands(const BwdParams& p, const ScoreStep& step,
                                                   float (&st)[S::BM / 8][4],
                                                   float (&dpt)[S::BM / 8][4],
                                                   uint32_t (&a_p)[S::QSTEPS][4],
                                                   uint32_t (&a_ds)[S::QSTEPS][4], int lane) {
  using Mma = typename S::Mma;
  wgmma_wait<1>();
  pin(st);
  const RowMasks rows(p, step);
  if constexpr (kSoftcap) {
#pragma unroll
    for (int f = 0; f < S::BM / 8; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[f][e] = gpu::capped_tanh(p, st[f][e]);
  } else if (step.whole) {
    probabilities<S, false>(p, step, rows, st, lane);
  } else {
    probabilities<S, true>(p, step, rows, st, lane);
  }
  wgmma_wait<0>();
  pin(dpt);
#pragma unroll
  for (int f = 0; f < S::BM / 8; ++f) {
    const int qc = f * 8 + 2 * (lane % 4);
    const float2 dsum = *reinterpret_cast<const float2*>(step.s_dp + qc);
    const float2 lse2 = lse2_pair<kSoftcap>(step.s_lse, qc);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float pr[2], ds[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float dp = dpt[f][2 * half + e] - (e ? dsum.y : dsum.x);
        const float2 x = prob_factor<kSoftcap>(p, st[f][2 * half + e], e ? lse2.y : lse2.x,
                                               step.whole || rows.km[half].sees(step.m0 + qc + e));
        pr[e] = x.x;
        ds[e] = x.y * dp;
      }
      a_p[f / 2][2 * (f % 2) + half] = Mma::pack(pr[0], pr[1]);
      a_ds[f / 2][2 * (f % 2) + half] = Mma::pack(ds[0], ds[1]);
    }
  }
}

// In turn (kScoresInTurn, S^T landed before the call, dP^T not yet issued): P^T packed into a_p
// first, so the scores' registers are free before dP^T is issued; under a soft cap dS^T's factor
// P^T (1 - t^2), packed in the same format into this warp's rows of this step's dS^T buffer
// (w_slot: 16 words per lane, 2 KiB, its 16 key rows), which the dS^T tile overwrites after.
template <class S, bool kSoftcap>
__device__ __forceinline__ void probabilities_in_turn(const BwdParams& p, const ScoreStep& step,
                                                      float (&st)[S::BM / 8][4],
                                                      uint32_t (&a_p)[S::QSTEPS][4],
                                                      uint32_t* w_slot, int lane) {
  using Mma = typename S::Mma;
  const RowMasks rows(p, step);
  if constexpr (kSoftcap) {
#pragma unroll
    for (int f = 0; f < S::BM / 8; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[f][e] = gpu::capped_tanh(p, st[f][e]);
  } else if (step.whole) {
    probabilities<S, false>(p, step, rows, st, lane);
  } else {
    probabilities<S, true>(p, step, rows, st, lane);
  }
#pragma unroll
  for (int f = 0; f < S::BM / 8; ++f) {
    const int qc = f * 8 + 2 * (lane % 4);
    const float2 lse2 = lse2_pair<kSoftcap>(step.s_lse, qc);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float pr[2], factor[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float2 x = prob_factor<kSoftcap>(p, st[f][2 * half + e], e ? lse2.y : lse2.x,
                                               step.whole || rows.km[half].sees(step.m0 + qc + e));
        pr[e] = x.x;
        factor[e] = x.y;
      }
      a_p[f / 2][2 * (f % 2) + half] = Mma::pack(pr[0], pr[1]);
      if constexpr (kSoftcap) {
        w_slot[(2 * f + half) * 32 + lane] = Mma::pack(factor[0], factor[1]);
      }
    }
  }
}

// In turn, once dP^T has landed: dS^T = w (dP^T - dot(dO, O)), w from a_p (P^T) or, under a soft
// cap, from the warp's w_slot.
template <class S>
__device__ __forceinline__ void ds_in_turn(const ScoreStep& step, bool capped,
                                           const float (&dpt)[S::BM / 8][4],
                                           const uint32_t (&a_p)[S::QSTEPS][4],
                                           uint32_t (&a_ds)[S::QSTEPS][4], const uint32_t* w_slot,
                                           int lane) {
  using Mma = typename S::Mma;
#pragma unroll
  for (int f = 0; f < S::BM / 8; ++f) {
    const int qc = f * 8 + 2 * (lane % 4);
    const float2 dsum = *reinterpret_cast<const float2*>(step.s_dp + qc);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float2 factor =
          Mma::unpack(capped ? w_slot[(2 * f + half) * 32 + lane] : a_p[f / 2][2 * (f % 2) + half]);
      a_ds[f / 2][2 * (f % 2) + half] = Mma::pack(factor.x * (dpt[f][2 * half] - dsum.x),
                                                  factor.y * (dpt[f][2 * half + 1] - dsum.y));
    }
  }
  __syncwarp();  // the lanes' w read before the warp's dS^T overwrites it
}

}  // namespace sm90
}  // namespace raggedattn

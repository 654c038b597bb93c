// The portable forward's online softmax of one key tile (keys from n0) for a warp's MF m16 row
// blocks (rows from wm0 of the query tile at m0): the scores into the log2 domain, the mask where
// the tile straddles a band edge, P in place of the scores, the row statistics updated and O
// rescaled.
#pragma once

#include <cmath>

#include "cuda/common/fwd_work.cuh"
#include "cuda/common/math.cuh"
#include "cuda/common/params.hpp"

namespace raggedattn {
namespace portable {

// Scores to the log2 domain: under a soft cap by its tanh pass; otherwise inside the exponent,
// exp2(s * scale_log2 - max), one FFMA per score (the row maximum is taken on the unscaled scores,
// the factor being positive), as the Hopper forward does.
template <int BM, int MF, int NF, int OF>
__device__ __forceinline__ void online_softmax(const gpu::FwdParams& p, const Segment& seg, int m0,
                                               int n0, int wm0, int lane,
                                               float (&s)[MF][NF][4], float (&row_max)[MF][2],
                                               float (&row_sum)[MF][2],
                                               float (&acc_o)[MF][OF][4]) {
  constexpr int BN = NF * 8;
  float to_log2 = p.scale_log2;
  if (p.softcap > 0.f) {
    const float pre = p.scale / p.softcap, post = p.softcap * gpu::kLog2e;
#pragma unroll
    for (int mf = 0; mf < MF; ++mf)
#pragma unroll
      for (int f = 0; f < NF; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mf][f][e] = gpu::fast_tanh(s[mf][f][e] * pre) * post;
    to_log2 = 1.f;
  }
  if (!p.mask.block_full(m0, m0 + BM, n0, n0 + BN, seg.len_q, seg.len_kv)) {
#pragma unroll
    for (int mf = 0; mf < MF; ++mf)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = m0 + wm0 + mf * 16 + lane / 4 + 8 * half;
        const int lo = p.mask.key_begin(i, seg.len_q, seg.len_kv);
        const int hi = p.mask.key_end(i, seg.len_q, seg.len_kv);
#pragma unroll
        for (int f = 0; f < NF; ++f)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = n0 + f * 8 + 2 * (lane % 4) + e;
            if (j < lo || j >= hi) s[mf][f][2 * half + e] = -INFINITY;
          }
      }
  }

#pragma unroll
  for (int mf = 0; mf < MF; ++mf)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = -INFINITY;
#pragma unroll
      for (int f = 0; f < NF; ++f)
        mx = fmaxf(mx, fmaxf(s[mf][f][2 * half], s[mf][f][2 * half + 1]));
      mx = fmaxf(row_max[mf][half], gpu::quad_max(mx) * to_log2);
      const float base = mx == -INFINITY ? 0.f : mx;  // a row with nothing visible yet
      const float alpha = gpu::fast_exp2(row_max[mf][half] - base);
      row_max[mf][half] = mx;
      float sum = 0.f;
#pragma unroll
      for (int f = 0; f < NF; ++f)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pr = gpu::fast_exp2(fmaf(s[mf][f][2 * half + e], to_log2, -base));
          s[mf][f][2 * half + e] = pr;
          sum += pr;
        }
      row_sum[mf][half] = row_sum[mf][half] * alpha + sum;
#pragma unroll
      for (int f = 0; f < OF; ++f) {
        acc_o[mf][f][2 * half] *= alpha;
        acc_o[mf][f][2 * half + 1] *= alpha;
      }
    }
}

}  // namespace portable
}  // namespace raggedattn

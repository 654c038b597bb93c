// The portable backward's epilogue: dK (times the softmax scale) and dV of this warp's keys, from
// the registers into the output tensors (rows past the key tile's `keys` skipped).
#pragma once

#include "cuda/portable/bwd_shape.cuh"

namespace raggedattn {
namespace portable {

template <class W>
__device__ __forceinline__ void store_dk_dv(const gpu::BwdParams& p, const Segment& seg, int hk,
                                            int n0, int keys, const BwdWarpOrigin& o, int lane,
                                            const float (&acc_dk)[W::KV_MF][W::DK_W / 8][4],
                                            const float (&acc_dv)[W::KV_MF][W::DV_W / 8][4]) {
  using T = typename W::T;
  using Mma = typename W::Mma;
  T* dk = static_cast<T*>(p.dk) + p.dk_layout.offset(seg.kv_row0 + n0, hk);
  T* dv = static_cast<T*>(p.dv) + p.dv_layout.offset(seg.kv_row0 + n0, hk);
#pragma unroll
  for (int mf = 0; mf < W::KV_MF; ++mf)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = o.kv_key0 + mf * 16 + lane / 4 + 8 * half;
      if (r < keys) {
        T* dkrow = dk + r * p.dk_layout.token_stride + o.dk_col0 + 2 * (lane % 4);
        T* dvrow = dv + r * p.dv_layout.token_stride + o.dv_col0 + 2 * (lane % 4);
#pragma unroll
        for (int f = 0; f < W::DK_W / 8; ++f) {
          *reinterpret_cast<uint32_t*>(dkrow + f * 8) =
              Mma::pack(acc_dk[mf][f][2 * half] * p.scale, acc_dk[mf][f][2 * half + 1] * p.scale);
        }
#pragma unroll
        for (int f = 0; f < W::DV_W / 8; ++f) {
          *reinterpret_cast<uint32_t*>(dvrow + f * 8) =
              Mma::pack(acc_dv[mf][f][2 * half], acc_dv[mf][f][2 * half + 1]);
        }
      }
    }
}

}  // namespace portable
}  // namespace raggedattn

// The Hopper backward's epilogue, in each consumer warpgroup: dK (times the softmax scale) and dV
// of its keys and columns, staged in shared memory in K's and V's own tiles (no one reads them
// once both consumers' last products have landed: the producer loaded them once, warp 1 reads only
// the dQ tile), in their 128-byte-swizzled panel layout by stmatrix, then copied out 16 bytes per
// row chunk: whole 32-byte sectors, and a quarter of the store instructions of storing each
// thread's accumulator pairs directly.
#pragma once

#include <type_traits>

#include "cuda/sm90/bwd_consumer_state.cuh"

namespace raggedattn {
namespace sm90 {

// An accumulator's fragments, times `mul`, into a swizzled [BN][dim] tile at columns from col0.
template <class S, class Acc>
__device__ __forceinline__ void stage_accumulator(const BwdConsumer& me, const Acc& acc, int col0,
                                                  uint32_t base, float mul) {
  using Mma = typename S::Mma;
  constexpr int NF = std::extent<Acc>::value;
  static_assert(NF % 2 == 0, "fragment pairs: 16 columns per stmatrix");
#pragma unroll
  for (int f = 0; f < NF; f += 2) {
    const uint32_t r[4] = {Mma::pack(acc[f][0] * mul, acc[f][1] * mul),
                           Mma::pack(acc[f][2] * mul, acc[f][3] * mul),
                           Mma::pack(acc[f + 1][0] * mul, acc[f + 1][1] * mul),
                           Mma::pack(acc[f + 1][2] * mul, acc[f + 1][3] * mul)};
    stmatrix_x4(base + swizzled_offset(S::BN, me.stmatrix_row(), col0 / 8 + f + me.lane / 16), r);
  }
}

// The warpgroup's 64 key rows from key0, `width` columns from col0, 16 bytes at a time; rows past
// the segment's keys are not written.
template <class S>
__device__ __forceinline__ void copy_out(const BwdConsumer& me, int keys, typename S::T* out,
                                         int64_t stride, const unsigned char* tile, int col0,
                                         int width) {
  const int chunks = width / 8, ptid = me.tid % 128;
  for (int i = ptid; i < 64 * chunks; i += 128) {
    const int r = me.key0 + i / chunks, ch = i % chunks;
    if (r < keys) {
      *reinterpret_cast<uint4*>(out + r * stride + col0 + ch * 8) =
          *reinterpret_cast<const uint4*>(tile + swizzled_offset(S::BN, r, col0 / 8 + ch));
    }
  }
}

template <class S, int DKN, int DVN>
__device__ __forceinline__ void bwd_epilogue(const BwdParams& p, const BwdCta& cta,
                                             const BwdConsumer& me,
                                             const float (&acc_dk)[DKN / 8][4],
                                             const float (&acc_dv)[DVN / 8][4], int dk0, int dv0) {
  using T = typename S::T;
  // The two consumers meet twice: both consumers' last products have landed, then every warp's
  // part of the tiles is in.
  named_barrier_sync(1, S::kConsumerThreads);
  stage_accumulator<S>(me, acc_dk, dk0, me.k_addr, p.scale);
  stage_accumulator<S>(me, acc_dv, dv0, me.v_addr, 1.f);
  named_barrier_sync(1, S::kConsumerThreads);
  const Segment& seg = cta.w.seg;
  copy_out<S>(me, cta.w.keys,
              static_cast<T*>(p.dk) + p.dk_layout.offset(seg.kv_row0 + cta.w.n0, cta.hk),
              p.dk_layout.token_stride, cta.smem + S::L.k, dk0, DKN);
  copy_out<S>(me, cta.w.keys,
              static_cast<T*>(p.dv) + p.dv_layout.offset(seg.kv_row0 + cta.w.n0, cta.hk),
              p.dv_layout.token_stride, cta.smem + S::L.v, dv0, DVN);
}

}  // namespace sm90
}  // namespace raggedattn

// The portable backward's loads: a step's query tile (Q, dO and the row statistics) into a stage
// of shared memory by cp.async, issued by every thread of the CTA.
#pragma once

#include "cuda/portable/bwd_shape.cuh"

namespace raggedattn {
namespace portable {

// Step `it` covers query tile m_tile of query head h.
struct BwdStep {
  int h, m_tile;
};

// A stage is loaded in two parts (dO; Q with the row statistics), so that the double-buffered
// loop can issue each part at a different point of the step before, each warp when it gets there
// (FlashAttention-2 also issues its copies mid-step): issued by every warp at once behind the
// step's barrier, the copies read their address registers late and the next instruction reusing
// one stalled.
template <class W>
struct BwdStageLoads {
  const gpu::BwdParams& p;
  const Segment& seg;
  unsigned char* smem;
  const BwdSmem& L;
  int tid;

  __device__ __forceinline__ void load_do(BwdStep s, int buf) const {
    const int64_t row0 = seg.q_row0 + s.m_tile * W::BM;
    load_tile_async<W::BM, W::DV, W::NT>(
        smem + L.d_o + buf * L.do_stage, L.do_pitch,
        static_cast<const typename W::T*>(p.d_o) + p.do_layout.offset(row0, s.h),
        p.do_layout.token_stride, seg.len_q - s.m_tile * W::BM, tid);
  }
  __device__ __forceinline__ void load_q_stats(BwdStep s, int buf) const {
    const int h = s.h;
    const int m0 = s.m_tile * W::BM;
    const int64_t row0 = seg.q_row0 + m0;
    const int valid = seg.len_q - m0;
    load_tile_async<W::BM, W::DQK, W::NT>(
        smem + L.q + buf * L.q_stage, L.q_pitch,
        static_cast<const typename W::T*>(p.q) + p.q_layout.offset(row0, h),
        p.q_layout.token_stride, valid, tid);
    float* s_lse = reinterpret_cast<float*>(smem + L.lse + buf * L.stat_stage);
    float* s_dp = reinterpret_cast<float*>(smem + L.dpsum + buf * L.stat_stage);
    const int64_t stat = p.stats.offset(h, row0);
    static_assert(W::BM <= W::NT, "one row statistic per thread");
    if (tid < W::BM) {
      const int r = tid;
      gpu::cp_async_4(s_lse + r, p.lse + (r < valid ? stat + r : 0), r < valid);
      gpu::cp_async_4(s_dp + r, p.dpsum + (r < valid ? stat + r : 0), r < valid);
    }
  }
  __device__ __forceinline__ void load_stage(BwdStep s, int buf) const {
    load_q_stats(s, buf);
    load_do(s, buf);
  }
};

}  // namespace portable
}  // namespace raggedattn

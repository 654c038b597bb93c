// The Hopper backward's loads, producer warp 0: K/V once, then stage `it` into buffer
// it % STAGES once both consumers freed it, all by TMA (lane 0 issues one box per 64-column
// panel). A whole tile completes on its barrier; a segment's last, partial tile on `partial`, and
// this warp then zeroes its rows past the segment (they may hold anything, NaN included, and P^T
// dO and dS^T Q would carry it into dV and dK). LSE and dot(dO, O) always come by cp.async. Each
// lane waits for its own copies, makes them visible to the async proxy and arrives, so a stage's
// barrier completes when all 32 lanes and the TMA bytes are in.
#pragma once

#include "cuda/sm90/bwd_cta.cuh"

namespace raggedattn {
namespace sm90 {

// Zeroes rows [from, rows) of each 64-column panel of a swizzled tile of `rows` rows (a row's 128
// bytes in a panel, whatever their order) with 16-byte stores, the warp's lanes in turn.
__device__ __forceinline__ void zero_tile_rows(unsigned char* tile, int rows, int panels, int from,
                                               int lane) {
  const int n = (rows - from) * panels * 8;
  for (int i = lane; i < n; i += 32) {
    const int chunk = i % 8, rest = i / 8, panel = rest % panels, r = from + rest / panels;
    *reinterpret_cast<uint4*>(tile + (panel * rows + r) * kSwizzleBytes + chunk * 16) =
        make_uint4(0u, 0u, 0u, 0u);
  }
}

// Lane 0: K's and V's boxes of the CTA's key tile, completing on `bar`.
template <class S>
__device__ __forceinline__ void issue_kv(const BwdTmaParams& a, const BwdCta& cta, uint64_t* bar) {
  mbar_expect_tx(bar, uint32_t(tile_bytes(S::BN, S::DQK) + tile_bytes(S::BN, S::DV)));
  const int row = int(cta.w.seg.kv_row0 + cta.w.n0);
#pragma unroll
  for (int panel = 0; panel < S::DQK / S::PANEL; ++panel) {
    tma_load_3d(cta.smem + S::L.k + panel * S::BN * kSwizzleBytes, &a.k_map, panel * S::PANEL,
                cta.hk, row, bar);
  }
#pragma unroll
  for (int panel = 0; panel < S::DV / S::PANEL; ++panel) {
    tma_load_3d(cta.smem + S::L.v + panel * S::BN * kSwizzleBytes, &a.v_map, panel * S::PANEL,
                cta.hk, row, bar);
  }
}

template <class S>
__device__ __forceinline__ void bwd_load_warp(const BwdTmaParams& a, const BwdCta& cta, int lane) {
  constexpr BwdSmem L = S::L;
  constexpr int BM = S::BM, PANEL = S::PANEL, STAGES = S::STAGES;
  const BwdParams& p = a.p;
  const gpu::KeyTileWork& w = cta.w;
  const Segment& seg = w.seg;
  const BwdBarriers& bars = cta.bars;
  const int n_it = w.steps;
  if (n_it == 0) return;
  // A partial tile comes by TMA like a whole one (rows past the tensor's end arrive as zeros,
  // rows of the next segment or of padding as they are) onto `partial`; once it has landed, this
  // warp zeroes its rows past the segment. The fence before the stage's arrival makes the stores
  // visible to wgmma.
  uint32_t partial_uses = 0;
  if (w.keys == S::BN) {  // a whole key tile: TMA, completing on kv_full
    if (lane == 0) issue_kv<S>(a, cta, bars.kv_full);
  } else {  // a segment's last, partial key tile: its rows past the segment zeroed
    if (lane == 0) {
      issue_kv<S>(a, cta, bars.partial);
      mbar_arrive(bars.partial);
    }
    mbar_wait(bars.partial, partial_uses++ & 1);
    zero_tile_rows(cta.smem + L.k, S::BN, S::DQK / PANEL, w.keys, lane);
    zero_tile_rows(cta.smem + L.v, S::BN, S::DV / PANEL, w.keys, lane);
    __syncwarp();  // every lane has seen the phase before lane 0 can start the next
  }
  // Step it is query tile w.query_tile(it % w.m_count) of the group's head it / w.m_count: the
  // tile m_first + qt and the head qh, counted by w.next_step (as every loop here counts).
  for (int it = 0, qt = w.m_rot, qh = 0; it < n_it; ++it, w.next_step(qt, qh)) {
    const int s = it % STAGES;
    if (it >= STAGES) mbar_wait(&bars.empty[s], ((it / STAGES) - 1) & 1);
    const int h = cta.hk * p.group + qh;
    const int m0 = (w.m_first + qt) * BM;
    const int64_t row0 = seg.q_row0 + m0;
    const int valid = seg.len_q - m0;
    unsigned char* q_dst = cta.smem + L.q + s * L.q_stage;
    unsigned char* do_dst = cta.smem + L.d_o + s * L.do_stage;
    // Whole tiles complete on the stage's barrier; a partial one on `partial`, after which this
    // warp zeroes its rows past the segment before arriving on the stage's.
    uint64_t* boxes = valid >= BM ? &bars.full[s] : bars.partial;
    if (lane == 0) {
      mbar_expect_tx(boxes, uint32_t(L.q_stage + L.do_stage));
#pragma unroll
      for (int panel = 0; panel < S::DQK / PANEL; ++panel) {
        tma_load_3d(q_dst + panel * BM * kSwizzleBytes, &a.q_map, panel * PANEL, h, int(row0),
                    boxes);
      }
#pragma unroll
      for (int panel = 0; panel < S::DV / PANEL; ++panel) {
        tma_load_3d(do_dst + panel * BM * kSwizzleBytes, &a.do_map, panel * PANEL, h, int(row0),
                    boxes);
      }
      if (valid < BM) mbar_arrive(bars.partial);
    }
    float* s_lse = reinterpret_cast<float*>(cta.smem + L.lse + s * L.stat_stage);
    float* s_dp = reinterpret_cast<float*>(cta.smem + L.dpsum + s * L.stat_stage);
    const int64_t stat = p.stats.offset(h, row0);
#pragma unroll
    for (int r = lane; r < BM; r += 32) {
      const bool ok = r < valid;
      gpu::cp_async_4(s_lse + r, p.lse + (ok ? stat + r : 0), ok);
      gpu::cp_async_4(s_dp + r, p.dpsum + (ok ? stat + r : 0), ok);
    }
    gpu::cp_async_commit();
    if (valid < BM) {
      mbar_wait(bars.partial, partial_uses++ & 1);
      zero_tile_rows(q_dst, BM, S::DQK / PANEL, valid, lane);
      zero_tile_rows(do_dst, BM, S::DV / PANEL, valid, lane);
      __syncwarp();  // every lane has seen the phase before lane 0 can start the next
    }
    gpu::cp_async_wait<0>();  // this lane's statistics have landed
    fence_proxy_async_smem();
    if (it == 0) mbar_arrive(bars.kv_full);
    mbar_arrive(&bars.full[s]);
  }
}

}  // namespace sm90
}  // namespace raggedattn

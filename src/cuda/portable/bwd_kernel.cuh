// Backward main kernel of the portable path: one CTA per (key tile of a segment, KV head).
//
// dK and dV of the tile accumulate in registers while the CTA streams the query tiles of every
// query head of its GQA group (no dK/dV scratch, no reduction). Per query tile:
//   S^T = K Q^T, dP^T = V dO^T        (warps split keys x queries)
//   P^T = exp(S^T - LSE), dS^T = P^T (dP^T - D)  -> shared memory as [key][query]
//                                     (bwd_scores.cuh)
//   dV += P^T dO, dK += dS^T Q        (warps split keys x head dim)
//   dQ_tile = dS K                    (warps split queries x head dim) -> added into the dQ
//                                     scratch at DqAccumLayout::offset, the one layout of the Plan
//                                     (bwd_dq_out.cuh)
// Query/dO tiles are double-buffered when shared memory allows (Plan: stages; bwd_loads.cuh).
// The shape of every warp tile: bwd_shape.cuh; dK and dV out: bwd_epilogue.cuh.
#pragma once

#include "cuda/common/bulk_async.cuh"
#include "cuda/portable/bwd_dq_out.cuh"
#include "cuda/portable/bwd_epilogue.cuh"
#include "cuda/portable/bwd_loads.cuh"
#include "cuda/portable/bwd_scores.cuh"

namespace raggedattn {
namespace portable {

template <class T, int DQK, int DV>
__global__ void __launch_bounds__(bwd_config(DQK, DV).warps * 32, 1)
    bwd_kernel(const __grid_constant__ gpu::BwdParams p) {
  using W = BwdWarps<T, DQK, DV>;
  constexpr int BM = W::BM, BN = W::BN, NT = W::NT;

  extern __shared__ __align__(128) unsigned char smem[];
  const BwdSmem L = bwd_smem(DQK, DV, p.stages, p.dq_staged);
  T* sK = reinterpret_cast<T*>(smem + L.k);
  T* sV = reinterpret_cast<T*>(smem + L.v);
  T* sPT = reinterpret_cast<T*>(smem + L.pt);
  T* sdST = reinterpret_cast<T*>(smem + L.dst);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const TileCoord tc = p.kv_tiles.locate(blockIdx.x, p.segs.cu_kv);
  if (tc.segment < 0) return;
  const int b = tc.segment, hk = blockIdx.y;
  const gpu::KeyTileWork w = gpu::key_tile_work<BM, BN>(p, tc);
  const Segment& seg = w.seg;
  const int n0 = w.n0, keys = w.keys, m_first = w.m_first, m_count = w.m_count, n_it = w.steps;
  const BwdWarpOrigin o = BwdWarpOrigin::of<W>(warp);

  float acc_dk[W::KV_MF][W::DK_W / 8][4], acc_dv[W::KV_MF][W::DV_W / 8][4];
  zero(acc_dk);
  zero(acc_dv);

  // Step it covers query tile w.query_tile(it % m_count) of query head hk * group + it / m_count,
  // both kept as counters rather than divided out per step: the tiles run from m_start up,
  // wrapping to m_first, and the head moves on when they are back at m_start.
  const int m_start = w.query_tile(0);
  auto next_step = [&](BwdStep s) {
    const int t = s.m_tile + 1 == m_first + m_count ? m_first : s.m_tile + 1;
    return BwdStep{s.h + (t == m_start ? 1 : 0), t};
  };
  const BwdStageLoads<W> loads{p, seg, smem, L, tid};

  if (n_it > 0) {
    const T* k = static_cast<const T*>(p.k) + p.k_layout.offset(seg.kv_row0 + n0, hk);
    const T* v = static_cast<const T*>(p.v) + p.v_layout.offset(seg.kv_row0 + n0, hk);
    load_tile_async<BN, DQK, NT>(sK, L.k_pitch, k, p.k_layout.token_stride, keys, tid);
    load_tile_async<BN, DV, NT>(sV, L.v_pitch, v, p.v_layout.token_stride, keys, tid);
    loads.load_stage(BwdStep{hk * p.group, m_start}, 0);
    gpu::cp_async_commit();
  }

  const bool ordered = p.locks != nullptr;
  // The dQ scratch offset of (this segment, head 0, row 0); DqAccumLayout::offset is affine in the
  // head and the row (head_stride(), dim), so a step adds two products instead of recomputing it
  // per row.
  const int64_t dq_seg0 = p.dq_accum.offset(0, b, seg.cu_q, 0, 0);
  const int64_t dq_head_stride = p.dq_accum.head_stride();
  BwdStep step{hk * p.group, m_start};
  // Staged dQ (sm_90): the tile a step writes into shared memory is added into the scratch by
  // thread 0 after the next CTA barrier, when every warp's part is in: its first element's offset
  // in the scratch and its rows (0: none pending).
  [[maybe_unused]] int64_t dq_pending = 0;  // unused where the sm_80 build compiles no staging
  [[maybe_unused]] int dq_pending_rows = 0;
  auto flush_dq = [&]() {
#if __CUDA_ARCH__ >= 900
    if (tid == 0 && dq_pending_rows > 0) {
      gpu::bulk_reduce_add(static_cast<float*>(p.dq_accum_ptr) + dq_pending, smem + L.dq,
                           uint32_t(dq_pending_rows * DQK * sizeof(float)));
      gpu::bulk_commit();
    }
#endif
  };

  for (int it = 0; it < n_it; ++it, step = next_step(step)) {
    const int buf = p.stages == 2 ? (it & 1) : 0;
    if (p.stages == 1 && it > 0) {
      __syncthreads();  // the single buffer is free once every warp finished step it - 1
      loads.load_stage(step, 0);
      gpu::cp_async_commit();
    }
    gpu::cp_async_wait<0>();
    // Step `it`'s data is in for every thread, and every warp has finished step it - 1: its Q/dO
    // buffer, P^T and dS^T are free to overwrite, and its staged dQ tile is complete.
    __syncthreads();
    flush_dq();
    // Double-buffered: step it + 1's stage goes into the buffer step it - 1 read, free since the
    // barrier above; dO is issued after dV's product, Q and the statistics after dQ's.
    const bool prefetch = p.stages == 2 && it + 1 < n_it;

    const int h = step.h, m_tile = step.m_tile;
    const int m0 = m_tile * BM;
    const T* sQ = reinterpret_cast<const T*>(smem + L.q + buf * L.q_stage);
    const T* sdO = reinterpret_cast<const T*>(smem + L.d_o + buf * L.do_stage);
    const ScoreTiles<T> tiles{reinterpret_cast<const float*>(smem + L.lse + buf * L.stat_stage),
                              reinterpret_cast<const float*>(smem + L.dpsum + buf * L.stat_stage),
                              sPT, sdST, L.s_pitch, m0, n0};

    // S^T = K Q^T and dP^T = V dO^T for this warp's [S_KW keys x S_QW queries].
    float st[W::S_MF][W::S_NF][4], dpt[W::S_MF][W::S_NF][4];
    zero(st);
    zero(dpt);
    warp_gemm<T, W::S_MF, W::S_NF, DQK, false, false>(st, sK, L.k_pitch, o.s_key0, sQ, L.q_pitch,
                                                      o.s_q0, lane);
    warp_gemm<T, W::S_MF, W::S_NF, DV, false, false>(dpt, sV, L.v_pitch, o.s_key0, sdO,
                                                     L.do_pitch, o.s_q0, lane);
    const bool full = p.mask.block_full(m0, m0 + BM, n0, n0 + BN, seg.len_q, seg.len_kv);
    scores_to_smem<W>(p, seg, o, tiles, full, lane, st, dpt);
#if __CUDA_ARCH__ >= 900
    // The staged dQ tile of step it - 1 has been read out (long since: it was issued at the step's
    // start) before anyone writes this step's.
    if (p.dq_staged && tid == 0) gpu::bulk_wait_read();
#endif
    __syncthreads();

    // dV += P^T dO over this step's queries.
    warp_gemm<T, W::KV_MF, W::DV_W / 8, BM, false, true>(acc_dv, sPT, L.s_pitch, o.kv_key0, sdO,
                                                         L.do_pitch, o.dv_col0, lane);
    if (prefetch) {
      loads.load_do(next_step(step), (it + 1) & 1);
      gpu::cp_async_commit();
    }

    // dQ tile = dS K over this CTA's keys, added into the scratch before dK's product (the order
    // of FlashAttention-2), so that the dK product runs while the additions are in flight.
    float dq[W::DQ_MF][W::DQ_W / 8][4];
    zero(dq);
    warp_gemm<T, W::DQ_MF, W::DQ_W / 8, BN, true, true>(dq, sdST, L.s_pitch, o.dq_row0, sK,
                                                        L.k_pitch, o.dq_col0, lane);
    if (prefetch) {
      loads.load_q_stats(next_step(step), (it + 1) & 1);
      gpu::cp_async_commit();
    }

    int32_t* const lock = ordered ? wait_dq_turn<BM, BN>(p, tc.tile, b, seg, h, m_tile, tid)
                                  : nullptr;
    const int64_t dq_head = dq_seg0 + h * dq_head_stride;
    bool staged = false;
#if __CUDA_ARCH__ >= 900
    if (p.dq_staged) {
      staged = true;
      stage_dq_tile<W>(reinterpret_cast<float*>(smem + L.dq), L.dq_pitch, o, lane, dq);
      dq_pending = dq_head + int64_t(m0) * DQK;
      dq_pending_rows = min(BM, seg.len_q - m0);
    }
#endif
    const int i0 = m0 + o.dq_row0 + lane / 4;  // the thread's first row
    const int64_t dq_first = dq_head + int64_t(i0) * DQK + o.dq_col0 + 2 * (lane % 4);
    if (!staged) add_dq<W>(p, ordered, dq_first, i0, seg.len_q, dq);
    if (ordered) pass_dq_turn(lock, tid);

    // dK += dS^T Q over this step's queries.
    warp_gemm<T, W::KV_MF, W::DK_W / 8, BM, false, true>(acc_dk, sdST, L.s_pitch, o.kv_key0, sQ,
                                                         L.q_pitch, o.dk_col0, lane);
  }
#if __CUDA_ARCH__ >= 900
  if (p.dq_staged && n_it > 0) {
    __syncthreads();  // the last step's staged dQ tile is complete
    flush_dq();
    if (tid == 0) gpu::bulk_wait_done();  // the additions are performed before the CTA ends
  }
#endif
  store_dk_dv<W>(p, seg, hk, n0, keys, o, lane, acc_dk, acc_dv);
}

}  // namespace portable
}  // namespace raggedattn

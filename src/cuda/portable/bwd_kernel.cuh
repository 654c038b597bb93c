// Backward main kernel of the portable path: one CTA per (key tile of a segment, KV head).
//
// dK and dV of the tile accumulate in registers while the CTA streams the query tiles of every
// query head of its GQA group (no dK/dV scratch, no reduction). Per query tile:
//   S^T = K Q^T, dP^T = V dO^T        (warps split keys x queries)
//   P^T = exp(S^T - LSE), dS^T = P^T (dP^T - D)  -> shared memory as [key][query]
//   dV += P^T dO, dK += dS^T Q        (warps split keys x head dim)
//   dQ_tile = dS K                    (warps split queries x head dim) -> added into the dQ
//                                     scratch at DqAccumLayout::offset, the one layout of the Plan
// Query/dO tiles are double-buffered when shared memory allows (Plan: stages).
#pragma once

#include <type_traits>

#include "core/portable_shapes.hpp"
#include "cuda/common/bulk_async.cuh"
#include "cuda/common/bwd_work.cuh"
#include "cuda/portable/warp_mma.cuh"

namespace raggedattn {
namespace portable {

// c[B0 + f] <- c[B0 + (f + r) mod B] over the block [B0, B0 + B) (B a power of two), by a shifter
// of selects on r's bits: the staged dQ tile's registers in dq_stage_chunk's store order.
template <int B0, int B, int N>
__device__ __forceinline__ void rotate_chunks(float2 (&c)[N], int r) {
#pragma unroll
  for (int sh = 1; sh < B; sh <<= 1) {
    const bool on = (r & sh) != 0;
    float2 n[B];
#pragma unroll
    for (int f = 0; f < B; ++f) {
      n[f].x = on ? c[B0 + (f + sh) % B].x : c[B0 + f].x;
      n[f].y = on ? c[B0 + (f + sh) % B].y : c[B0 + f].y;
    }
#pragma unroll
    for (int f = 0; f < B; ++f) c[B0 + f] = n[f];
  }
}

template <class T, int DQK, int DV>
__global__ void __launch_bounds__(bwd_config(DQK, DV).warps * 32, 1)
    bwd_kernel(const __grid_constant__ gpu::BwdParams p) {
  constexpr BwdConfig C = bwd_config(DQK, DV);
  constexpr int BM = C.block_m, BN = C.block_n, NW = C.warps, NT = NW * 32;
  // Score tiles [BN keys x BM queries]: warp tile S_KW keys x S_QW queries.
  constexpr int S_KW = BN / C.s_warps_key, S_QW = BM / (NW / C.s_warps_key);
  // dK/dV [BN keys x dim]: warp tile KV_KW keys x (DK_W | DV_W) columns.
  constexpr int KV_KW = BN / C.kv_warps_key, KV_DW = NW / C.kv_warps_key;
  constexpr int DK_W = DQK / KV_DW, DV_W = DV / KV_DW;
  // dQ tile [BM queries x DQK]: warp tile DQ_QW queries x DQ_W columns.
  constexpr int DQ_QW = BM / C.dq_warps_q, DQ_W = bwd_dq_warp_cols(DQK, DV);
  constexpr int S_MF = S_KW / 16, S_NF = S_QW / 8;
  constexpr int KV_MF = KV_KW / 16, DQ_MF = DQ_QW / 16;
  static_assert(S_KW % 16 == 0 && S_QW % 16 == 0, "score warp tile");
  static_assert(KV_KW % 16 == 0 && DK_W % 16 == 0 && DV_W % 16 == 0, "dK/dV warp tile");
  static_assert(DQ_QW % 16 == 0 && DQ_W % 16 == 0, "dQ warp tile");
  using Mma = gpu::MmaType<T>;

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

  // Warp coordinates in the three grids.
  const int s_key0 = (warp % C.s_warps_key) * S_KW, s_q0 = (warp / C.s_warps_key) * S_QW;
  const int kv_key0 = (warp % C.kv_warps_key) * KV_KW;
  const int dk_col0 = (warp / C.kv_warps_key) * DK_W, dv_col0 = (warp / C.kv_warps_key) * DV_W;
  const int dq_row0 = (warp % C.dq_warps_q) * DQ_QW, dq_col0 = (warp / C.dq_warps_q) * DQ_W;

  float acc_dk[KV_MF][DK_W / 8][4], acc_dv[KV_MF][DV_W / 8][4];
  zero(acc_dk);
  zero(acc_dv);

  // Step it covers query tile w.query_tile(it % m_count) of query head hk * group + it / m_count,
  // both kept as counters rather than divided out per step: the tiles run from m_start up,
  // wrapping to m_first, and the head moves on when they are back at m_start.
  struct Step {
    int h, m_tile;
  };
  const int m_start = w.query_tile(0);
  auto next_step = [&](Step s) {
    const int t = s.m_tile + 1 == m_first + m_count ? m_first : s.m_tile + 1;
    return Step{s.h + (t == m_start ? 1 : 0), t};
  };
  // A stage is loaded in two parts (dO; Q with the row statistics), so that the double-buffered
  // loop can issue each part at a different point of the step before, each warp when it gets
  // there (FlashAttention-2 also issues its copies mid-step): issued by every warp at once behind
  // the step's barrier, the copies read their address registers late and the next instruction
  // reusing one stalled.
  auto load_do = [&](Step s, int buf) {
    const int64_t row0 = seg.q_row0 + s.m_tile * BM;
    load_tile_async<BM, DV, NT>(smem + L.d_o + buf * L.do_stage, L.do_pitch,
                                static_cast<const T*>(p.d_o) + p.do_layout.offset(row0, s.h),
                                p.do_layout.token_stride, seg.len_q - s.m_tile * BM, tid);
  };
  auto load_q_stats = [&](Step s, int buf) {
    const int h = s.h;
    const int m0 = s.m_tile * BM;
    const int64_t row0 = seg.q_row0 + m0;
    const int valid = seg.len_q - m0;
    load_tile_async<BM, DQK, NT>(smem + L.q + buf * L.q_stage, L.q_pitch,
                                 static_cast<const T*>(p.q) + p.q_layout.offset(row0, h),
                                 p.q_layout.token_stride, valid, tid);
    float* s_lse = reinterpret_cast<float*>(smem + L.lse + buf * L.stat_stage);
    float* s_dp = reinterpret_cast<float*>(smem + L.dpsum + buf * L.stat_stage);
    const int64_t stat = p.stats.offset(h, row0);
    static_assert(BM <= NT, "one row statistic per thread");
    if (tid < BM) {
      const int r = tid;
      gpu::cp_async_4(s_lse + r, p.lse + (r < valid ? stat + r : 0), r < valid);
      gpu::cp_async_4(s_dp + r, p.dpsum + (r < valid ? stat + r : 0), r < valid);
    }
  };
  auto load_stage = [&](Step s, int buf) {
    load_q_stats(s, buf);
    load_do(s, buf);
  };

  if (n_it > 0) {
    const T* k = static_cast<const T*>(p.k) + p.k_layout.offset(seg.kv_row0 + n0, hk);
    const T* v = static_cast<const T*>(p.v) + p.v_layout.offset(seg.kv_row0 + n0, hk);
    load_tile_async<BN, DQK, NT>(sK, L.k_pitch, k, p.k_layout.token_stride, keys, tid);
    load_tile_async<BN, DV, NT>(sV, L.v_pitch, v, p.v_layout.token_stride, keys, tid);
    load_stage(Step{hk * p.group, m_start}, 0);
    gpu::cp_async_commit();
  }

  const bool ordered = p.locks != nullptr;
  // The dQ scratch offset of (this segment, head 0, row 0); DqAccumLayout::offset is affine in the
  // head and the row (head_stride(), dim), so a step adds two products instead of recomputing it
  // per row.
  const int64_t dq_seg0 = p.dq_accum.offset(0, b, seg.cu_q, 0, 0);
  const int64_t dq_head_stride = p.dq_accum.head_stride();
  Step step{hk * p.group, m_start};
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
      load_stage(step, 0);
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
    const float* s_lse = reinterpret_cast<const float*>(smem + L.lse + buf * L.stat_stage);
    const float* s_dp = reinterpret_cast<const float*>(smem + L.dpsum + buf * L.stat_stage);

    // S^T = K Q^T and dP^T = V dO^T for this warp's [S_KW keys x S_QW queries].
    float st[S_MF][S_NF][4], dpt[S_MF][S_NF][4];
    zero(st);
    zero(dpt);
    warp_gemm<T, S_MF, S_NF, DQK, false, false>(st, sK, L.k_pitch, s_key0, sQ, L.q_pitch, s_q0,
                                                lane);
    warp_gemm<T, S_MF, S_NF, DV, false, false>(dpt, sV, L.v_pitch, s_key0, sdO, L.do_pitch, s_q0,
                                               lane);

    // P^T = exp(S^T - LSE), dS^T = P^T (dP^T - D) (times tanh' under a soft cap), stored
    // [key][query]. Query columns outermost: each column pair's row statistics are read from
    // shared memory once and live only for that pair's scores (held for every pair across the
    // phase, they made the kernel spill at D = 96 and 128, where the phase is its register peak).
    const bool full = p.mask.block_full(m0, m0 + BM, n0, n0 + BN, seg.len_q, seg.len_kv);
    // The soft cap and the mask are template choices of the loop (no test per element): a step
    // the mask leaves whole takes the exponentials alone; a masked one selects the exponent
    // (ex2(-inf) = 0) rather than the result, so no element takes a branch either way.
    auto score_tile = [&](auto softcap, auto masked) {
      constexpr bool kSoftcap = decltype(softcap)::value;
      constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
      for (int f = 0; f < S_NF; ++f) {
        const int qc0 = s_q0 + f * 8 + 2 * (lane % 4);  // this thread's two query columns
        const float2 lse = *reinterpret_cast<const float2*>(s_lse + qc0);
        const float2 dsum = *reinterpret_cast<const float2*>(s_dp + qc0);
        const float lse2[2] = {lse.x * gpu::kLog2e, lse.y * gpu::kLog2e}, dsm[2] = {dsum.x, dsum.y};
#pragma unroll
        for (int mf = 0; mf < S_MF; ++mf)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int kr = s_key0 + mf * 16 + lane / 4 + 8 * half;  // key row in the tile
            const int j = n0 + kr;
            float pr[2], ds[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              float x = st[mf][f][2 * half + e], dtanh = 1.f;
              if constexpr (kSoftcap) {
                const float t = gpu::fast_tanh(x * (p.scale / p.softcap));
                x = t * (p.softcap * gpu::kLog2e);
                dtanh = 1.f - t * t;
              } else {
                x *= p.scale_log2;
              }
              x -= lse2[e];
              if constexpr (kMasked) {
                // Key j sees queries [query_begin(j), query_end(j)).
                const int i = m0 + qc0 + e;
                x = j < seg.len_kv && i >= p.mask.query_begin(j, seg.len_q, seg.len_kv) &&
                            i < p.mask.query_end(j, seg.len_q, seg.len_kv)
                        ? x
                        : -INFINITY;
              }
              pr[e] = gpu::fast_exp2(x);
              ds[e] = pr[e] * (dpt[mf][f][2 * half + e] - dsm[e]) * dtanh;
            }
            *reinterpret_cast<uint32_t*>(sPT + kr * L.s_pitch + qc0) = Mma::pack(pr[0], pr[1]);
            *reinterpret_cast<uint32_t*>(sdST + kr * L.s_pitch + qc0) = Mma::pack(ds[0], ds[1]);
          }
      }
    };
    if (p.softcap > 0.f) {
      score_tile(std::true_type{}, std::true_type{});  // masked: right for whole steps too
    } else if (full) {
      score_tile(std::false_type{}, std::false_type{});
    } else {
      score_tile(std::false_type{}, std::true_type{});
    }
#if __CUDA_ARCH__ >= 900
    // The staged dQ tile of step it - 1 has been read out (long since: it was issued at the step's
    // start) before anyone writes this step's.
    if (p.dq_staged && tid == 0) gpu::bulk_wait_read();
#endif
    __syncthreads();

    // dV += P^T dO over this step's queries.
    warp_gemm<T, KV_MF, DV_W / 8, BM, false, true>(acc_dv, sPT, L.s_pitch, kv_key0, sdO, L.do_pitch,
                                                   dv_col0, lane);
    if (prefetch) {
      load_do(next_step(step), (it + 1) & 1);
      gpu::cp_async_commit();
    }

    // dQ tile = dS K over this CTA's keys, added into the scratch before dK's product (the order
    // of FlashAttention-2), so that the dK product runs while the additions are in flight.
    float dq[DQ_MF][DQ_W / 8][4];
    zero(dq);
    warp_gemm<T, DQ_MF, DQ_W / 8, BN, true, true>(dq, sdST, L.s_pitch, dq_row0, sK, L.k_pitch,
                                                  dq_col0, lane);
    if (prefetch) {
      load_q_stats(next_step(step), (it + 1) & 1);
      gpu::cp_async_commit();
    }

    int32_t* lock = nullptr;
    if (ordered) {
      // The key tiles that add into this query tile take turns (MaskSpec::key_tile_turn), so
      // every run sums alike.
      const int expected = p.mask.key_tile_turn(tc.tile, m0, BN, seg.len_q, seg.len_kv);
      lock = gpu::dq_tile_lock<BM>(p, b, seg, h, m_tile);
      if (tid == 0) {
        while (atomicAdd(lock, 0) != expected) __nanosleep(64);
        __threadfence();
      }
      __syncthreads();
    }
    // This warp's dQ rows into the scratch; the accumulation mode is one branch per step. The
    // scratch's rows are DQK elements apart (the Plan's layout has the problem's head dim, checked
    // at launch), so one address serves all of a thread's rows with constant offsets: a register
    // reused for the next row's address would wait for the atomics still reading it.
    // Where the Plan stages dQ (sm_90, fp32, atomic mode), the warps instead write the tile into
    // shared memory in the scratch's row layout, and thread 0 adds all its rows with one bulk
    // reduce-add after the next CTA barrier (the rows of a query tile are contiguous in the
    // scratch): atomics from registers stall the next writer of each source register until the
    // atomic has read it, where the bulk copy reads shared memory asynchronously.
    const int64_t dq_head = dq_seg0 + h * dq_head_stride;
    bool staged = false;
#if __CUDA_ARCH__ >= 900
    if (p.dq_staged) {
      staged = true;
      float* sdq = reinterpret_cast<float*>(smem + L.dq);
      // Each row writes its 8-column chunks in dq_stage_chunk's order (rotated by the row inside
      // power-of-two blocks), so a store's eight rows, DQK floats apart, spread over the banks
      // instead of all landing in one. The registers follow by a shifter of selects on r's bits.
      constexpr int NC = DQ_W / 8;
      constexpr DqStageBlocks kBlocks = dq_stage_blocks(NC);  // 6 = 4 + 2
      constexpr int NB1 = kBlocks.first, NB2 = kBlocks.second;
      static_assert(NB2 == 0 || pow2_floor(NB2) == NB2, "at most two power-of-two blocks");
      const int r = lane / 4;
#pragma unroll
      for (int mf = 0; mf < DQ_MF; ++mf)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float* srow =
              sdq + (dq_row0 + mf * 16 + r + 8 * half) * L.dq_pitch + dq_col0 + 2 * (lane % 4);
          float2 c[NC];
#pragma unroll
          for (int f = 0; f < NC; ++f) {
            c[f] = make_float2(dq[mf][f][2 * half], dq[mf][f][2 * half + 1]);
          }
          rotate_chunks<0, NB1>(c, r);
          if constexpr (NB2 > 0) rotate_chunks<NB1, NB2>(c, r);
#pragma unroll
          for (int k = 0; k < NC; ++k) {
            *reinterpret_cast<float2*>(srow + dq_stage_chunk(k, r, NC) * 8) = c[k];
          }
        }
      gpu::fence_proxy_async_smem();  // visible to the bulk copy (async proxy) after the barrier
      dq_pending = dq_head + int64_t(m0) * DQK;
      dq_pending_rows = min(BM, seg.len_q - m0);
    }
#endif
    const int i0 = m0 + dq_row0 + lane / 4;  // the thread's first row; the others 8, 16, ... below
    const int64_t dq_first = dq_head + int64_t(i0) * DQK + dq_col0 + 2 * (lane % 4);
    auto add_dq = [&](auto f32, auto in_turn) {
      constexpr bool kF32 = decltype(f32)::value;
      using Elem = std::conditional_t<kF32, float, T>;
      Elem* dst = static_cast<Elem*>(p.dq_accum_ptr) + dq_first;
      asm volatile("" : "+l"(dst));  // made once: not rebuilt per row in a reused register
#pragma unroll
      for (int mf = 0; mf < DQ_MF; ++mf)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = mf * 16 + 8 * half;
          if (i0 + r < seg.len_q) {
            gpu::add_dq_fragments<T, kF32, decltype(in_turn)::value>(dst + r * DQK, dq[mf], half);
          }
        }
    };
    if (staged) {
      // added above
    } else if (ordered) {
      if (p.dq_accum.type == AccumType::F32) {
        add_dq(std::true_type{}, std::true_type{});
      } else {
        add_dq(std::false_type{}, std::true_type{});
      }
    } else if (p.dq_accum.type == AccumType::F32) {
      add_dq(std::true_type{}, std::false_type{});
    } else {
      add_dq(std::false_type{}, std::false_type{});
    }
    if (ordered) {
      __threadfence();
      __syncthreads();
      if (tid == 0) atomicAdd(lock, 1);
    }

    // dK += dS^T Q over this step's queries.
    warp_gemm<T, KV_MF, DK_W / 8, BM, false, true>(acc_dk, sdST, L.s_pitch, kv_key0, sQ, L.q_pitch,
                                                   dk_col0, lane);
  }
#if __CUDA_ARCH__ >= 900
  if (p.dq_staged && n_it > 0) {
    __syncthreads();  // the last step's staged dQ tile is complete
    flush_dq();
    if (tid == 0) gpu::bulk_wait_done();  // the additions are performed before the CTA ends
  }
#endif

  // Epilogue: dK (times the softmax scale) and dV of this warp's keys.
  T* dk = static_cast<T*>(p.dk) + p.dk_layout.offset(seg.kv_row0 + n0, hk);
  T* dv = static_cast<T*>(p.dv) + p.dv_layout.offset(seg.kv_row0 + n0, hk);
#pragma unroll
  for (int mf = 0; mf < KV_MF; ++mf)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = kv_key0 + mf * 16 + lane / 4 + 8 * half;
      if (r < keys) {
        T* dkrow = dk + r * p.dk_layout.token_stride + dk_col0 + 2 * (lane % 4);
        T* dvrow = dv + r * p.dv_layout.token_stride + dv_col0 + 2 * (lane % 4);
#pragma unroll
        for (int f = 0; f < DK_W / 8; ++f) {
          *reinterpret_cast<uint32_t*>(dkrow + f * 8) =
              Mma::pack(acc_dk[mf][f][2 * half] * p.scale, acc_dk[mf][f][2 * half + 1] * p.scale);
        }
#pragma unroll
        for (int f = 0; f < DV_W / 8; ++f) {
          *reinterpret_cast<uint32_t*>(dvrow + f * 8) =
              Mma::pack(acc_dv[mf][f][2 * half], acc_dv[mf][f][2 * half + 1]);
        }
      }
    }
}

}  // namespace portable
}  // namespace raggedattn

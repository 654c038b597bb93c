// The Hopper backward's consumer warpgroups: the step loop over the query tiles (64 rows) of every
// query head of the CTA's GQA group, dK and dV accumulating in registers, and the epilogue. Per
// step, in warpgroup c (the consumers never wait on global memory, atomics or turns):
//   S^T  = K_c Q^T, dP^T = V_c dO^T; P^T and dS^T on the registers   (bwd_scores.cuh)
//   dS^T -> shared memory ([key][query], 128-byte swizzled, bwd_ds_buffers)
//   dV  += P^T dO, dK += dS^T Q   (A from registers, B N-major in shared memory)
//   dQ[:, dq0 .. dq0 + DQN) = dS K over the CTA's keys, into the consumer's slice of the shared
//                                  dQ tile for warp 1, or (DQ_REGS) straight into the scratch by
//                                  vector reductions.
// At D = 128 the products run in the order dV, dQ, dK, and the slice is written while dK runs.
#pragma once

#include <type_traits>

#include "cuda/sm90/bwd_consumer_state.cuh"
#include "cuda/sm90/bwd_epilogue.cuh"
#include "cuda/sm90/bwd_scores.cuh"

namespace raggedattn {
namespace sm90 {

// acc += A B for one k16 step: A (64 x 16) from registers, B (16 x N) N-major in shared memory;
// N is a consumer's dK or dV width (bwd_columns).
template <class T, int N>
__device__ __forceinline__ void accumulate_rs(float (&acc)[N / 8][4], const uint32_t (&a)[4],
                                              uint64_t b) {
  static_assert(N == 192 || N == 128 || N == 64,
                "dK and dV columns per warpgroup: m64n192, m64n128 or m64n64");
  if constexpr (N == 192) {
    rs_m64n192k16_tb<T>(acc, a, b, 1);
  } else if constexpr (N == 128) {
    rs_m64n128k16_tb<T>(acc, a, b, 1);
  } else {
    rs_m64n64k16_tb<T>(acc, a, b, 1);
  }
}

// One dS^T buffer for both consumers (S::kOneDsBuffer): a consumer writes into it at step
// it >= 1 (its dS^T rows, an idle step's zeros, the soft cap's factor) only once the other
// consumer's dQ of step it - 1, which reads all the buffer's rows, has landed. Each arrives on the
// other's barrier (2 + the other's index; 3 - its own) after its dQ of every step but its last,
// and waits on its own before its first write of every step but its first: the arrivals and waits
// pair, and an arrival can run at most one step ahead of its wait (the arriving consumer's next
// arrival comes after the step's dS^T barrier, which the waiting one reaches only after its wait).
// With two buffers, alternating steps, the dS^T barrier orders it. Barrier ids are constants: a
// computed one makes ptxas reserve all 16.
template <class S>
__device__ __forceinline__ void wait_ds_free(const BwdConsumer& me, int it) {
  if constexpr (S::kOneDsBuffer) {
    if (it > 0) {
      if (me.c == 0) {
        named_barrier_sync(2, S::kConsumerThreads);
      } else {
        named_barrier_sync(3, S::kConsumerThreads);
      }
    }
  }
}
template <class S>
__device__ __forceinline__ void release_ds(const BwdConsumer& me, int it, int steps) {
  if constexpr (S::kOneDsBuffer) {
    if (it + 1 < steps) {
      if (me.c == 0) {
        named_barrier_arrive(3, S::kConsumerThreads);
      } else {
        named_barrier_arrive(2, S::kConsumerThreads);
      }
    }
  }
}

// dS^T (a[kc]: four 8x8 tiles, query chunks 2kc and 2kc + 1 for the warp's key rows 0-7 and
// 8-15) into shared memory as [key][query], one 128-byte panel per key row: one stmatrix per kc,
// lane l giving row l % 8 of tile l / 8.
template <class S>
__device__ __forceinline__ void store_ds(const BwdConsumer& me, uint32_t ds_base,
                                         const uint32_t (&a)[S::QSTEPS][4]) {
  BwdConsumer here = me;
  if constexpr (S::kAddressesPerStep) asm volatile("" : "+r"(here.lane));
#pragma unroll
  for (int kc = 0; kc < S::QSTEPS; ++kc) {
    stmatrix_x4(ds_base + swizzled_offset(S::BN, here.stmatrix_row(), 2 * kc + here.lane / 16),
                a[kc]);
  }
  fence_proxy_async_smem();
}

// The shared-memory operands of one step: the dS^T buffer and the Q/dO stage.
struct StepBases {
  uint32_t k, v, ds, q, d_o;
};

// dK += dS^T Q: A = dS^T from registers, B = Q's columns from dk0, N-major (its rows are the
// step's queries).
template <class S, int DKN>
__device__ __forceinline__ void issue_dk(const StepBases& at, int dk0, float (&acc_dk)[DKN / 8][4],
                                         const uint32_t (&a_ds)[S::QSTEPS][4]) {
  const uint64_t q_cols = desc_mn_major(at.q + col_offset(dk0, S::BM), S::BM * kSwizzleBytes);
#pragma unroll
  for (int kc = 0; kc < S::QSTEPS; ++kc) {
    accumulate_rs<typename S::T, DKN>(acc_dk, a_ds[kc],
                                      desc_advance(q_cols, kc * 16 * kSwizzleBytes));
  }
}

// A step that sees keys of this warpgroup: the score products, P^T and dS^T, dS^T into shared
// memory (before dV and dK are issued: a wgmma's register A operand may not be read by other
// instructions while the wgmma is in flight), then dV += P^T dO and dK += dS^T Q issued, in flight
// while the warpgroup waits at the dS^T barrier.
template <class S, int DKN, int DVN>
__device__ __forceinline__ void step_gradients(const BwdParams& p, const BwdCta& cta,
                                               const BwdConsumer& me, const StepBases& at, int buf,
                                               int ds_buf, int m0, int it, int dk0, int dv0,
                                               float (&acc_dk)[DKN / 8][4],
                                               float (&acc_dv)[DVN / 8][4],
                                               uint32_t (&a_ds)[S::QSTEPS][4]) {
  using T = typename S::T;
  constexpr int BM = S::BM;
  constexpr BwdSmem L = S::L;
  const Segment& seg = cta.w.seg;
  const int n0 = cta.w.n0;
  // S^T = K_c Q^T and dP^T = V_c dO^T: 64 rows of K (V) from key0, all 64 rows of Q (dO).
  float st[BM / 8][4], dpt[BM / 8][4];
  wgmma_fence();
  issue_scores<S>(S::DQK / 16, st, desc_k_major(at.k + me.key0 * kSwizzleBytes),
                  desc_k_major(at.q));  // group: S^T
  if constexpr (!S::kScoresInTurn) {
    issue_scores<S>(S::DV / 16, dpt, desc_k_major(at.v + me.key0 * kSwizzleBytes),
                    desc_k_major(at.d_o));  // group: dP^T
  }
  uint32_t a_p[S::QSTEPS][4];
  ScoreStep step;
  step.s_lse = reinterpret_cast<const float*>(cta.smem + L.lse + buf * L.stat_stage);
  step.s_dp = reinterpret_cast<const float*>(cta.smem + L.dpsum + buf * L.stat_stage);
  step.m0 = m0;
  step.whole = p.mask.block_full(m0, m0 + BM, n0, n0 + S::BN, seg.len_q, seg.len_kv);
  step.key_row = n0 + me.row_a;
  step.seg = &seg;
  if constexpr (S::kScoresInTurn) {
    // This warp's rows of this step's dS^T buffer hold the soft cap's factor until dP^T lands.
    uint32_t* w_slot = reinterpret_cast<uint32_t*>(cta.smem + L.ds + ds_buf * L.ds_stage +
                                                   (me.key0 + me.warp_in_wg * 16) * kSwizzleBytes);
    wgmma_wait<0>();
    pin(st);
    wait_ds_free<S>(me, it);  // before the soft cap's factor or dS^T goes into a single buffer
    if (p.softcap > 0.f) {
      probabilities_in_turn<S, true>(p, step, st, a_p, w_slot, me.lane);
    } else {
      probabilities_in_turn<S, false>(p, step, st, a_p, w_slot, me.lane);
    }
    wgmma_fence();
    issue_scores<S>(S::DV / 16, dpt, desc_k_major(at.v + me.key0 * kSwizzleBytes),
                    desc_k_major(at.d_o));  // group: dP^T
    wgmma_wait<0>();
    pin(dpt);
    ds_in_turn<S>(step, p.softcap > 0.f, dpt, a_p, a_ds, w_slot, me.lane);
  } else {
    wait_ds_free<S>(me, it);
    if (p.softcap > 0.f) {
      scores_to_operands<S, true>(p, step, st, dpt, a_p, a_ds, me.lane);
    } else {
      scores_to_operands<S, false>(p, step, st, dpt, a_p, a_ds, me.lane);
    }
  }
  store_ds<S>(me, at.ds, a_ds);
  // dV += P^T dO (B N-major: its rows are this step's queries, its columns this warpgroup's
  // columns of dV, from dv0), and dK += dS^T Q here too unless it follows dQ (S::kDkAfterDq).
  wgmma_fence();
  const uint64_t do_cols = desc_mn_major(at.d_o + col_offset(dv0, BM), BM * kSwizzleBytes);
#pragma unroll
  for (int kc = 0; kc < S::QSTEPS; ++kc) {
    accumulate_rs<T, DVN>(acc_dv, a_p[kc], desc_advance(do_cols, kc * 16 * kSwizzleBytes));
  }
  if constexpr (!S::kDkAfterDq) issue_dk<S, DKN>(at, dk0, acc_dk, a_ds);
  wgmma_commit();
}

// One part of a step's dQ (DQP columns from col0) out of the registers: into the shared dQ tile
// in the scratch's element type and tile order (DqAccumLayout::Wgmma64: this thread's four
// elements of each 8-column panel are one vector, the warpgroup's 128 vectors of a panel
// contiguous), the bulk reduce's source; or (DQ_REGS) added into the 16-bit scratch from here,
// one vector reduction per panel.
template <class S, int DQP>
__device__ __forceinline__ void write_dq_part(const BwdParams& p, const BwdCta& cta,
                                              const BwdConsumer& me, const float (&dq)[DQP / 8][4],
                                              int col0, int m0, int qh) {
  using T = typename S::T;
  using Mma = typename S::Mma;
  int lane = me.lane;
  if constexpr (S::kAddressesPerStep) asm volatile("" : "+r"(lane));
  const int32_t at0 =
      DqAccumLayout::fragment_index(me.warp_in_wg * 16 + lane / 4, col0 + 2 * (lane % 4));
  if (!S::DQ_REGS && p.dq_accum.type == AccumType::F32) {
    float* dst = reinterpret_cast<float*>(cta.smem + S::L.dq) + at0;
#pragma unroll
    for (int f = 0; f < DQP / 8; ++f) {
      *reinterpret_cast<float4*>(dst + f * DqAccumLayout::kPanelElems) =
          make_float4(dq[f][0], dq[f][1], dq[f][2], dq[f][3]);
    }
  } else {
    // The 16-bit scratch is in the input's own format (the Plan's AccumType); DQ_REGS takes no
    // other: the tile's vector at0 of panel 0 in the scratch.
    T* dst = S::DQ_REGS
                 ? static_cast<T*>(p.dq_accum_ptr) +
                       p.dq_accum.offset(0, cta.b, cta.w.seg.cu_q, cta.hk * p.group + qh, m0) + at0
                 : reinterpret_cast<T*>(cta.smem + S::L.dq) + at0;
#pragma unroll
    for (int f = 0; f < DQP / 8; ++f) {
      T* v = dst + f * DqAccumLayout::kPanelElems;
      const uint32_t lo = Mma::pack(dq[f][0], dq[f][1]), hi = Mma::pack(dq[f][2], dq[f][3]);
      if constexpr (S::DQ_REGS) {
        red_add(v, lo, hi);
      } else {
        *reinterpret_cast<uint2*>(v) = make_uint2(lo, hi);
      }
    }
  }
}

// The step's dQ[:, dq0 .. dq0 + DQN) = dS K: A = dS^T read M-major (queries contiguous), B = K's
// columns from dq0 read N-major (D = 64: both halves in panel 0, warpgroup 1's starting 64 bytes
// into each row; otherwise whole panels); k16 steps over the CTA's keys. The first k-step
// overwrites the accumulators (scale-d 0). In parts of DQP columns, each written out before the
// next is issued, where the consumer's dK and dV accumulators leave no room for all DQN (key split
// at Dqk 192: 32 of 96 at a time). Where dK follows dQ (S::kDkAfterDq) it is issued here, from
// a_ds, and runs while dQ is written out; `gradients` is false on an idle step (no dV or dK). The
// Q/dO stage is released once dV and dK have landed.
template <class S, int DKN, int DVN, int DQN>
__device__ __forceinline__ void step_dq(const BwdParams& p, const BwdCta& cta,
                                        const BwdConsumer& me, const StepBases& at, int buf, int it,
                                        int m0, int qh, int dk0, int dq0, bool gradients,
                                        float (&acc_dk)[DKN / 8][4], float (&acc_dv)[DVN / 8][4],
                                        const uint32_t (&a_ds)[S::QSTEPS][4]) {
  using T = typename S::T;
  auto release_stage = [&]() {
    pin(acc_dv);
    pin(acc_dk);
    mbar_arrive(&cta.bars.empty[buf]);  // this thread's reads of the Q/dO stage are complete
  };
  if constexpr (!S::kDkAfterDq) {
    wgmma_wait<0>();
    release_stage();
  }
  constexpr int DQP = S::kScoresInTurn ? 32 : DQN;
  static_assert(DQN % DQP == 0 && (DQP == 128 || DQP == 64 || DQP == 32),
                "dQ's columns in whole parts of one wgmma N");
  static_assert(!S::kDkAfterDq || DQP == DQN, "dK follows dQ's only part");
  const uint64_t ds_rows = desc_mn_major(at.ds, S::BN * kSwizzleBytes);
#pragma unroll
  for (int part = 0; part < DQN / DQP; ++part) {
    const int col0 = dq0 + part * DQP;
    float dq[DQP / 8][4];
    const uint64_t k_cols = desc_mn_major(at.k + col_offset(col0, S::BN), S::BN * kSwizzleBytes);
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < S::NSTEPS; ++kc) {
      const uint64_t da = desc_advance(ds_rows, kc * 16 * kSwizzleBytes);
      const uint64_t db = desc_advance(k_cols, kc * 16 * kSwizzleBytes);
      if constexpr (DQP == 128) {
        ss_m64n128k16_tab<T>(dq, da, db, kc > 0 ? 1 : 0);
      } else if constexpr (DQP == 64) {
        ss_m64n64k16_tab<T>(dq, da, db, kc > 0 ? 1 : 0);
      } else {
        ss_m64n32k16_tab<T>(dq, da, db, kc > 0 ? 1 : 0);
      }
    }
    wgmma_commit();
    if constexpr (S::kDkAfterDq) {
      if (gradients) {
        issue_dk<S, DKN>(at, dk0, acc_dk, a_ds);
        wgmma_commit();
        wgmma_wait<1>();  // dV and dQ have landed; dK runs on
      } else {
        wgmma_wait<0>();
      }
    } else {
      wgmma_wait<0>();
    }
    pin(dq);
    pin(acc_dv);
    if (part + 1 == DQN / DQP) release_ds<S>(me, it, cta.w.steps);  // this step's dS^T is read
    // This consumer's slice of the shared dQ tile once warp 1 has read out the previous one.
    if (!S::DQ_REGS && part == 0 && it > 0) mbar_wait(&cta.bars.dq_empty[me.c], (it - 1) & 1);
    write_dq_part<S, DQP>(p, cta, me, dq, col0, m0, qh);
  }
  if constexpr (!S::DQ_REGS) {
    fence_proxy_async_smem();  // visible to the bulk reduce (async proxy)
    mbar_arrive(&cta.bars.dq_full[me.c]);
  }
  if constexpr (S::kDkAfterDq) {
    wgmma_wait<0>();  // dK has landed
    release_stage();
  }
}

// The consumer's loop and epilogue for its columns (bwd_columns): DKN, DVN and DQN columns of dK,
// dV and dQ (the accumulators' widths, compile-time), from dk0, dv0 and dq0.
template <class S, int DKN, int DVN, int DQN>
__device__ __forceinline__ void bwd_consumer(const BwdParams& p, const BwdCta& cta,
                                             const BwdConsumer& me, int dk0, int dv0, int dq0) {
  constexpr int BM = S::BM;
  constexpr BwdSmem L = S::L;
  const gpu::KeyTileWork& w = cta.w;
  const Segment& seg = w.seg;
  const int n_it = w.steps;
  float acc_dk[DKN / 8][4], acc_dv[DVN / 8][4];
#pragma unroll
  for (int f = 0; f < DKN / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[f][e] = 0.f;
#pragma unroll
  for (int f = 0; f < DVN / 8; ++f)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dv[f][e] = 0.f;

  // The query rows that see any of this warpgroup's keys inside the segment, [seen_lo, seen_hi)
  // (MaskSpec::query_rows); empty where the warpgroup has no key inside the segment. Two
  // registers for the loop (a test on the key range per step spills more).
  int seen_lo = 0, seen_hi = 0;
  if constexpr (!S::SPLIT) {
    const int k_lo = w.n0 + me.key0, k_hi = w.n0 + min(w.keys, me.key0 + 64);
    if (k_hi > k_lo) {
      const MaskSpec::RowSpan seen = p.mask.query_rows(k_lo, k_hi - k_lo, seg.len_q, seg.len_kv);
      seen_lo = seen.begin;
      seen_hi = seen.end;
    }
  }
  if (n_it > 0) mbar_wait(cta.bars.kv_full, 0);
  for (int it = 0, qt = w.m_rot, qh = 0; it < n_it; ++it, w.next_step(qt, qh)) {
    const int buf = it % S::STAGES;
    mbar_wait(&cta.bars.full[buf], (it / S::STAGES) & 1);
    const int m0 = (w.m_first + qt) * BM;  // as warp 0 counts them
    // dS^T buffer: key split, alternating steps where there are two (both warpgroups read both
    // halves); column split, this warpgroup's own copy.
    const int ds_buf = S::SPLIT ? me.c : L.ds_buffers == 2 ? (it & 1) : 0;
    // Shared-memory bases, opaque to the compiler here: otherwise it hoists the loop-invariant
    // operand descriptors (16 for K and V, 8 for dQ's K, 64 bits each) out of the loop and keeps
    // them in registers that the accumulators need.
    StepBases at{me.k_addr, me.v_addr, me.ds_addr + ds_buf * uint32_t(L.ds_stage),
                 me.q_addr + buf * uint32_t(L.q_stage), me.do_addr + buf * uint32_t(L.do_stage)};
    asm volatile("" : "+r"(at.k), "+r"(at.v), "+r"(at.ds), "+r"(at.q), "+r"(at.d_o));

    // An idle step (key split only): no row of the step sees any of this warpgroup's keys inside
    // the segment (a causal diagonal key tile's first query tile, for warpgroup 1; keys past the
    // segment's end). P^T and dS^T are then zero: no score products, no dV or dK, the
    // warpgroup's dS^T rows in shared memory set to zero for the other's dQ, and only its dQ
    // columns computed.
    const bool idle = !S::SPLIT && (min(m0 + BM, seg.len_q) <= seen_lo || m0 >= seen_hi);
    uint32_t a_ds[S::QSTEPS][4];  // dS^T packed: dK's A operand
    if (idle) {
      wait_ds_free<S>(me, it);
      const uint32_t zero[S::QSTEPS][4] = {};
      store_ds<S>(me, at.ds, zero);
    } else {
      step_gradients<S, DKN, DVN>(p, cta, me, at, buf, ds_buf, m0, it, dk0, dv0, acc_dk, acc_dv,
                                  a_ds);
    }
    if constexpr (S::SPLIT) {
      // This warpgroup's dS^T rows are in (its own copy). Constant ids, as above.
      if (me.c == 0) {
        named_barrier_sync(2, 128);
      } else {
        named_barrier_sync(3, 128);
      }
    } else {
      named_barrier_sync(1, S::kConsumerThreads);  // both warpgroups' dS^T rows are in
    }
    step_dq<S, DKN, DVN, DQN>(p, cta, me, at, buf, it, m0, qh, dk0, dq0, !idle, acc_dk, acc_dv,
                              a_ds);
  }
  bwd_epilogue<S, DKN, DVN>(p, cta, me, acc_dk, acc_dv, dk0, dv0);
}

}  // namespace sm90
}  // namespace raggedattn

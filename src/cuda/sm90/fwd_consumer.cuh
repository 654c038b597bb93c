// The Hopper forward's consumer role: one consumer warpgroup's part of a work item (the key loop
// over the K/V ring, the online softmax, the ping-pong of turns with the other consumer), then
// the item's O and LSE.
#pragma once

#include "core/sm90_shapes.hpp"
#include "cuda/common/fwd_work.cuh"
#include "cuda/common/math.cuh"
#include "cuda/common/params.hpp"
#include "cuda/common/warp.cuh"
#include "cuda/sm90/fwd_epilogue.cuh"
#include "cuda/sm90/fwd_producer.cuh"
#include "cuda/sm90/hopper.cuh"
#include "cuda/sm90/wgmma_ops.hpp"

namespace raggedattn {
namespace sm90 {

using gpu::FwdParams;

// Ping-pong between the two consumers (FlashAttention-3's inter-warpgroup schedule): a consumer
// issues its products only in its turn (barrier 2 + its index, completed by the other consumer's
// arrival) and hands the turn over right after issuing, so one consumer's softmax runs while the
// other's products occupy the tensor cores. Barrier ids are constants: a computed one makes ptxas
// reserve all 16. In fwd_consume each consumer has n_tiles + 1 issue phases per item (S_0; S_i
// with P_{i-1} V_{i-1}; the last P V), so the turns stay paired.
//   Grid kernel: consumer 1 hands consumer 0 the first turn at the item's start and does not
//     pass on its last turn (no barrier is left half-arrived when the CTA exits).
//   Persistent kernel: consumer 1 passes on its last turn too, right after issuing its last
//     P V, so consumer 0 may issue the next item's S_0 while consumer 1 still runs this item's
//     epilogue (and its wait for the next item); that pass is the next item's first turn, the
//     kernel gives consumer 0 the CTA's very first one and consumer 0 takes the last pass
//     before it exits (fwd_persistent_kernel; kTurnAcrossItems).
__device__ __forceinline__ void my_turn(int cw) {
  if (cw == 0) {
    named_barrier_sync(2, 256);
  } else {
    named_barrier_sync(3, 256);
  }
}
__device__ __forceinline__ void pass_turn(int cw) {
  if (cw == 0) {
    named_barrier_arrive(3, 256);
  } else {
    named_barrier_arrive(2, 256);
  }
}
// A consumer with no row inside the segment (a segment's last tile of at most 64 rows, for
// consumer 1): the item's barrier protocol only, every wait, turn and release as fwd_consume's
// loop has them, in the same order, with no product (the other consumer's then have the tensor
// cores to themselves) and nothing to store.
template <int STAGES, bool SPLIT, bool kPersistent>
__device__ __forceinline__ void fwd_idle_item(const KvRing& ring, int g, int n_tiles, int cw,
                                              uint64_t* q_empty) {
  constexpr bool kTurnAcrossItems = kPersistent;
  for (int i = 0; i < n_tiles; ++i) {
    const int gi = g + i, stage = gi % STAGES;
    mbar_wait(&ring.full_k[stage], (gi / STAGES) & 1);
    if (i > 0) {
      if constexpr (SPLIT) mbar_wait(&ring.full_v[(gi - 1) % STAGES], ((gi - 1) / STAGES) & 1);
    }
    my_turn(cw);
    pass_turn(cw);
    if constexpr (SPLIT) mbar_arrive(&ring.empty_k[stage]);
    if (i > 0) mbar_arrive(&ring.empty_v[(gi - 1) % STAGES]);
  }
  const int idle_last = (g + n_tiles - 1) % STAGES;
  if constexpr (SPLIT) mbar_wait(&ring.full_v[idle_last], ((g + n_tiles - 1) / STAGES) & 1);
  my_turn(cw);
  if (kTurnAcrossItems || cw == 0) pass_turn(cw);
  mbar_arrive(&ring.empty_v[idle_last]);
  if constexpr (kPersistent) mbar_arrive(q_empty);  // done with the Q buffer
}
// Mask and online softmax of one score tile (keys from n0) for this thread's two rows, row_a and
// row_a + 8 of the CTA tile from query m0: P in place of the scores, the row statistics updated,
// and alpha, the factor O must be rescaled by before P V is added (applied by the caller: O may
// still be in flight in the previous P V meanwhile). The scores reach the log2 domain inside the
// exponent, exp2(s * to_log2 - max), one FFMA per score (the row maximum is taken on the unscaled
// scores: the factor is positive), except under a softcap, whose tanh pass leaves them in the
// log2 domain already.
template <int BM, int BN>
__device__ __forceinline__ void online_softmax(const FwdParams& p, const Segment& seg, int m0,
                                               int n0, int row_a, int lane,
                                               float (&sc)[BN / 8][4], float (&row_max)[2],
                                               float (&row_sum)[2], float (&alpha)[2]) {
  constexpr int NF = BN / 8;
  float to_log2 = p.scale_log2;
  if (p.softcap > 0.f) {
    const float pre = p.scale / p.softcap, post = p.softcap * gpu::kLog2e;
#pragma unroll
    for (int f = 0; f < NF; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[f][e] = gpu::fast_tanh(sc[f][e] * pre) * post;
    to_log2 = 1.f;
  }
  if (!p.mask.block_full(m0, m0 + BM, n0, n0 + BN, seg.len_q, seg.len_kv)) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i_row = m0 + row_a + 8 * half;
      const int lo = p.mask.key_begin(i_row, seg.len_q, seg.len_kv);
      const int hi = p.mask.key_end(i_row, seg.len_q, seg.len_kv);
#pragma unroll
      for (int f = 0; f < NF; ++f)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = n0 + f * 8 + 2 * (lane % 4) + e;
          if (j < lo || j >= hi) sc[f][2 * half + e] = -INFINITY;
        }
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = -INFINITY;
#pragma unroll
    for (int f = 0; f < NF; ++f) mx = fmaxf(mx, fmaxf(sc[f][2 * half], sc[f][2 * half + 1]));
    mx = fmaxf(row_max[half], gpu::quad_max(mx) * to_log2);
    const float base = mx == -INFINITY ? 0.f : mx;  // a row with nothing visible yet
    alpha[half] = gpu::fast_exp2(row_max[half] - base);
    row_max[half] = mx;
    float sum = 0.f;
#pragma unroll
    for (int f = 0; f < NF; ++f)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pr = gpu::fast_exp2(fmaf(sc[f][2 * half + e], to_log2, -base));
        sc[f][2 * half + e] = pr;
        sum += pr;
      }
    row_sum[half] = row_sum[half] * alpha[half] + sum;
  }
}

// O rescaled by alpha (its rows' factors) and P packed from the scores into the register A
// operand of P V.
template <class T, int BN, int DV>
__device__ __forceinline__ void rescale_and_pack_p(const float (&alpha)[2],
                                                   const float (&sc)[BN / 8][4],
                                                   float (&acc_o)[DV / 8][4],
                                                   uint32_t (&a)[BN / 16][4]) {
  using Mma = gpu::MmaType<T>;
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int f = 0; f < DV / 8; ++f) {
      acc_o[f][2 * half] *= alpha[half];
      acc_o[f][2 * half + 1] *= alpha[half];
    }
#pragma unroll
  for (int kc = 0; kc < BN / 16; ++kc) {
    a[kc][0] = Mma::pack(sc[2 * kc][0], sc[2 * kc][1]);
    a[kc][1] = Mma::pack(sc[2 * kc][2], sc[2 * kc][3]);
    a[kc][2] = Mma::pack(sc[2 * kc + 1][0], sc[2 * kc + 1][1]);
    a[kc][3] = Mma::pack(sc[2 * kc + 1][2], sc[2 * kc + 1][3]);
  }
}

// O += P V over the first `ksteps` k-steps of 16 keys (the keys past them have P = 0), P from
// registers (a), V's stage at v_stage_addr read N-major.
template <class T, int BN, int DV>
__device__ __forceinline__ void issue_pv_products(uint32_t v_stage_addr, int ksteps,
                                                  const uint32_t (&a)[BN / 16][4],
                                                  float (&acc_o)[DV / 8][4]) {
  const uint64_t v_desc = desc_mn_major(v_stage_addr, BN * kSwizzleBytes);
#pragma unroll
  for (int kc = 0; kc < BN / 16; ++kc) {
    if (kc >= ksteps) break;
    const uint64_t db = desc_advance(v_desc, kc * 16 * kSwizzleBytes);
    if constexpr (DV == 256) {
      rs_m64n256k16_tb<T>(acc_o, a[kc], db, 1);
    } else if constexpr (DV == 128) {
      rs_m64n128k16_tb<T>(acc_o, a[kc], db, 1);
    } else {
      rs_m64n64k16_tb<T>(acc_o, a[kc], db, 1);
    }
  }
}

// S = Q K^T for consumer cw's 64 rows of the BM-row Q buffer at q_addr, K's stage `stage` (BN
// keys, k_stage_bytes apart from k_addr): the first QREG k-steps take Q from registers (qa), the others from the buffer.
// kOpaqueQ: the Q address hidden from the compiler, which otherwise keeps the DQK / 16
// loop-invariant Q descriptors (64 bits each) in registers across the key loop (past D = 128
// and in the persistent kernel, that spills).
template <class T, int BM, int BN, int DQK, int QREG, bool kOpaqueQ>
__device__ __forceinline__ void issue_s_products(uint32_t q_addr, uint32_t k_addr, int stage,
                                                 uint32_t k_stage_bytes, int cw,
                                                 uint32_t (&qa)[QREG > 0 ? QREG : 1][4],
                                                 float (&sc)[BN / 8][4]) {
  constexpr int KSTEPS = DQK / 16;
  uint32_t q_base = q_addr;
  if constexpr (kOpaqueQ) asm volatile("" : "+r"(q_base));
  const uint64_t q_desc = desc_k_major(q_base + cw * 64 * kSwizzleBytes);
  const uint64_t k_desc = desc_k_major(k_addr + stage * k_stage_bytes);
#pragma unroll
  for (int kk = 0; kk < KSTEPS; ++kk) {
    const uint32_t panel = kk / 4, within = (kk % 4) * 32;
    const uint64_t db = desc_advance(k_desc, panel * BN * kSwizzleBytes + within);
    if (kk < QREG) {  // known at compile time (the loop is unrolled)
      uint32_t(&qk)[4] = qa[kk < QREG ? kk : 0];
      if constexpr (BN == 128) {
        rs_m64n128k16<T>(sc, qk, db, kk > 0 ? 1 : 0);
      } else {
        rs_m64n64k16<T>(sc, qk, db, kk > 0 ? 1 : 0);
      }
      continue;
    }
    const uint64_t da = desc_advance(q_desc, panel * BM * kSwizzleBytes + within);
    if constexpr (BN == 128) {
      ss_m64n128k16<T>(sc, da, db, kk > 0 ? 1 : 0);
    } else {
      ss_m64n64k16<T>(sc, da, db, kk > 0 ? 1 : 0);
    }
  }
}

// The first QREG k16 steps' Q fragments (the A operand of S's RS wgmma) for consumer cw's rows of
// the swizzled BM-row Q tile at q_addr, by ldmatrix: lanes 0-15 address the warp's 16 rows at a
// step's first 8 columns, lanes 16-31 at its last 8 (the A fragment's four 8x8 tiles).
template <int BM, int QREG>
__device__ __forceinline__ void load_q_fragments(uint32_t q_addr, int cw, int warp_in_wg,
                                                 int lane, uint32_t (&qa)[QREG][4]) {
  const int q_row = cw * 64 + warp_in_wg * 16 + lane % 16;
#pragma unroll
  for (int kk = 0; kk < QREG; ++kk) {
    gpu::ldmatrix_x4(qa[kk], q_addr + swizzled_offset(BM, q_row, 2 * kk + lane / 16));
  }
}

// A consumer warpgroup's part of one work item (its 64 query rows of the item's tile w, query
// head h) with Q in shared memory (Q buffer q_buf; the first fwd_q_reg_ksteps k-steps of S read it
// from registers, loaded once per item): the key loop over the item's K/V tiles, which
// are the CTA's K/V tiles g, g + 1, ... (stage (g + i) % STAGES), then O and LSE. kPersistent: the
// persistent kernel's buffers (fwd_config / fwd_smem with persistent set), arrive on q_empty once
// done with the Q buffer (the producer may then replace Q: after O has gone out through it, or,
// where Q has a single buffer, once the item's last score product has landed), and keep the Q
// address opaque at every head dim (the item loop around this otherwise spills at D = 128).
// Returns the number of K/V tiles consumed.
template <class T, int DQK, int DV, bool kPersistent>
__device__ __forceinline__ int fwd_consume(const FwdParams& p, unsigned char* smem,
                                           const gpu::QueryTileWork& w, int h, int g, int q_buf,
                                           const KvRing& ring, uint64_t* q_empty) {
  constexpr FwdConfig C = fwd_config(DQK, DV, kPersistent);
  constexpr int BM = C.block_m, BN = C.block_n, STAGES = C.stages;
  constexpr bool SPLIT = fwd_kv_split(DQK, DV, kPersistent);  // K and V on barriers of their own
  constexpr int NF = BN / 8;                                  // n8 fragments of a score row block
  constexpr int OF = DV / 8;  // n8 fragments of the output row block (one m64nDV accumulator)
  constexpr int KSTEPS = DQK / 16;
  constexpr FwdSmem L = fwd_smem(DQK, DV, kPersistent);
  static_assert(DV == 64 || DV == 128 || DV == 256, "P V is one m64nDV instruction per 16 keys");
  static_assert(BN == 64 || BN == 128, "S is one m64n(BN) instruction per 16 head-dim columns");

  const int tid = threadIdx.x, lane = tid % 32;
  // The consumer warpgroup, read through a shuffle from lane 0 so that the compiler knows it is
  // warp-uniform: the Q descriptors made from it then stay in uniform registers.
  const int cw = __shfl_sync(0xffffffffu, tid / 128 - 1, 0), warp_in_wg = (tid % 128) / 32;
  const uint32_t q_addr = gpu::smem_addr(smem + L.q + q_buf * L.q_stage);
  const uint32_t k_addr = gpu::smem_addr(smem + L.k);
  const uint32_t v_addr = gpu::smem_addr(smem + L.v);
  const Segment seg = w.seg;
  const int m0 = w.m0, rows = w.rows;
  const TileSpan kt = gpu::key_tiles<BN>(w);
  const int n_first = kt.first, n_tiles = kt.count;
  T* o = static_cast<T*>(p.o) + p.o_layout.offset(seg.q_row0 + m0, h);
  float* lse = p.lse + p.stats.offset(h, seg.q_row0 + m0);
  const int64_t o_stride = p.o_layout.token_stride;

  float acc_o[OF][4];
  float row_max[2], row_sum[2];
#pragma unroll
  for (int f = 0; f < OF; ++f) acc_o[f][0] = acc_o[f][1] = acc_o[f][2] = acc_o[f][3] = 0.f;
  row_max[0] = row_max[1] = -INFINITY;
  row_sum[0] = row_sum[1] = 0.f;
  // This thread's rows in the CTA tile (the wgmma accumulator layout).
  const int row_a = cw * 64 + warp_in_wg * 16 + lane / 4;

  uint32_t a[BN / 16][4];  // P of the current tile, the register A operand of P V
  float sc[NF][4];
  // The first kQRegSteps k16 steps of S = Q K^T take Q's fragments from registers (the RS
  // wgmma; fwd_q_reg_ksteps), loaded once per item. The other steps read Q from shared memory.
  constexpr int kQRegSteps = fwd_q_reg_ksteps(DQK, kPersistent);
  static_assert(kQRegSteps >= 0 && kQRegSteps <= KSTEPS, "Q's register steps are steps of S");
  uint32_t qa[kQRegSteps > 0 ? kQRegSteps : 1][4];
  if constexpr (kQRegSteps > 0) load_q_fragments<BM, kQRegSteps>(q_addr, cw, warp_in_wg, lane, qa);
  // This consumer's rows inside the segment (none: a segment's last tile of at most 64 rows, for
  // consumer 1) and, on the item's last key tile, the keys its rows see from the tile's first key
  // (causal: consumer 0 sees at most the first 64 keys of the diagonal tile). Both ends of the
  // mask's band are non-decreasing in the row (mask.hpp), so the consumer's last row inside the
  // segment bounds them. Uniform over the warpgroup.
  const int cw_rows = min(64, rows - cw * 64);
  const int last_keys =
      cw_rows > 0
          ? max(0, min(BN, p.mask.key_end(m0 + cw * 64 + cw_rows - 1, seg.len_q, seg.len_kv) -
                               (n_first + n_tiles - 1) * BN))
          : 0;
  // Each product makes one descriptor per operand and advances it per k-step (desc_advance).
  // P V with its first `ksteps` k-steps of 16 keys (the keys past them have P = 0). Only the last
  // P V, a wgmma stage of its own, takes fewer than all: a k-step count chosen at run time inside
  // the loop's stage (or a narrower S) made ptxas serialize the wgmmas (C7515).
  constexpr int kAllKsteps = BN / 16;
  auto issue_pv = [&](int stage, int ksteps) {
    issue_pv_products<T, BN, DV>(v_addr + stage * uint32_t(L.v_stage), ksteps, a, acc_o);
  };
  auto issue_s = [&](int stage) {
    issue_s_products<T, BM, BN, DQK, kQRegSteps, (kPersistent || DQK > 128)>(
        q_addr, k_addr, stage, uint32_t(L.k_stage), cw, qa, sc);
  };
  auto wait_products = [&]() {
    wgmma_wait<0>();
    pin(sc);
    pin(acc_o);
  };
  // Mask and online softmax of S_i (online_softmax): P_i in place of the scores, and alpha.
  float alpha[2];
  auto softmax = [&](int i) {
    online_softmax<BM, BN>(p, seg, m0, (n_first + i) * BN, row_a, lane, sc, row_max, row_sum,
                           alpha);
  };
  auto rescale_and_pack = [&]() { rescale_and_pack_p<T, BN, DV>(alpha, sc, acc_o, a); };
  // Tile 0's scores and softmax; then per tile i >= 1: S_i and P_{i-1} V_{i-1} issued together,
  // the softmax of S_i while P_{i-1} V_{i-1} still runs on the tensor cores, then O rescaled and
  // P_i packed once it has landed. One score tile is live at a time.
  // The turns as my_turn's comment has them (kTurnAcrossItems: the persistent kernel's).
  static_assert(C.consumers == 2, "the ping-pong pairs two consumers");
  constexpr bool kTurnAcrossItems = kPersistent;
  if (!kTurnAcrossItems && cw == 1) named_barrier_arrive(2, 256);  // consumer 0 goes first
  if (cw_rows <= 0) {
    fwd_idle_item<STAGES, SPLIT, kPersistent>(ring, g, n_tiles, cw, q_empty);
    return n_tiles;
  }
  mbar_wait(&ring.full_k[g % STAGES], (g / STAGES) & 1);
  my_turn(cw);
  wgmma_fence();
  issue_s(g % STAGES);
  wgmma_commit();
  pass_turn(cw);
  wait_products();
  // This thread's reads of tile 0's K are complete (where K has barriers of its own).
  if constexpr (SPLIT) mbar_arrive(&ring.empty_k[g % STAGES]);
  softmax(0);
  rescale_and_pack();
  for (int i = 1; i < n_tiles; ++i) {
    const int gi = g + i, stage = gi % STAGES, prev = (gi - 1) % STAGES;
    mbar_wait(&ring.full_k[stage], (gi / STAGES) & 1);
    if constexpr (SPLIT) mbar_wait(&ring.full_v[prev], ((gi - 1) / STAGES) & 1);
    my_turn(cw);
    wgmma_fence();
    issue_s(stage);
    wgmma_commit();
    issue_pv(prev, kAllKsteps);
    wgmma_commit();
    pass_turn(cw);
    wgmma_wait<1>();  // S_i has landed; P_{i-1} V_{i-1} may still run
    pin(sc);
    if constexpr (SPLIT) mbar_arrive(&ring.empty_k[stage]);  // tile i's K read
    softmax(i);
    wgmma_wait<0>();
    pin(acc_o);
    mbar_arrive(&ring.empty_v[prev]);  // tile i - 1's V (its whole stage where not apart) read
    rescale_and_pack();
  }
  // O goes out through the Q buffer unless that would hold a single-buffered persistent Q back
  // (its next item's Q loads while this item's last product and epilogue run).
  constexpr bool kStageO = !kPersistent || L.q_buffers > 1;
  if constexpr (kPersistent && !kStageO) {
    mbar_arrive(q_empty);  // every score product of this item has landed: Q may be replaced
  }
  const int last = (g + n_tiles - 1) % STAGES;
  if constexpr (SPLIT) mbar_wait(&ring.full_v[last], ((g + n_tiles - 1) / STAGES) & 1);
  my_turn(cw);
  wgmma_fence();
  issue_pv(last, (last_keys + 15) / 16);
  wgmma_commit();
  const float sink2 = gpu::sink_log2(p, h);  // its load overlaps the last product
  // Consumer 1's last phase comes after consumer 0's: in the grid kernel no turn is left; in the
  // persistent one its pass is consumer 0's first turn of the next item.
  if (kTurnAcrossItems || cw == 0) pass_turn(cw);
  wgmma_wait<0>();
  pin(acc_o);
  mbar_arrive(&ring.empty_v[last]);

  // Epilogue (fwd_epilogue.cuh): LSE, then O, staged through this consumer's rows of the Q buffer
  // where kStageO (its score products have all landed).
  static_assert(DV <= DQK, "O's 64 rows fit the consumer's rows of the Q buffer");
  float inv[2];
  finish_rows(row_max, row_sum, sink2, lse, rows, row_a, lane, inv);
  if constexpr (!kStageO) {
    store_o_direct<T, DV>(acc_o, inv, o, o_stride, rows, row_a, lane);
  } else {
    stage_o<T, BM, DV>(acc_o, inv, q_addr, cw, warp_in_wg, lane);
    named_barrier_sync(5 + cw, 128);  // this consumer's O rows are in shared memory
    constexpr int CH = DV / 8;        // 16-byte chunks of an O row
#pragma unroll 4
    for (int k = 0; k < 64 * CH / 128; ++k) {
      const int i = (tid % 128) + k * 128, r = cw * 64 + i / CH, c = i % CH;
      if (r < rows) {
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(q_addr + swizzled_offset(BM, r, c)));
        *reinterpret_cast<uint4*>(o + r * o_stride + c * 8) = v;
      }
    }
    if constexpr (kPersistent) {
      mbar_arrive(q_empty);  // this consumer is done with the Q buffer (its O rows read back)
    }
  }
  return n_tiles;
}

}  // namespace sm90
}  // namespace raggedattn

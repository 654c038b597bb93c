// Forward kernels of the Hopper path (sm_90a), two schedules over the same work items (query
// tile of a segment, query head) and the same consumer code (fwd_consume):
//   fwd_kernel             one CTA per item, grid (tiles x group, KV heads): the hardware's
//                          block dispatch. The Plan's choice where documents are long.
//   fwd_persistent_kernel  one CTA per SM taking items from a counter (its first from its CTA
//                          index): barriers and register split set up once per SM, the next
//                          item's loads overlapping the current one's last product and epilogue.
//                          The Plan's choice where the longest document is short
//                          (policy::fwd_ctas).
// Warp-specialized: a producer warpgroup copies Q and the K/V tiles into shared memory by TMA (a
// segment's partial last K/V tile too, its rows past the segment zeroed after), a ring of K/V
// stages handed over with mbarriers; two consumer warpgroups of 64 query rows each run wgmma with
// register accumulators, taking turns to issue their products (ping-pong: one's softmax overlaps
// the other's products).
//
// The tiles and stages per head dims are sm90_shapes.hpp's fwd_config (D = 64, 128, 256, 192/128).
// Per key tile n (128 keys at D = 128), in a consumer:
//   S_n = Q K_n^T        Dqk/16 x wgmma m64n(block_n)k16, both operands from shared memory
//                        (K-major), issued together with P_{n-1} V_{n-1}
//   online softmax       on the S_n registers while P_{n-1} V_{n-1} still runs on the tensor cores
//                        (same fragment layout as mma.sync: the masking and the row statistics
//                        are the portable kernel's); O's rescale is deferred until that product
//                        has landed
//   P_n packed           in registers as the A operand of P_n V_n (issued with S_{n+1}); V read
//                        N-major (transposed) from shared memory
// One score tile is live at a time (FlashAttention-3's intra-warpgroup overlap, here with its
// inter-warpgroup ping-pong).
// The CTA tile map, the tile order (heaviest causal tiles first), the mask band and the outputs
// are the portable forward's; only the matrix products and the shared-memory layout differ.
#pragma once

#include "core/sm90_shapes.hpp"
#include "cuda/common/fwd_work.cuh"
#include "cuda/common/math.cuh"
#include "cuda/common/params.hpp"
#include "cuda/common/warp.cuh"
#include "cuda/sm90/hopper.cuh"
#include "cuda/sm90/wgmma_ops.hpp"

namespace raggedattn {
namespace sm90 {

using gpu::FwdParams;

// The kernels' parameters: the shared forward parameters, the TMA maps (tensor_map.hpp) and, for
// the persistent kernel, the work items' extent (the Plan's LaunchShape) and counter (the
// forward's workspace).
struct FwdTmaParams {
  FwdParams p;
  CUtensorMap q_map;                 // boxes of block_m rows
  CUtensorMap k_map, v_map;          // boxes of block_n rows
  int64_t work_tiles;                // the ragged tile map's index space (LaunchShape::tiles)
  int heads;                         // query heads: work items = work_tiles x heads
  unsigned long long* work_counter;  // items claimed past the first gridDim.x; zero at launch
  // The query tiles' order, most key tiles first (FwdWorkspace::schedule, written by
  // sm90::fwd_lpt_schedule before each launch): work tile i is schedule[i], for every head.
  const TileCoord* schedule;
};

// The K/V ring's barriers. Where K and V are apart (sm90_shapes.hpp's fwd_kv_split;
// FlashAttention-3's two pipelines), a stage's K is free once both consumers' score products with
// it have landed, a step before its V, whose P V is issued with the next tile's scores, so the
// producer loads the next K that much earlier: full_k[s] and full_v[s] complete with the producer
// warpgroup's 128 arrivals (and the TMA bytes), empty_k[s] and empty_v[s] with every consumer
// thread's, four arrays of `stages` barriers from `at`. Otherwise a stage has one full and one
// empty barrier (two arrays), K and V land and are freed together, and full_v, empty_v name full_k,
// empty_k: the code below waits and arrives on the V barriers as it does on the K ones only where
// they are apart. fwd_ring_barriers(...) barriers in all.
struct KvRing {
  uint64_t *full_k, *full_v, *empty_k, *empty_v;
};
template <int DQK, int DV, bool kPersistent>
__device__ __forceinline__ KvRing kv_ring_at(uint64_t* at) {
  constexpr int S = fwd_config(DQK, DV, kPersistent).stages;
  if constexpr (fwd_kv_split(DQK, DV, kPersistent)) {
    static_assert(fwd_ring_barriers(DQK, DV, kPersistent) == 4 * S, "four arrays");
    return KvRing{at, at + S, at + 2 * S, at + 3 * S};
  } else {
    static_assert(fwd_ring_barriers(DQK, DV, kPersistent) == 2 * S, "two arrays");
    return KvRing{at, at, at + S, at + S};
  }
}
template <int DQK, int DV, bool kPersistent>
__device__ __forceinline__ void init_kv_ring(const KvRing& r) {
  constexpr FwdConfig C = fwd_config(DQK, DV, kPersistent);
  for (int s = 0; s < C.stages; ++s) {
    mbar_init(&r.full_k[s], 128);
    mbar_init(&r.empty_k[s], 128 * C.consumers);
    if constexpr (fwd_kv_split(DQK, DV, kPersistent)) {
      mbar_init(&r.full_v[s], 128);
      mbar_init(&r.empty_v[s], 128 * C.consumers);
    }
  }
}

// After the boxes of a partial tile (its `uses`-th use of `partial`): waits for them, then
// the 128 producer threads zero rows [valid, block_n) of each 64-column panel of K and V (a row's
// 128 bytes in a panel, whatever their swizzled order) with 16-byte stores, and meet at named
// barrier 4 (the producer's: no thread starts the barrier's next phase before all have seen this
// one). The caller fences (fence_proxy_async_smem) before arriving on the stage's barrier.
template <int DQK, int DV, bool kPersistent>
__device__ __forceinline__ void fwd_zero_partial_kv(unsigned char* smem, int s, int valid,
                                                    uint64_t* partial, uint32_t uses) {
  constexpr FwdConfig C = fwd_config(DQK, DV, kPersistent);
  constexpr int BN = C.block_n;
  constexpr FwdSmem L = fwd_smem(DQK, DV, kPersistent);
  mbar_wait(partial, uses & 1);
  auto zero_rows = [&](unsigned char* tile, int panels) {
    const int n = (BN - valid) * panels * 8;
    for (int i = threadIdx.x; i < n; i += 128) {
      const int chunk = i % 8, rest = i / 8, panel = rest % panels, r = valid + rest / panels;
      *reinterpret_cast<uint4*>(tile + (panel * BN + r) * kSwizzleBytes + chunk * 16) =
          make_uint4(0u, 0u, 0u, 0u);
    }
  };
  zero_rows(smem + L.k + s * L.k_stage, DQK / 64);
  zero_rows(smem + L.v + s * L.v_stage, DV / 64);
  named_barrier_sync(4, 128);
}

// The producer's copy of K/V tile g, rows [n0, n0 + block_n) of KV head hk, into stage
// g % stages, by TMA (thread 0 issues one box per 64-column panel of each tensor). A whole tile:
// where K and V are apart, K once its stage's K is free (empty_k), completing on full_k's
// transaction count, then V once its V is free (empty_v), on full_v's; otherwise both once the
// stage is free, on full_k's. A segment's partial last tile: both once both are free, completing
// on `partial` (its `partial_uses`-th use), after which fwd_zero_partial_kv clears the rows past
// the segment (they may hold anything, NaN included, and P V would carry it into O; rows past the
// tensor's end arrive as zeros) before the stage's full barriers. All 128 producer threads arrive
// on each full barrier, each once its own writes are visible to the async proxy.
template <int DQK, int DV, bool kPersistent>
__device__ __forceinline__ void fwd_produce_kv(const FwdTmaParams& args, unsigned char* smem,
                                               const KvRing& ring, int g, const Segment& seg,
                                               int hk, int n0, uint64_t* partial,
                                               uint32_t& partial_uses) {
  constexpr FwdConfig C = fwd_config(DQK, DV, kPersistent);
  constexpr int BN = C.block_n, STAGES = C.stages;
  constexpr FwdSmem L = fwd_smem(DQK, DV, kPersistent);
  const int s = g % STAGES;
  const uint32_t freed = ((g / STAGES) - 1) & 1;  // the phase the consumers' release completes
  unsigned char* k_dst = smem + L.k + s * L.k_stage;
  unsigned char* v_dst = smem + L.v + s * L.v_stage;
  const int row = int(seg.kv_row0 + n0);
  auto load_k = [&](uint64_t* boxes) {
#pragma unroll
    for (int panel = 0; panel < DQK / 64; ++panel)
      tma_load_3d(k_dst + panel * BN * kSwizzleBytes, &args.k_map, panel * 64, hk, row, boxes);
  };
  auto load_v = [&](uint64_t* boxes) {
#pragma unroll
    for (int panel = 0; panel < DV / 64; ++panel)
      tma_load_3d(v_dst + panel * BN * kSwizzleBytes, &args.v_map, panel * 64, hk, row, boxes);
  };
  constexpr bool SPLIT = fwd_kv_split(DQK, DV, kPersistent);
  if (seg.len_kv - n0 >= BN) {
    if (g >= STAGES) mbar_wait(&ring.empty_k[s], freed);
    if constexpr (SPLIT) {
      if (threadIdx.x == 0) {
        mbar_expect_tx(&ring.full_k[s], uint32_t(L.k_stage));
        load_k(&ring.full_k[s]);
      }
      mbar_arrive(&ring.full_k[s]);
      if (g >= STAGES) mbar_wait(&ring.empty_v[s], freed);
      if (threadIdx.x == 0) {
        mbar_expect_tx(&ring.full_v[s], uint32_t(L.v_stage));
        load_v(&ring.full_v[s]);
      }
      mbar_arrive(&ring.full_v[s]);
    } else {
      if (threadIdx.x == 0) {
        mbar_expect_tx(&ring.full_k[s], uint32_t(L.k_stage + L.v_stage));
        load_k(&ring.full_k[s]);
        load_v(&ring.full_k[s]);
      }
      mbar_arrive(&ring.full_k[s]);
    }
    return;
  }
  if (g >= STAGES) {
    mbar_wait(&ring.empty_k[s], freed);
    if constexpr (SPLIT) mbar_wait(&ring.empty_v[s], freed);
  }
  if (threadIdx.x == 0) {
    mbar_expect_tx(partial, uint32_t(L.k_stage + L.v_stage));
    load_k(partial);
    load_v(partial);
    mbar_arrive(partial);
  }
  fwd_zero_partial_kv<DQK, DV, kPersistent>(smem, s, seg.len_kv - n0, partial, partial_uses++);
  fence_proxy_async_smem();  // the zeroed rows, visible to wgmma
  mbar_arrive(&ring.full_k[s]);
  if constexpr (SPLIT) mbar_arrive(&ring.full_v[s]);
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
  using Mma = gpu::MmaType<T>;

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
  // wgmma; fwd_q_reg_ksteps), loaded once per item by ldmatrix from the swizzled Q tile: lanes
  // 0-15 address the warp's 16 rows at a step's first 8 columns, lanes 16-31 at its last 8 (the
  // A fragment's four 8x8 tiles). The other steps read Q from shared memory.
  constexpr int kQRegSteps = fwd_q_reg_ksteps(DQK, kPersistent);
  static_assert(kQRegSteps >= 0 && kQRegSteps <= KSTEPS, "Q's register steps are steps of S");
  uint32_t qa[kQRegSteps > 0 ? kQRegSteps : 1][4];
  if constexpr (kQRegSteps > 0) {
    const int q_row = cw * 64 + warp_in_wg * 16 + lane % 16;
#pragma unroll
    for (int kk = 0; kk < kQRegSteps; ++kk) {
      gpu::ldmatrix_x4(qa[kk], q_addr + swizzled_offset(BM, q_row, 2 * kk + lane / 16));
    }
  }
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
    const uint64_t v_desc = desc_mn_major(v_addr + stage * uint32_t(L.v_stage), BN * kSwizzleBytes);
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
  };
  auto issue_s = [&](int stage) {
    uint32_t q_base = q_addr;
    if constexpr (kPersistent || DQK > 128) {
      // Opaque past D = 128 (and in the persistent kernel): otherwise the compiler keeps the
      // KSTEPS loop-invariant Q descriptors (64 bits each) in registers across the key loop,
      // which spills.
      asm volatile("" : "+r"(q_base));
    }
    const uint64_t q_desc = desc_k_major(q_base + cw * 64 * kSwizzleBytes);
    const uint64_t k_desc = desc_k_major(k_addr + stage * uint32_t(L.k_stage));
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      const uint32_t panel = kk / 4, within = (kk % 4) * 32;
      const uint64_t db = desc_advance(k_desc, panel * BN * kSwizzleBytes + within);
      if (kk < kQRegSteps) {  // known at compile time (the loop is unrolled)
        uint32_t(&qk)[4] = qa[kk < kQRegSteps ? kk : 0];
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
  };
  auto wait_products = [&]() {
    wgmma_wait<0>();
    pin(sc);
    pin(acc_o);
  };
  // Mask and online softmax of S_i: P_i in place of the scores, the row statistics updated,
  // and alpha, the factor O must be rescaled by before P_i V_i is added (applied by the caller:
  // O may still be in flight in P_{i-1} V_{i-1} meanwhile). The scores reach the log2 domain
  // inside the exponent, exp2(s * to_log2 - max), one FFMA per score (the row maximum is taken
  // on the unscaled scores: the factor is positive), except under a softcap, whose tanh pass
  // leaves them in the log2 domain already.
  float alpha[2];
  auto softmax = [&](int i) {
    const int n0 = (n_first + i) * BN;
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
  };
  auto rescale_and_pack = [&]() {
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int f = 0; f < OF; ++f) {
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
  };
  // Tile 0's scores and softmax; then per tile i >= 1: S_i and P_{i-1} V_{i-1} issued together,
  // the softmax of S_i while P_{i-1} V_{i-1} still runs on the tensor cores, then O rescaled and
  // P_i packed once it has landed. One score tile is live at a time.
  // Ping-pong between the two consumers (FlashAttention-3's inter-warpgroup schedule): a
  // consumer issues its products only in its turn (barrier 2 + its index, completed by the other
  // consumer's arrival) and hands the turn over right after issuing, so one consumer's softmax
  // runs while the other's products occupy the tensor cores. Each consumer has n_tiles + 1 issue
  // phases (S_0; S_i with P_{i-1} V_{i-1}; the last P V), so the turns stay paired.
  //   Grid kernel: consumer 1 hands consumer 0 the first turn at the item's start and does not
  //     pass on its last turn (no barrier is left half-arrived when the CTA exits).
  //   Persistent kernel: consumer 1 passes on its last turn too, right after issuing its last
  //     P V, so consumer 0 may issue the next item's S_0 while consumer 1 still runs this item's
  //     epilogue (and its wait for the next item); that pass is the next item's first turn, the
  //     kernel gives consumer 0 the CTA's very first one and consumer 0 takes the last pass
  //     before it exits (fwd_persistent_kernel; kTurnAcrossItems).
  static_assert(C.consumers == 2, "the ping-pong pairs two consumers");
  constexpr bool kTurnAcrossItems = kPersistent;
  auto my_turn = [&]() {
    if (cw == 0) {
      named_barrier_sync(2, 256);
    } else {
      named_barrier_sync(3, 256);
    }
  };
  auto pass_turn = [&]() {
    if (cw == 0) {
      named_barrier_arrive(3, 256);
    } else {
      named_barrier_arrive(2, 256);
    }
  };
  if (!kTurnAcrossItems && cw == 1) named_barrier_arrive(2, 256);  // consumer 0 goes first
  if (cw_rows <= 0) {
    // No row of this consumer is inside the segment: the item's barrier protocol only, every wait,
    // turn and release as below in the same order, with no product (the other consumer's then
    // have the tensor cores to themselves) and nothing to store.
    for (int i = 0; i < n_tiles; ++i) {
      const int gi = g + i, stage = gi % STAGES;
      mbar_wait(&ring.full_k[stage], (gi / STAGES) & 1);
      if (i > 0) {
        if constexpr (SPLIT) mbar_wait(&ring.full_v[(gi - 1) % STAGES], ((gi - 1) / STAGES) & 1);
      }
      my_turn();
      pass_turn();
      if constexpr (SPLIT) mbar_arrive(&ring.empty_k[stage]);
      if (i > 0) mbar_arrive(&ring.empty_v[(gi - 1) % STAGES]);
    }
    const int idle_last = (g + n_tiles - 1) % STAGES;
    if constexpr (SPLIT) mbar_wait(&ring.full_v[idle_last], ((g + n_tiles - 1) / STAGES) & 1);
    my_turn();
    if (kTurnAcrossItems || cw == 0) pass_turn();
    mbar_arrive(&ring.empty_v[idle_last]);
    if constexpr (kPersistent) mbar_arrive(q_empty);  // done with the Q buffer
    return n_tiles;
  }
  mbar_wait(&ring.full_k[g % STAGES], (g / STAGES) & 1);
  my_turn();
  wgmma_fence();
  issue_s(g % STAGES);
  wgmma_commit();
  pass_turn();
  wait_products();
  // This thread's reads of tile 0's K are complete (where K has barriers of its own).
  if constexpr (SPLIT) mbar_arrive(&ring.empty_k[g % STAGES]);
  softmax(0);
  rescale_and_pack();
  for (int i = 1; i < n_tiles; ++i) {
    const int gi = g + i, stage = gi % STAGES, prev = (gi - 1) % STAGES;
    mbar_wait(&ring.full_k[stage], (gi / STAGES) & 1);
    if constexpr (SPLIT) mbar_wait(&ring.full_v[prev], ((gi - 1) / STAGES) & 1);
    my_turn();
    wgmma_fence();
    issue_s(stage);
    wgmma_commit();
    issue_pv(prev, kAllKsteps);
    wgmma_commit();
    pass_turn();
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
  my_turn();
  wgmma_fence();
  issue_pv(last, (last_keys + 15) / 16);
  wgmma_commit();
  const float sink2 = gpu::sink_log2(p, h);  // its load overlaps the last product
  // Consumer 1's last phase comes after consumer 0's: in the grid kernel no turn is left; in the
  // persistent one its pass is consumer 0's first turn of the next item.
  if (kTurnAcrossItems || cw == 0) pass_turn();
  wgmma_wait<0>();
  pin(acc_o);
  mbar_arrive(&ring.empty_v[last]);

  // Epilogue: LSE in natural log; O normalized, then (kStageO) staged in this consumer's 64 rows
  // of the Q buffer (its score products have all landed, and the other consumer reads only its
  // own rows; same swizzled panels, so stmatrix writes and the 16-byte row reads are free of bank
  // conflicts) and stored by whole 16-byte row chunks: a quarter of the store instructions, and
  // full sectors, where the accumulator layout gives 4-byte pieces of eight rows per instruction.
  static_assert(DV <= DQK, "O's 64 rows fit the consumer's rows of the Q buffer");
  float inv[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const gpu::RowScale fin = gpu::finish_row(row_max[half], gpu::quad_sum(row_sum[half]), sink2);
    inv[half] = fin.inv;
    const int r = row_a + 8 * half;
    if (r < rows && lane % 4 == 0) lse[r] = fin.lse;
  }
  if constexpr (!kStageO) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row_a + 8 * half;
      if (r < rows) {
        T* orow = o + r * o_stride + 2 * (lane % 4);
#pragma unroll
        for (int f = 0; f < OF; ++f) {
          *reinterpret_cast<uint32_t*>(orow + f * 8) =
              Mma::pack(acc_o[f][2 * half] * inv[half], acc_o[f][2 * half + 1] * inv[half]);
        }
      }
    }
    return n_tiles;
  }
  {
    // stmatrix .x4 of fragments f and f + 1, both row halves: lanes 8i .. 8i + 7 address tile
    // i's rows (tile i: fragment f + i / 2, rows 8 (i % 2) onwards of the warp's 16).
    const int tile = lane / 8;
    const int srow = cw * 64 + warp_in_wg * 16 + (tile % 2) * 8 + lane % 8;
#pragma unroll
    for (int f = 0; f < OF; f += 2) {
      const uint32_t r4[4] = {Mma::pack(acc_o[f][0] * inv[0], acc_o[f][1] * inv[0]),
                              Mma::pack(acc_o[f][2] * inv[1], acc_o[f][3] * inv[1]),
                              Mma::pack(acc_o[f + 1][0] * inv[0], acc_o[f + 1][1] * inv[0]),
                              Mma::pack(acc_o[f + 1][2] * inv[1], acc_o[f + 1][3] * inv[1])};
      stmatrix_x4(q_addr + swizzled_offset(BM, srow, f + tile / 2), r4);
    }
  }
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
  return n_tiles;
}

// One CTA per work item: grid (tiles x group, KV heads), the tiles in the schedule's order (most
// key tiles first over all segments).
template <class T, int DQK, int DV>
__global__ void __launch_bounds__(kFwdThreads, 1)
    fwd_kernel(const __grid_constant__ FwdTmaParams args) {
  const FwdParams& p = args.p;
  constexpr FwdConfig C = fwd_config(DQK, DV);
  constexpr int BM = C.block_m, BN = C.block_n;
  constexpr FwdSmem L = fwd_smem(DQK, DV);

  extern __shared__ unsigned char smem_raw[];
  // The integer round trip, not aligned_smem (hopper.cuh): the forward reaches its tiles by TMA,
  // ldmatrix, wgmma descriptors and 32-bit addresses, so it has no generic access to remove, and
  // aligned_smem's extra instructions cost it time.
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlign - 1) & ~uintptr_t(kSmemAlign - 1));
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L.bars);
  const KvRing ring = kv_ring_at<DQK, DV, false>(q_full + 1);
  // A partial K/V tile's boxes have landed (the producer's).
  uint64_t* partial = q_full + 1 + fwd_ring_barriers(DQK, DV, false);

  const int tid = threadIdx.x;
  const int wg = tid / 128;  // 0: producer; 1..consumers: consumer warpgroups
  // The query tile and head (the Plan's LaunchShape::inner_heads, a KV head's query heads: the
  // group's CTAs of one tile are consecutive and read the same K/V tiles at about the same time).
  const GridSlot slot = grid_slot(blockIdx.x, blockIdx.y, uint32_t(p.group));
  const TileCoord tc = args.schedule[slot.tile];
  if (tc.segment < 0) return;
  const int h = slot.head, hk = h / p.group;
  const gpu::QueryTileWork w = gpu::query_tile_work<BM>(p, tc);
  const Segment seg = w.seg;
  const int m0 = w.m0, key_lo = w.key_lo, key_hi = w.key_hi;

  if (key_lo >= key_hi) {  // no row of this tile sees a key: O = 0, LSE = -inf
    gpu::write_unseen_tile<T, DV>(p, w, h, tid, kFwdThreads);
    return;
  }
  const TileSpan kt = gpu::key_tiles<BN>(w);
  const int n_first = kt.first, n_tiles = kt.count;

  if (tid == 0) {
    mbar_init(q_full, 1);  // thread 0 of the producer (and the Q tile's TMA bytes)
    init_kv_ring<DQK, DV, false>(ring);
    mbar_init(partial, 1);
  }
  __syncthreads();  // barriers initialized before anyone arrives or waits

  if (wg == 0) {
    // ---- Producer: Q once, then K/V tile i into stage i % stages as both consumers free its K
    // and its V, all by TMA (fwd_produce_kv). Q comes whole even past its segment's end: a query
    // row's O depends on that row of Q only, and the rows past the segment are never written
    // (past the tensor's end TMA fills zeros).
    regs_dealloc<C.producer_regs>();
    if (tid == 0) {
      mbar_expect_tx(q_full, uint32_t(tile_bytes(BM, DQK)));
#pragma unroll
      for (int panel = 0; panel < DQK / 64; ++panel)
        tma_load_3d(smem + L.q + panel * BM * kSwizzleBytes, &args.q_map, panel * 64, h,
                    int(seg.q_row0 + m0), q_full);
      mbar_arrive(q_full);
    }
    uint32_t partial_uses = 0;
    for (int i = 0; i < n_tiles; ++i) {
      fwd_produce_kv<DQK, DV, false>(args, smem, ring, i, seg, hk, (n_first + i) * BN, partial,
                                     partial_uses);
    }
    return;
  }

  // ---- Consumers: 64 query rows each.
  regs_alloc<C.consumer_regs>();
  mbar_wait(q_full, 0);
  fwd_consume<T, DQK, DV, false>(p, smem, w, h, 0, 0, ring, nullptr);
}

// One CTA per SM (or per item, where there are fewer items): items from blockIdx.x, then from
// the work counter, in the order described below.
template <class T, int DQK, int DV>
__global__ void __launch_bounds__(kFwdThreads, 1)
    fwd_persistent_kernel(const __grid_constant__ FwdTmaParams args) {
  const FwdParams& p = args.p;
  constexpr FwdConfig C = fwd_config(DQK, DV, true);
  constexpr int BM = C.block_m, BN = C.block_n;
  constexpr FwdSmem L = fwd_smem(DQK, DV, true);
  constexpr int NQ = L.q_buffers;  // item t's Q in buffer t % NQ

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = aligned_smem(smem_raw);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L.bars);  // [NQ]: a Q tile has landed
  uint64_t* q_empty = q_full + NQ;  // [NQ]: both consumers are done with it (fwd_consume)
  const KvRing ring = kv_ring_at<DQK, DV, true>(q_empty + NQ);
  // A partial K/V tile's boxes have landed (the producer's).
  uint64_t* partial = q_empty + NQ + fwd_ring_barriers(DQK, DV, true);
  // The producer's fetched work item index (two slots, alternating).
  int64_t* fetched = reinterpret_cast<int64_t*>(smem + L.slots);  // [2]

  const int tid = threadIdx.x;
  const int wg = tid / 128;  // 0: producer; 1..consumers: consumer warpgroups
  // Work item wi: KV head major, then the schedule's tiles (most key tiles first over all
  // segments), then the query heads of the KV head's GQA group fastest. The
  // group's heads read the same K/V tiles at about the same time, and the CTAs in flight together
  // stream the K/V of about one KV head, which stays in L2. (Query head fastest over all heads
  // made the CTAs in flight read every KV head's keys at once: 64 MB on a 16k document, more
  // than L2, and measured 6% slower there than the grid of the non-persistent kernel.)
  // CTA b starts with item b and then takes the next unclaimed one from the work counter
  // (dynamic: under causal masking an item costs 1 to max_seqlen / block_n key tiles, and a
  // fixed stride measured 25% slower on long documents).
  // The producer fetches and hands each item inside a segment to the consumers with its Q tile
  // (an item no row of which sees a key without one), so both sides count the same Q uses and
  // K/V stages.
  // The producer finds each item's segment, rows and keys (a binary search over the segments and
  // a few divisions) and hands them to the consumers whole, in the item's Q buffer slot: written
  // under that buffer's q_empty, read after its q_full. A search in each consumer takes a fifth
  // of the consumers' time on packs of short documents.
  const int64_t work_tiles = args.work_tiles, n_work = work_tiles * args.heads;
  struct Item {
    gpu::QueryTileWork w;
    int h;
    bool valid;  // producer: false, the index falls in a gap; consumers: false, no more work
  };
  static_assert(sizeof(Item) <= kFwdItemBytes, "an item slot holds an Item");
  Item* items = reinterpret_cast<Item*>(smem + L.items);  // [NQ]
  auto fetch = [&](int64_t wi) {
    Item it;
    const int64_t rest = wi / p.group;  // (KV head, tile) pairs
    it.h = int(rest / work_tiles) * p.group + int(wi % p.group);
    const TileCoord tc = args.schedule[rest % work_tiles];
    it.valid = tc.segment >= 0;
    if (it.valid) it.w = gpu::query_tile_work<BM>(p, tc);
    return it;
  };

  if (tid == 0) {
    for (int b = 0; b < NQ; ++b) {
      mbar_init(&q_full[b], 1);  // thread 0 of the producer (and the Q tile's TMA bytes)
      mbar_init(&q_empty[b], 128 * C.consumers);
    }
    init_kv_ring<DQK, DV, true>(ring);
    mbar_init(partial, 1);
  }
  __syncthreads();  // barriers initialized before anyone arrives or waits

  if (wg == 0) {
    // ---- Producer: per work item, Q into buffer t % NQ once the consumers are done with item
    // t - NQ's (that buffer's q_empty), then K/V tile i into stage g % stages (g counts the CTA's
    // K/V tiles over all its items) as both consumers free its K and its V (fwd_produce_kv). Q
    // goes first, so that it loads while the previous item's tiles run. Q always comes by TMA, even
    // past its segment's end: a query row's O depends on that row of Q only, and the rows past the
    // segment are never written (past the tensor's end TMA fills zeros).
    regs_dealloc<C.producer_regs>();
    const int ptid = tid;
    int g = 0;                  // K/V tiles loaded by this CTA so far
    uint32_t partial_uses = 0;  // partial K/V tiles so far (`partial`'s phases)
    int t = 0;                  // work items handed to the consumers so far (the Q buffers' uses)
    // Before item t's Q (or its no-work mark) goes into buffer t % NQ: item t - NQ is done with it.
    auto wait_q_buffer = [&]() {
      if (t >= NQ) mbar_wait(&q_empty[t % NQ], ((t / NQ) - 1) & 1);
    };
    int n_fetch = 0;
    auto next_item = [&]() {  // all 128 producer threads
      if (ptid == 0) {
        fetched[n_fetch & 1] =
            n_fetch == 0 ? int64_t(blockIdx.x)
                         : int64_t(gridDim.x) + int64_t(atomicAdd(args.work_counter, 1ull));
      }
      named_barrier_sync(4, 128);  // the slot is written; the other slot's last read is done
      return fetched[(n_fetch++) & 1];
    };
    for (int64_t wi = next_item(); wi < n_work; wi = next_item()) {
      const Item it = fetch(wi);
      if (!it.valid) continue;
      const bool seen = it.w.key_lo < it.w.key_hi;  // else the consumers write O = 0, LSE = -inf
      const Segment seg = it.w.seg;
      const int h = it.h, hk = h / p.group;
      if (ptid == 0) {  // the item, and its Q by TMA
        wait_q_buffer();
        const int b = t % NQ;
        items[b] = it;
        if (seen) {
          mbar_expect_tx(&q_full[b], uint32_t(L.q_stage));
          const int row = int(seg.q_row0 + it.w.m0);
          unsigned char* q_dst = smem + L.q + b * L.q_stage;
#pragma unroll
          for (int panel = 0; panel < DQK / 64; ++panel)
            tma_load_3d(q_dst + panel * BM * kSwizzleBytes, &args.q_map, panel * 64, h, row,
                        &q_full[b]);
        }
        mbar_arrive(&q_full[b]);
      }
      ++t;
      if (!seen) continue;
      const TileSpan kt = gpu::key_tiles<BN>(it.w);
      for (int i = 0; i < kt.count; ++i, ++g) {
        fwd_produce_kv<DQK, DV, true>(args, smem, ring, g, seg, hk, (kt.first + i) * BN, partial,
                                      partial_uses);
      }
    }
    // No more work: the consumers find an invalid item with the next Q "tile".
    if (ptid == 0) {
      wait_q_buffer();
      items[t % NQ].valid = false;
      mbar_arrive(&q_full[t % NQ]);
    }
    return;
  }

  // ---- Consumers: 64 query rows each, item after item. The ping-pong's turns run across items
  // (fwd_consume's kTurnAcrossItems): consumer 1 gives consumer 0 the CTA's first turn here and
  // passes on after each item's last P V, so consumer 0 takes that last pass before it exits (no
  // named barrier is left half-arrived).
  regs_alloc<C.consumer_regs>();
  const bool consumer0 = tid < 256;
  if (!consumer0) named_barrier_arrive(2, 256);  // consumer 0 goes first
  int g = 0;  // K/V tiles consumed by this CTA so far (the producer's count)
  for (int t = 0;; ++t) {
    const int b = t % NQ;
    mbar_wait(&q_full[b], (t / NQ) & 1);
    const Item it = items[b];  // inside a segment: the producer skipped the gaps
    if (!it.valid) {
      if (consumer0) named_barrier_sync(2, 256);
      break;
    }
    if (it.w.key_lo >= it.w.key_hi) {  // no row of this tile sees a key: O = 0, LSE = -inf
      gpu::write_unseen_tile<T, DV>(p, it.w, it.h, tid - 128, 128 * C.consumers);
      mbar_arrive(&q_empty[b]);
      continue;
    }
    g += fwd_consume<T, DQK, DV, true>(p, smem, it.w, it.h, g, b, ring, &q_empty[b]);
  }
}

}  // namespace sm90
}  // namespace raggedattn

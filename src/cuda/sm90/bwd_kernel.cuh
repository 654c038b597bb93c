// Backward main kernel of the Hopper path (sm_90a): one CTA per (key tile of a segment, KV head),
// the portable backward's tile map and loop, with every product on wgmma. Warp-specialized:
//   producer warpgroup (producer_regs registers): warp 0 copies K/V once (TMA for a whole tile)
//     and the Q/dO/LSE/dot(dO,O) stages (Q and dO by TMA inside a segment) into a ring handed over
//     with mbarriers (full/empty); warp 1 adds each step's dQ tile into the scratch with one bulk
//     reduce-add from shared memory (cp.reduce.async.bulk; in deterministic mode it waits for the
//     tile's turn first; elsewhere the first key tile to claim a dQ tile stores it instead, and
//     the scratch is never zeroed: policy::bwd_dq_claimed), except in the kernel that adds dQ
//     from the consumers' registers (DQ_REGS: the column split with a 16-bit scratch outside
//     deterministic mode, policy::bwd_dq_from_registers); warps 2-3 exit.
//   two consumer warpgroups (consumer_regs registers), c = 0, 1, sharing the work as sm90_shapes.hpp's
//     bwd_config and bwd_columns say: at D = 64, 128 and 192/128 (key split) each owns 64 of the
//     CTA's 128 keys and all their columns; at D = 256 (column split) both work on the CTA's 64
//     keys and each owns half of the columns of dK, dV and dQ. dK and dV accumulate in registers
//     (two fp32 accumulators, m64n(DKN) and m64n(DVN)) while the CTA streams the query tiles (64
//     rows) of every query head of its GQA group. Per step, in warpgroup c:
//   S^T  = K_c Q^T     m64n64k16 over the head dim, both operands K-major in shared memory
//   dP^T = V_c dO^T    m64n64k16 over the head dim (K_c, V_c: the warpgroup's 64 keys, or the
//                      CTA's 64 under the column split, where both warpgroups compute them)
//   P^T, dS^T          on the registers (P^T while dP^T is in flight; at Dqk 192 S^T, P^T and
//                      then dP^T in turn: kScoresInTurn)
//   dS^T -> shared memory ([key][query], 128-byte swizzled, sm90_shapes.hpp's bwd_ds_buffers)
//   dV  += P^T dO      4 x m64n(DVN)k16, P^T from registers, dO N-major in shared memory
//   dK  += dS^T Q      4 x m64n(DKN)k16, dS^T from registers, Q N-major; both in flight across
//                      a barrier: both consumers (key split: dQ needs the other's keys) or this
//                      one (column split: its own copy); then the stage is released
//   dQ[:, dq0 .. dq0 + DQN) = dS K   m64n(DQN)k16 over the CTA's keys, dS read M-major,
//                      K N-major (at Dqk 192 in parts of 32 columns)
//   dQ -> the shared dQ tile (the scratch's element type and tile order), handed to warp 1, or
//                      (DQ_REGS) straight into the scratch by vector reductions.
// The consumers never wait on global memory, atomics or the deterministic turns.
// Shared-memory tiles use the 128-byte-swizzled panel layout of sm90_shapes.hpp (hopper.cuh).
#pragma once

#include <type_traits>

#include "cuda/common/bwd_work.cuh"
#include "core/sm90_shapes.hpp"
#include "cuda/sm90/hopper.cuh"
#include "cuda/sm90/wgmma_ops.hpp"

namespace raggedattn {
namespace sm90 {

using gpu::BwdParams;

// The kernel's parameters: the shared backward parameters and the TMA maps (tensor_map.hpp).
struct BwdTmaParams {
  BwdParams p;
  CUtensorMap q_map, do_map;  // boxes of block_m rows
  CUtensorMap k_map, v_map;   // boxes of block_n rows
};

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

// P^T's element of a score and dS^T's factor w at it, dS^T = w (dP^T - dot(dO, O)): w = P^T, or
// under a soft cap P^T (1 - t^2), t the capped score (tanh's value, which the score's register
// holds by then; lse2: its query's LSE, log2-scaled; seen: the mask shows the key to the query).
template <bool kSoftcap>
__device__ __forceinline__ float2 prob_factor(const BwdParams& p, float t, float lse2, bool seen) {
  if constexpr (kSoftcap) {
    const float pr = gpu::capped_prob(p, t, lse2, seen);
    return make_float2(pr, pr * (1.f - t * t));
  } else {
    return make_float2(t, t);
  }
}

// DQ_REGS: each step's dQ goes from the consumers' registers into the 16-bit scratch by vector
// reductions, not through the shared-memory tile and warp 1 (policy::bwd_dq_from_registers).
template <class T, int DQK, int DV, bool DQ_REGS>
__global__ void __launch_bounds__(kBwdThreads, 1)
    bwd_kernel(const __grid_constant__ BwdTmaParams a) {
  const BwdParams& p = a.p;
  constexpr BwdConfig C = bwd_config(DQK, DV, DQ_REGS);
  constexpr bool SPLIT = bwd_column_split(DQK, DV);  // the consumers split columns, not keys
  static_assert(!DQ_REGS || SPLIT, "dQ from registers: the column split's kernel only");
  // S^T, then P^T packed, then dP^T (not both score products in flight): where a consumer's dK and
  // dV accumulators leave no room for both (key split at Dqk 192: 160 registers).
  constexpr bool kScoresInTurn = bwd_scores_in_turn(DQK, DV);
  constexpr int BM = C.block_m, BN = C.block_n;
  constexpr int QSTEPS = BM / 16;  // k16 steps over the step's queries (dV, dK)
  constexpr int NSTEPS = BN / 16;  // k16 steps over the CTA's keys (dQ)
  constexpr int PANEL = 64;        // 16-bit elements per 128-byte panel row
  constexpr BwdSmem L = bwd_smem(DQK, DV, DQ_REGS);
  constexpr int STAGES = C.stages;
  static_assert(bwd_supports(DQK, DV), "the head dims of bwd_columns");
  static_assert(BM == PANEL, "dS^T rows are one panel: the dQ product reads them M-major");
  static_assert(BM == DqAccumLayout::kTileRows, "a query step's dQ is one tile of the scratch");
  using Mma = gpu::MmaType<T>;
  using gpu::smem_addr;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = aligned_smem(smem_raw);

  const int tid = threadIdx.x, lane = tid % 32;
  const int wg = tid / 128;  // 0: producer; 1..consumers: consumer warpgroups
  // The CTA's key tile and KV head: the schedule's x-th entry (most work first) where the Plan made
  // one (its grid is the schedule's entries), the tile map's x-th for KV head y otherwise.
  const HeadTile at = p.schedule != nullptr
                          ? p.schedule[blockIdx.x]
                          : HeadTile{p.kv_tiles.locate(blockIdx.x, p.segs.cu_kv), int(blockIdx.y)};
  const TileCoord tc = at.tc;
  if (tc.segment < 0) return;
  const int b = tc.segment, hk = at.head;
  const gpu::KeyTileWork w = gpu::key_tile_work<BM, BN>(p, tc);
  const Segment& seg = w.seg;
  const int n0 = w.n0, keys = w.keys, m_first = w.m_first, n_it = w.steps;

  uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + L.bars);
  uint64_t* full = kv_full + 1;        // [STAGES]: a Q/dO stage has landed (warp 0's 32 arrivals)
  uint64_t* empty = full + STAGES;     // [STAGES]: both consumers are done with a stage
  uint64_t* dq_full = empty + STAGES;  // the consumers wrote the step's dQ tile
  uint64_t* dq_empty = dq_full + 1;    // warp 1 has read it out
  uint64_t* partial = dq_empty + 1;    // warp 0: a partial tile's TMA boxes have landed
  constexpr int kConsumerThreads = 128 * C.consumers;
  if (tid == 0) {
    mbar_init(kv_full, 32);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full[s], 32);
      mbar_init(&empty[s], kConsumerThreads);
    }
    mbar_init(dq_full, kConsumerThreads);
    mbar_init(dq_empty, 1);
    mbar_init(partial, 1);
  }
  __syncthreads();  // barriers initialized before anyone arrives or waits

  if (wg == 0) {
    regs_dealloc<C.producer_regs>();
    const int warp = tid / 32;
    if (warp == 0) {
      // ---- Loads: K/V once, then stage `it` into buffer it % STAGES once both consumers freed
      // it, all by TMA (lane 0 issues one box per 64-column panel). A whole tile completes on its
      // barrier; a segment's last, partial tile on `partial`, and this warp then zeroes its rows
      // past the segment (they may hold anything, NaN included, and P^T dO and dS^T Q would carry
      // it into dV and dK). LSE and dot(dO, O) always by cp.async. Each lane waits for its own
      // copies, makes them visible to the async proxy and arrives, so a stage's barrier completes
      // when all 32 lanes and the TMA bytes are in.
      if (n_it == 0) return;
      // A partial tile comes by TMA like a whole one (rows past the tensor's end arrive as zeros,
      // rows of the next segment or of padding as they are) onto `partial`; once it has landed,
      // this warp zeroes rows [from, rows) of each 64-column panel of the swizzled tile (a row's
      // 128 bytes in a panel, whatever their order) with 16-byte stores. The fence before the
      // stage's arrival makes the stores visible to wgmma.
      uint32_t partial_uses = 0;
      auto zero_rows = [&](unsigned char* tile, int rows, int panels, int from) {
        const int n = (rows - from) * panels * 8;
        for (int i = lane; i < n; i += 32) {
          const int chunk = i % 8, rest = i / 8, panel = rest % panels, r = from + rest / panels;
          *reinterpret_cast<uint4*>(tile + (panel * rows + r) * kSwizzleBytes + chunk * 16) =
              make_uint4(0u, 0u, 0u, 0u);
        }
      };
      // Lane 0: K's and V's boxes of this key tile, completing on `bar`.
      auto issue_kv = [&](uint64_t* bar) {
        mbar_expect_tx(bar, uint32_t(tile_bytes(BN, DQK) + tile_bytes(BN, DV)));
        const int row = int(seg.kv_row0 + n0);
#pragma unroll
        for (int panel = 0; panel < DQK / PANEL; ++panel) {
          tma_load_3d(smem + L.k + panel * BN * kSwizzleBytes, &a.k_map, panel * PANEL, hk, row,
                      bar);
        }
#pragma unroll
        for (int panel = 0; panel < DV / PANEL; ++panel) {
          tma_load_3d(smem + L.v + panel * BN * kSwizzleBytes, &a.v_map, panel * PANEL, hk, row,
                      bar);
        }
      };
      if (keys == BN) {  // a whole key tile: TMA, completing on kv_full
        if (lane == 0) issue_kv(kv_full);
      } else {  // a segment's last, partial key tile: its rows past the segment zeroed
        if (lane == 0) {
          issue_kv(partial);
          mbar_arrive(partial);
        }
        mbar_wait(partial, partial_uses++ & 1);
        zero_rows(smem + L.k, BN, DQK / PANEL, keys);
        zero_rows(smem + L.v, BN, DV / PANEL, keys);
        __syncwarp();  // every lane has seen the phase before lane 0 can start the next
      }
      // Step it is query tile w.query_tile(it % w.m_count) of the group's head it / w.m_count: the
      // tile m_first + qt and the head qh, counted by w.next_step (as every loop here counts).
      for (int it = 0, qt = w.m_rot, qh = 0; it < n_it; ++it, w.next_step(qt, qh)) {
        const int s = it % STAGES;
        if (it >= STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
        const int h = hk * p.group + qh;
        const int m0 = (m_first + qt) * BM;
        const int64_t row0 = seg.q_row0 + m0;
        const int valid = seg.len_q - m0;
        unsigned char* q_dst = smem + L.q + s * L.q_stage;
        unsigned char* do_dst = smem + L.d_o + s * L.do_stage;
        // Whole tiles complete on the stage's barrier; a partial one on `partial`, after which
        // this warp zeroes its rows past the segment before arriving on the stage's.
        uint64_t* boxes = valid >= BM ? &full[s] : partial;
        if (lane == 0) {
          mbar_expect_tx(boxes, uint32_t(L.q_stage + L.do_stage));
#pragma unroll
          for (int panel = 0; panel < DQK / PANEL; ++panel) {
            tma_load_3d(q_dst + panel * BM * kSwizzleBytes, &a.q_map, panel * PANEL, h, int(row0),
                        boxes);
          }
#pragma unroll
          for (int panel = 0; panel < DV / PANEL; ++panel) {
            tma_load_3d(do_dst + panel * BM * kSwizzleBytes, &a.do_map, panel * PANEL, h, int(row0),
                        boxes);
          }
          if (valid < BM) mbar_arrive(partial);
        }
        float* s_lse = reinterpret_cast<float*>(smem + L.lse + s * L.stat_stage);
        float* s_dp = reinterpret_cast<float*>(smem + L.dpsum + s * L.stat_stage);
        const int64_t stat = p.stats.offset(h, row0);
#pragma unroll
        for (int r = lane; r < BM; r += 32) {
          const bool ok = r < valid;
          gpu::cp_async_4(s_lse + r, p.lse + (ok ? stat + r : 0), ok);
          gpu::cp_async_4(s_dp + r, p.dpsum + (ok ? stat + r : 0), ok);
        }
        gpu::cp_async_commit();
        if (valid < BM) {
          mbar_wait(partial, partial_uses++ & 1);
          zero_rows(q_dst, BM, DQK / PANEL, valid);
          zero_rows(do_dst, BM, DV / PANEL, valid);
          __syncwarp();  // every lane has seen the phase before lane 0 can start the next
        }
        gpu::cp_async_wait<0>();  // this lane's statistics have landed
        fence_proxy_async_smem();
        if (it == 0) mbar_arrive(kv_full);
        mbar_arrive(&full[s]);
      }
    } else if (!DQ_REGS && warp == 1 && lane == 0) {
      // ---- dQ: each step's tile, rows [m0, m0 + BM) of head h, into the scratch.
      for (int it = 0, qt = w.m_rot, qh = 0; it < n_it; ++it, w.next_step(qt, qh)) {
        const int h = hk * p.group + qh;  // as warp 0 counts them
        const int m_tile = m_first + qt;
        const int m0 = m_tile * BM;
        // The whole tile, in the scratch's tile order (rows past the segment's end, whatever
        // they hold, land in its own slot's last tile and are never read).
        const int64_t off = p.dq_accum.offset(0, b, seg.cu_q, h, m0);
        // Claimed tiles (policy::bwd_dq_claimed; the scratch was not zeroed): the first key
        // tile to claim this one (0 -> 1) stores it and marks it written (2) once its bulk copy
        // has completed; any other adds only once the tile is marked. The marking mirrors the
        // deterministic turns' release and acquire. The claim is taken before the step's tile is
        // in (its round trip overlaps the consumers' step, not this warp's hand-off).
        int32_t* claim = p.dq_claims ? p.dq_claims + p.dq_accum.tile_of(off) : nullptr;
        const int claimed = claim ? atomicCAS(claim, 0, 1) : 2;
        mbar_wait(dq_full, it & 1);
        int32_t* lock = nullptr;
        int expected = 0;
        if (p.locks != nullptr) {  // deterministic: this key tile's turn on the dQ tile
          expected = p.mask.key_tile_turn(tc.tile, m0, BN, seg.len_q, seg.len_kv);
          lock = gpu::dq_tile_lock<BM>(p, b, seg, h, m_tile);
          while (atomicAdd(lock, 0) != expected) __nanosleep(64);
          __threadfence();
        }
        const bool first = claimed == 0;
        if (claim && !first) {  // another key tile's: wait for its store
          for (int state = claimed; state != 2; state = atomicAdd(claim, 0)) __nanosleep(32);
          __threadfence();
          fence_proxy_async_global();  // the store seen before this thread's bulk reduce-add
        }
        void* dst = static_cast<unsigned char*>(p.dq_accum_ptr) + off * p.dq_accum.elem_bytes();
        const uint32_t bytes = uint32_t(BM) * DQK * uint32_t(p.dq_accum.elem_bytes());
        if (first) {
          bulk_store(dst, smem + L.dq, bytes);
        } else if (p.dq_accum.type == AccumType::F32) {
          bulk_reduce_add(static_cast<float*>(dst), smem + L.dq, bytes);
        } else {
          // The 16-bit scratch is in the input's own format (the Plan's AccumType).
          bulk_reduce_add(static_cast<T*>(dst), smem + L.dq, bytes);
        }
        bulk_commit();
        if (lock) {
          bulk_wait_done();
          fence_proxy_async_global();
          __threadfence();
          atomicAdd(lock, 1);
        } else {
          bulk_wait_read();
        }
        mbar_arrive(dq_empty);  // the tile's shared memory may be written again
        if (first) {            // the tile is written: the other key tiles may add into it
          bulk_wait_done();
          fence_proxy_async_global();
          __threadfence();
          atomicExch(claim, 2);
        }
      }
      bulk_wait_done();
    }
    return;
  }

  // ---- Consumers.
  regs_alloc<C.consumer_regs>();
  // The consumer's index, read through a shuffle from lane 0, so that the compiler knows it is
  // warp-uniform: what derives from it (the warpgroup's keys and columns, so its operand
  // descriptors) stays in uniform registers, where the wgmmas read their descriptors.
  const int c = __shfl_sync(0xffffffffu, wg - 1, 0);
  const int warp_in_wg = (tid % 128) / 32;
  const uint32_t k_addr = smem_addr(smem + L.k), v_addr = smem_addr(smem + L.v);
  const uint32_t q_addr = smem_addr(smem + L.q), do_addr = smem_addr(smem + L.d_o);
  const uint32_t ds_addr = smem_addr(smem + L.ds);
  // This thread's key rows in the CTA tile (the wgmma accumulator layout): row_a and row_a + 8.
  // Key split: the warpgroup's 64 keys; column split: all 64 keys of the CTA.
  const int key0 = SPLIT ? 0 : c * 64;
  const int row_a = key0 + warp_in_wg * 16 + lane / 4;
  // The key row this lane addresses in an x4 stmatrix over the warp's 16 key rows (lane l gives
  // row l % 8 of 8x8 tile l / 8; tiles 1 and 3 hold rows 8-15): dS^T's rows and the epilogue's.
  // Computed where it is used: kept live across the step loop instead, it raised the D = 128
  // kernel's spills from 8 to 16 bytes.
  auto stmatrix_row = [&] { return key0 + warp_in_wg * 16 + lane % 8 + 8 * ((lane / 8) % 2); };
  // The byte offset of a column in a [rows][dim] panel-major tile of `rows` rows (64 columns per
  // panel).
  auto col_offset = [](int col, int rows) {
    return uint32_t((col / PANEL) * rows * kSwizzleBytes + (col % PANEL) * 2);
  };
  // One dS^T buffer for both consumers (key split at Dqk 192, bwd_ds_buffers): a consumer writes
  // into it at step it >= 1 (its dS^T rows, an idle step's zeros, the soft cap's factor) only once
  // the other consumer's dQ of step it - 1, which reads all the buffer's rows, has landed. Each
  // arrives on the other's barrier (2 + the other's index; 3 - its own) after its dQ of every step
  // but its last, and waits on its own before its first write of every step but its first: the
  // arrivals and waits pair, and an arrival can run at most one step ahead of its wait (the
  // arriving consumer's next arrival comes after the step's dS^T barrier, which the waiting one
  // reaches only after its wait). With two buffers, alternating steps, the dS^T barrier orders it.
  constexpr bool kOneDsBuffer = !SPLIT && L.ds_buffers == 1;
  static_assert(SPLIT || L.ds_buffers == 1 || L.ds_buffers == 2, "key split: one or two dS^T");
  auto wait_ds_free = [&](int it) {
    if constexpr (kOneDsBuffer) {
      if (it > 0) {  // constant ids: a computed one makes ptxas reserve all 16
        if (c == 0) {
          named_barrier_sync(2, kConsumerThreads);
        } else {
          named_barrier_sync(3, kConsumerThreads);
        }
      }
    }
  };
  auto release_ds = [&](int it) {
    if constexpr (kOneDsBuffer) {
      if (it + 1 < n_it) {
        if (c == 0) {
          named_barrier_arrive(3, kConsumerThreads);
        } else {
          named_barrier_arrive(2, kConsumerThreads);
        }
      }
    }
  };

  // The consumer's loop and epilogue for its columns (sm90_shapes.hpp's bwd_columns): DKN, DVN and DQN
  // columns of dK, dV and dQ (the accumulators' widths, compile-time), from dk0, dv0 and dq0.
  auto consume = [&](auto dk_width, auto dv_width, auto dq_width, const int dk0, const int dv0,
                     const int dq0) {
    constexpr int DKN = decltype(dk_width)::value, DVN = decltype(dv_width)::value,
                  DQN = decltype(dq_width)::value;
    float acc_dk[DKN / 8][4], acc_dv[DVN / 8][4];
#pragma unroll
    for (int f = 0; f < DKN / 8; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[f][e] = 0.f;
#pragma unroll
    for (int f = 0; f < DVN / 8; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dv[f][e] = 0.f;

    // The query rows that see any of this warpgroup's keys inside the segment, [k_lo, k_hi)
    // (MaskSpec::query_rows); empty where the warpgroup has no key inside the segment. Two
    // registers for the loop (the per-step test on the key range measured 28 B more spills at
    // D = 128).
    int seen_lo = 0, seen_hi = 0;
    if constexpr (!SPLIT) {
      const int k_lo = n0 + key0, k_hi = n0 + min(keys, key0 + 64);
      if (k_hi > k_lo) {
        const MaskSpec::RowSpan seen = p.mask.query_rows(k_lo, k_hi - k_lo, seg.len_q, seg.len_kv);
        seen_lo = seen.begin;
        seen_hi = seen.end;
      }
    }
    if (n_it > 0) mbar_wait(kv_full, 0);
    for (int it = 0, qt = w.m_rot, qh = 0; it < n_it; ++it, w.next_step(qt, qh)) {
      const int buf = it % STAGES;
      mbar_wait(&full[buf], (it / STAGES) & 1);
      const int m0 = (m_first + qt) * BM;  // as warp 0 counts them
      // dS^T buffer: key split, alternating steps where there are two (both warpgroups read both
      // halves); column split, this warpgroup's own copy.
      const int ds_buf = SPLIT ? c : L.ds_buffers == 2 ? (it & 1) : 0;
      // Shared-memory bases, opaque to the compiler here: otherwise it hoists the loop-invariant
      // operand descriptors (16 for K and V, 8 for dQ's K, 64 bits each) out of the loop and keeps
      // them in registers that the accumulators need.
      uint32_t k_base = k_addr, v_base = v_addr, ds_base = ds_addr + ds_buf * uint32_t(L.ds_stage);
      uint32_t q_buf = q_addr + buf * uint32_t(L.q_stage),
               do_buf = do_addr + buf * uint32_t(L.do_stage);
      asm volatile("" : "+r"(k_base), "+r"(v_base), "+r"(ds_base), "+r"(q_buf), "+r"(do_buf));

      // An idle step (key split only): no row of the step sees any of this warpgroup's keys
      // inside the segment (a causal diagonal key tile's first query tile, for warpgroup 1; keys
      // past the segment's end). P^T and dS^T are then zero: no score products, no dV or dK, the
      // warpgroup's dS^T rows in shared memory set to zero for the other's dQ, and only its dQ
      // columns computed. [seen_lo, seen_hi): the rows that see any of its keys (below).
      const bool idle = !SPLIT && (min(m0 + BM, seg.len_q) <= seen_lo || m0 >= seen_hi);
      if (idle) {
        wait_ds_free(it);
        const uint32_t zero[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int kc = 0; kc < QSTEPS; ++kc) {
          stmatrix_x4(ds_base + swizzled_offset(BN, stmatrix_row(), 2 * kc + lane / 16), zero);
        }
        fence_proxy_async_smem();
      } else {
        // S^T = K_c Q^T and dP^T = V_c dO^T: [64 keys x 64 queries] each, both operands K-major:
        // 64 rows of K (V) from key0, all 64 rows of Q (dO), over the head dim's panels.
        float st[BM / 8][4], dpt[BM / 8][4];
        // ksteps: the k16 steps over the head dim of the operands (Dqk for S^T, Dv for dP^T),
        // constants at both calls. (A compile-time parameter here, a generic lambda's
        // integral_constant, crashes nvcc 13.0's front end inside the generic consume lambda.)
        // keys, queries: the descriptors of the operands' first k-step (desc_advance).
        auto issue_scores = [&](int ksteps, float(&acc)[BM / 8][4], uint64_t keys,
                                uint64_t queries) {
#pragma unroll
          for (int kk = 0; kk < ksteps; ++kk) {
            const uint32_t panel = kk / 4, within = (kk % 4) * 32;
            ss_m64n64k16<T>(acc, desc_advance(keys, panel * BN * kSwizzleBytes + within),
                            desc_advance(queries, panel * BM * kSwizzleBytes + within),
                            kk > 0 ? 1 : 0);
          }
          wgmma_commit();
        };
        wgmma_fence();
        issue_scores(DQK / 16, st, desc_k_major(k_base + key0 * kSwizzleBytes),
                     desc_k_major(q_buf));  // group: S^T
        auto issue_dpt = [&]() {
          issue_scores(DV / 16, dpt, desc_k_major(v_base + key0 * kSwizzleBytes),
                       desc_k_major(do_buf));  // group: dP^T
        };
        if constexpr (!kScoresInTurn) issue_dpt();

        // P^T and dS^T, packed into the register A operands of dV and dK (a[kc] holds columns
        // 16kc .. 16kc + 15: fragment pairs 2kc and 2kc + 1). Columns are queries: their statistics
        // come from the stage's shared-memory copies, one column pair at a time.
        uint32_t a_p[QSTEPS][4], a_ds[QSTEPS][4];
        const float* s_lse = reinterpret_cast<const float*>(smem + L.lse + buf * L.stat_stage);
        const float* s_dp = reinterpret_cast<const float*>(smem + L.dpsum + buf * L.stat_stage);
        const bool full = p.mask.block_full(m0, m0 + BM, n0, n0 + BN, seg.len_q, seg.len_kv);
        // Key split at Dqk 192 (kScoresInTurn), under a soft cap: dS^T's factor in place of P^T,
        // P^T (1 - t^2), packed into this warp's rows of this step's dS^T buffer (16 words per
        // lane, 2 KiB: its 16 key rows) until dP^T has landed; the dS^T tile overwrites it.
        [[maybe_unused]] uint32_t* w_slot = reinterpret_cast<uint32_t*>(
            smem + L.ds + ds_buf * L.ds_stage + (key0 + warp_in_wg * 16) * kSwizzleBytes);
        // Two passes: the first (P^T, or tanh of the scores under a soft cap) runs while dP^T is
        // still in flight; the second forms dS^T once it has landed. In turn (kScoresInTurn) the
        // first also packs P^T, and dP^T is issued after it, below.
        auto score_tile = [&](auto softcap) {
          constexpr bool kSoftcap = decltype(softcap)::value;
          if constexpr (!kScoresInTurn) {  // in turn: S^T waited for before the call
            wgmma_wait<1>();
            pin(st);
          }
          // The queries this thread's two key rows see, made only for a step the mask does not
          // leave whole (`full`, the same for the warpgroup).
          gpu::KeyRowMask km[2] = {};
          if (!full) {
            km[0] = gpu::key_row_mask(p.mask, n0 + row_a, seg);
            km[1] = gpu::key_row_mask(p.mask, n0 + row_a + 8, seg);
          }
          // P^T without a branch per element: a whole step takes the exponentials alone; another
          // sends its hidden scores to exp2(-inf) = 0.
          auto probs = [&](auto masked) {
            constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
            for (int f = 0; f < BM / 8; ++f) {
              const int qc = f * 8 + 2 * (lane % 4);
              const float2 lse = *reinterpret_cast<const float2*>(s_lse + qc);
              const float lse2[2] = {lse.x * gpu::kLog2e, lse.y * gpu::kLog2e};
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                float x = st[f][e] * p.scale_log2 - lse2[e % 2];
                if constexpr (kMasked) {
                  x = km[e / 2].sees(m0 + qc + e % 2) ? x : -INFINITY;
                }
                st[f][e] = gpu::fast_exp2(x);
              }
            }
          };
          if constexpr (kSoftcap) {
#pragma unroll
            for (int f = 0; f < BM / 8; ++f)
#pragma unroll
              for (int e = 0; e < 4; ++e) st[f][e] = gpu::capped_tanh(p, st[f][e]);
          } else if (full) {
            probs(std::false_type{});
          } else {
            probs(std::true_type{});
          }
          if constexpr (kScoresInTurn) {
            // P^T packed first, so the scores' registers are free before dP^T is issued; dS^T =
            // w o (dP^T - dot(dO, O)) once it has landed, w = P^T, or under a soft cap
            // P^T (1 - t^2), packed in the same format into this warp's rows of this step's dS^T
            // buffer (16 words per lane, 2 KiB: its 16 key rows), which the dS^T tile overwrites
            // after.
#pragma unroll
            for (int f = 0; f < BM / 8; ++f) {
              const int qc = f * 8 + 2 * (lane % 4);
              float2 lse2 = make_float2(0.f, 0.f);
              if constexpr (kSoftcap) {
                lse2 = *reinterpret_cast<const float2*>(s_lse + qc);
                lse2.x *= gpu::kLog2e;
                lse2.y *= gpu::kLog2e;
              }
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                float pr[2], w[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  const float2 x =
                      prob_factor<kSoftcap>(p, st[f][2 * half + e], e ? lse2.y : lse2.x,
                                            full || km[half].sees(m0 + qc + e));
                  pr[e] = x.x;
                  w[e] = x.y;
                }
                a_p[f / 2][2 * (f % 2) + half] = Mma::pack(pr[0], pr[1]);
                if constexpr (kSoftcap) w_slot[(2 * f + half) * 32 + lane] = Mma::pack(w[0], w[1]);
              }
            }
            return;  // dP^T and dS^T below, after the call
          }
          wgmma_wait<0>();
          pin(dpt);
#pragma unroll
          for (int f = 0; f < BM / 8; ++f) {
            const int qc = f * 8 + 2 * (lane % 4);
            const float2 dsum = *reinterpret_cast<const float2*>(s_dp + qc);
            float2 lse2 = make_float2(0.f, 0.f);
            if constexpr (kSoftcap) {
              lse2 = *reinterpret_cast<const float2*>(s_lse + qc);
              lse2.x *= gpu::kLog2e;
              lse2.y *= gpu::kLog2e;
            }
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              float pr[2], ds[2];
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const float dp = dpt[f][2 * half + e] - (e ? dsum.y : dsum.x);
                const float2 x = prob_factor<kSoftcap>(p, st[f][2 * half + e], e ? lse2.y : lse2.x,
                                                       full || km[half].sees(m0 + qc + e));
                pr[e] = x.x;
                ds[e] = x.y * dp;
              }
              a_p[f / 2][2 * (f % 2) + half] = Mma::pack(pr[0], pr[1]);
              a_ds[f / 2][2 * (f % 2) + half] = Mma::pack(ds[0], ds[1]);
            }
          }
        };
        if constexpr (kScoresInTurn) {
          wgmma_wait<0>();
          pin(st);
        }
        wait_ds_free(it);  // before the soft cap's factor or dS^T goes into a single buffer
        if (p.softcap > 0.f) {
          score_tile(std::true_type{});
        } else {
          score_tile(std::false_type{});
        }
        if constexpr (kScoresInTurn) {
          wgmma_fence();
          issue_dpt();
          wgmma_wait<0>();
          pin(dpt);
          const bool capped = p.softcap > 0.f;
#pragma unroll
          for (int f = 0; f < BM / 8; ++f) {
            const int qc = f * 8 + 2 * (lane % 4);
            const float2 dsum = *reinterpret_cast<const float2*>(s_dp + qc);
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const float2 w = Mma::unpack(capped ? w_slot[(2 * f + half) * 32 + lane]
                                                  : a_p[f / 2][2 * (f % 2) + half]);
              a_ds[f / 2][2 * (f % 2) + half] = Mma::pack(w.x * (dpt[f][2 * half] - dsum.x),
                                                          w.y * (dpt[f][2 * half + 1] - dsum.y));
            }
          }
          __syncwarp();  // the lanes' w read before the warp's dS^T overwrites it
        }

        // dS^T into shared memory as [key][query] (one 128-byte panel per key row), for dQ: before
        // dV and dK are issued, because a wgmma's register A operand (a_ds) may not be read by
        // other instructions while the wgmma is in flight. a_ds[kc] is four 8x8 tiles (query
        // chunks 2kc and 2kc + 1, each for the warp's key rows 0-7 and 8-15): one stmatrix, lane l
        // giving row l % 8 of tile l / 8.
#pragma unroll
        for (int kc = 0; kc < QSTEPS; ++kc) {
          stmatrix_x4(ds_base + swizzled_offset(BN, stmatrix_row(), 2 * kc + lane / 16), a_ds[kc]);
        }
        fence_proxy_async_smem();

        // dV += P^T dO and dK += dS^T Q (A from registers, B N-major: its rows are this step's
        // queries, its columns this warpgroup's columns of dV (dK), from dv0 (dk0)), in flight
        // while this warpgroup waits at the dS^T barrier.
        wgmma_fence();
        const uint64_t do_cols = desc_mn_major(do_buf + col_offset(dv0, BM), BM * kSwizzleBytes);
        const uint64_t q_cols = desc_mn_major(q_buf + col_offset(dk0, BM), BM * kSwizzleBytes);
#pragma unroll
        for (int kc = 0; kc < QSTEPS; ++kc) {
          accumulate_rs<T, DVN>(acc_dv, a_p[kc], desc_advance(do_cols, kc * 16 * kSwizzleBytes));
        }
#pragma unroll
        for (int kc = 0; kc < QSTEPS; ++kc) {
          accumulate_rs<T, DKN>(acc_dk, a_ds[kc], desc_advance(q_cols, kc * 16 * kSwizzleBytes));
        }
        wgmma_commit();
      }  // not idle
      if constexpr (SPLIT) {
        // This warpgroup's dS^T rows are in (its own copy). Constant ids: a computed one makes
        // ptxas reserve all 16.
        if (c == 0) {
          named_barrier_sync(2, 128);
        } else {
          named_barrier_sync(3, 128);
        }
      } else {
        named_barrier_sync(1, kConsumerThreads);  // both warpgroups' dS^T rows are in
      }
      // At D = 128, dQ is issued behind dV and dK (the tensor cores go on without a gap), its 64
      // columns' accumulators live beside their register operands (P^T, dS^T). Elsewhere dV and
      // dK land first: under the column split (up to 128 columns of dQ) their operands die, so
      // dQ's accumulators do not add to the live registers; at D = 64 (32 columns, 8 k-steps of
      // m64n32) issuing it behind gains nothing and may lose.
      constexpr bool kDqBehind = !SPLIT && DQK == 128;
      auto release_stage = [&]() {
        pin(acc_dv);
        pin(acc_dk);
        mbar_arrive(&empty[buf]);  // this thread's reads of the Q/dO stage are complete
      };
      if constexpr (!kDqBehind) {
        wgmma_wait<0>();
        release_stage();
      }

      // dQ[:, dq0 .. dq0 + DQN) = dS K: A = dS^T read M-major (queries contiguous), B = K's
      // columns from dq0 read N-major (D = 64: both halves in panel 0, warpgroup 1's starting 64
      // bytes into each row; otherwise whole panels); k16 steps over the CTA's keys. The first
      // k-step overwrites the accumulators (scale-d 0). In parts of DQP columns, each written to
      // the dQ tile before the next is issued, where the consumer's dK and dV accumulators leave
      // no room for all DQN (key split at Dqk 192: 32 of 96 at a time).
      constexpr int DQP = kScoresInTurn ? 32 : DQN;
      static_assert(DQN % DQP == 0 && (DQP == 128 || DQP == 64 || DQP == 32),
                    "dQ's columns in whole parts of one wgmma N");
      const uint64_t ds_rows = desc_mn_major(ds_base, BN * kSwizzleBytes);
#pragma unroll
      for (int part = 0; part < DQN / DQP; ++part) {
        const int col0 = dq0 + part * DQP;
        float dq[DQP / 8][4];
        const uint64_t k_cols = desc_mn_major(k_base + col_offset(col0, BN), BN * kSwizzleBytes);
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < NSTEPS; ++kc) {
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
        if constexpr (kDqBehind) {
          wgmma_wait<1>();  // dV and dK have landed
          release_stage();
        }
        wgmma_wait<0>();
        pin(dq);
        pin(acc_dv);
        pin(acc_dk);
        if (part + 1 == DQN / DQP) release_ds(it);  // this step's dS^T is read

        // The dQ tile in the scratch's element type and tile order (DqAccumLayout::Wgmma64: this
        // thread's four elements of each 8-column panel are one vector, the warpgroup's 128
        // vectors of a panel contiguous): DQ_REGS, added into the scratch from here, one vector
        // reduction per panel; otherwise into shared memory (the bulk reduce's source), once
        // warp 1 has read out the previous one.
        const int32_t at0 =
            DqAccumLayout::fragment_index(warp_in_wg * 16 + lane / 4, col0 + 2 * (lane % 4));
        if (!DQ_REGS && part == 0 && it > 0) mbar_wait(dq_empty, (it - 1) & 1);
        if (!DQ_REGS && p.dq_accum.type == AccumType::F32) {
          float* dst = reinterpret_cast<float*>(smem + L.dq) + at0;
#pragma unroll
          for (int f = 0; f < DQP / 8; ++f) {
            *reinterpret_cast<float4*>(dst + f * DqAccumLayout::kPanelElems) =
                make_float4(dq[f][0], dq[f][1], dq[f][2], dq[f][3]);
          }
        } else {
          // The 16-bit scratch is in the input's own format (the Plan's AccumType); DQ_REGS takes
          // no other (bwd_dq_from_registers): the tile's vector at0 of panel 0 in the scratch.
          T* dst = DQ_REGS ? static_cast<T*>(p.dq_accum_ptr) +
                                 p.dq_accum.offset(0, b, seg.cu_q, hk * p.group + qh, m0) + at0
                           : reinterpret_cast<T*>(smem + L.dq) + at0;
#pragma unroll
          for (int f = 0; f < DQP / 8; ++f) {
            T* v = dst + f * DqAccumLayout::kPanelElems;
            const uint32_t lo = Mma::pack(dq[f][0], dq[f][1]), hi = Mma::pack(dq[f][2], dq[f][3]);
            if constexpr (DQ_REGS) {
              red_add(v, lo, hi);
            } else {
              *reinterpret_cast<uint2*>(v) = make_uint2(lo, hi);
            }
          }
        }
      }
      if constexpr (!DQ_REGS) {
        fence_proxy_async_smem();  // visible to the bulk reduce (async proxy)
        mbar_arrive(dq_full);
      }
    }

    // Epilogue: dK (times the softmax scale) and dV of this warpgroup's keys and columns, staged
    // in shared memory in K's and V's own tiles (no one reads them once both consumers' last
    // products have landed: the producer loaded them once, warp 1 reads only the dQ tile), in
    // their 128-byte-swizzled panel layout by stmatrix, then copied out 16 bytes per row chunk:
    // whole 32-byte sectors, and a quarter of the store instructions of storing each thread's
    // accumulator pairs directly.
    // The two consumers meet twice below.
    auto consumers_meet = [&]() { named_barrier_sync(1, kConsumerThreads); };
    consumers_meet();  // both consumers' last products have landed
    auto stage = [&](const auto& acc, int col0, uint32_t base, float mul) {
      constexpr int NF = std::extent<std::remove_reference_t<decltype(acc)>>::value;
      static_assert(NF % 2 == 0, "fragment pairs: 16 columns per stmatrix");
#pragma unroll
      for (int f = 0; f < NF; f += 2) {
        const uint32_t r[4] = {Mma::pack(acc[f][0] * mul, acc[f][1] * mul),
                               Mma::pack(acc[f][2] * mul, acc[f][3] * mul),
                               Mma::pack(acc[f + 1][0] * mul, acc[f + 1][1] * mul),
                               Mma::pack(acc[f + 1][2] * mul, acc[f + 1][3] * mul)};
        stmatrix_x4(base + swizzled_offset(BN, stmatrix_row(), col0 / 8 + f + lane / 16), r);
      }
    };
    stage(acc_dk, dk0, k_addr, p.scale);
    stage(acc_dv, dv0, v_addr, 1.f);
    consumers_meet();  // every warp's part of the tiles is in
    // This warpgroup's 64 key rows from key0, `width` columns from col0, 16 bytes at a time;
    // rows past the segment's keys are not written.
    auto copy_out = [&](T* out, int64_t stride, const unsigned char* tile, int col0, int width) {
      const int chunks = width / 8, ptid = tid % 128;
      for (int i = ptid; i < 64 * chunks; i += 128) {
        const int r = key0 + i / chunks, ch = i % chunks;
        if (r < keys) {
          *reinterpret_cast<uint4*>(out + r * stride + col0 + ch * 8) =
              *reinterpret_cast<const uint4*>(tile + swizzled_offset(BN, r, col0 / 8 + ch));
        }
      }
    };
    copy_out(static_cast<T*>(p.dk) + p.dk_layout.offset(seg.kv_row0 + n0, hk),
             p.dk_layout.token_stride, smem + L.k, dk0, DKN);
    copy_out(static_cast<T*>(p.dv) + p.dv_layout.offset(seg.kv_row0 + n0, hk),
             p.dv_layout.token_stride, smem + L.v, dv0, DVN);
  };
  // Both consumers have the same widths (bwd_columns_ok): one instantiation of the loop.
  constexpr BwdColumns widths = bwd_columns(DQK, DV, 0);
  const BwdColumns mine = bwd_columns(DQK, DV, c);
  consume(std::integral_constant<int, widths.dkn>{}, std::integral_constant<int, widths.dvn>{},
          std::integral_constant<int, widths.dqn>{}, mine.dk0, mine.dv0, mine.dq0);
}

}  // namespace sm90
}  // namespace raggedattn

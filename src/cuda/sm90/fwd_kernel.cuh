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
#include "cuda/common/params.hpp"
#include "cuda/sm90/fwd_consumer.cuh"
#include "cuda/sm90/fwd_producer.cuh"
#include "cuda/sm90/hopper.cuh"

namespace raggedattn {
namespace sm90 {

using gpu::FwdParams;

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

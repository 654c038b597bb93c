// The Hopper forward's producer role and the ring it fills: the kernels' parameters, the K/V
// ring's barriers, and the TMA copies of K/V tiles into the ring's stages (a segment's partial
// last tile with its rows past the segment zeroed).
#pragma once

#include "core/sm90_shapes.hpp"
#include "cuda/common/params.hpp"
#include "cuda/sm90/hopper.cuh"

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

}  // namespace sm90
}  // namespace raggedattn

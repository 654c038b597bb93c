// The Hopper kernels' work orders, each written by one CTA before its main kernel (lpt_sort: a
// stable counting sort). The forward's: fwd_lpt_schedule below.
// The Hopper backward's order of (key tile, KV head) pairs (BwdWorkspace::schedule), one per CTA:
// segments with the most work first, each segment's key tiles together, so that the CTAs that run
// longest start first, the last wave is made of short ones (longest processing time first, by
// segment, over every KV head), and the CTAs in flight at once add into the dQ rows of a few
// segments only, which stay in L2. Inside a segment, tile by tile with its KV heads together
// where the segment has at most `interleave_rows` query rows (BwdWorkspace::interleave_rows),
// KV head by KV head otherwise (schedule_slot). A CTA's work is
// its key tile's query steps (gpu::key_tile_work: the same function the main kernel loops
// over); a segment's is that of its first key tile, the one that sees the most query rows under
// causal masking. The grid's plain order (segment by segment, KV head by KV head) left heavy tiles
// of later segments for the last wave; sorting the tiles themselves by their step count would
// spread a segment's tiles over the whole KV head, so that the dQ rows they add into leave the L2
// between one tile's adds and the next's.
//
// One CTA of kScheduleThreads: a stable counting sort of the tile map's key tiles (TileCoord: the
// main kernel then needs no search of the segments) by their segment's step count (clamped to
// kScheduleBuckets - 1 steps; indices that fall in a gap between segments count as zero steps),
// descending; stable, so within a bucket segment by segment in tile-map order, a segment's tiles
// in tile order, at positions [first, first + K). Each tile then writes its `heads` entries at
// schedule_slot's positions in [first * heads, (first + K) * heads). The Plan asks for a schedule
// only outside deterministic mode. A schedule that were not a permutation of the grid's tiles would
// skip a key tile (its dK and dV left as the poisoned outputs) or run one twice (its dQ terms
// doubled): every Hopper suite, which runs outside deterministic mode, would fail.
#pragma once

#include "cuda/common/bwd_work.cuh"
#include "cuda/common/fwd_work.cuh"
#include "cuda/common/params.hpp"

namespace raggedattn {
namespace sm90 {

constexpr int kScheduleThreads = 1024;
constexpr int kScheduleBuckets = 2 * kScheduleThreads;

// The sum of v over lanes 0 .. lane of the warp.
__device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += up;
  }
  return v;
}

// The counting sort's bucket of a tile with `work` units of work: 0 for the most (clamped),
// kScheduleBuckets - 1 for none.
__device__ __forceinline__ int lpt_bucket(int work) {
  return kScheduleBuckets - 1 - min(work, kScheduleBuckets - 1);
}

// One CTA of kScheduleThreads: a stable counting sort of the tiles tile_at(0 .. n - 1) by their
// work, the most first (lpt_bucket of work_of(tile); a gap's index, segment < 0, counts as none
// and is never passed to work_of), then emit(tile, pos) with each tile's position in that order:
// both schedules below.
template <class TileAt, class WorkOf, class Emit>
__device__ __forceinline__ void lpt_sort(int n, TileAt tile_at, WorkOf work_of, Emit emit) {
  auto bucket_of = [&](const TileCoord& tc) {
    return lpt_bucket(tc.segment < 0 ? 0 : work_of(tc));
  };
  __shared__ int start[kScheduleBuckets];
  __shared__ int warp_sums[kScheduleThreads / 32];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  for (int k = tid; k < kScheduleBuckets; k += kScheduleThreads) start[k] = 0;
  __syncthreads();
  for (int x = tid; x < n; x += kScheduleThreads) atomicAdd(&start[bucket_of(tile_at(x))], 1);
  __syncthreads();
  // Exclusive prefix sum over the buckets: thread t owns buckets 2t and 2t + 1.
  const int c0 = start[2 * tid], c1 = start[2 * tid + 1];
  const int incl = warp_inclusive_sum(c0 + c1, lane);
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) warp_sums[lane] = warp_inclusive_sum(warp_sums[lane], lane);  // over warps
  __syncthreads();
  const int before = (warp > 0 ? warp_sums[warp - 1] : 0) + incl - (c0 + c1);
  start[2 * tid] = before;
  start[2 * tid + 1] = before + c0;
  __syncthreads();
  // The scatter, stable: kScheduleThreads tiles at a time, their positions taken warp by warp,
  // inside a warp each tile after the lanes below it with the same bucket; then every thread
  // emits its tile at once (only the positions are taken in turn).
  for (int x0 = 0; x0 < n; x0 += kScheduleThreads) {
    const int x = x0 + tid;
    const TileCoord tc = x < n ? tile_at(x) : TileCoord{-1, 0};
    const int k = x < n ? bucket_of(tc) : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, k);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    const bool leader = rank == 0;
    int pos = 0;
    for (int w = 0; w < kScheduleThreads / 32; ++w) {
      if (warp == w && k >= 0) {
        pos = start[k] + rank;
        __syncwarp(peers);
        if (leader) start[k] = pos + __popc(peers);
      }
      __syncthreads();
    }
    if (k >= 0) emit(tc, pos);
  }
}

template <int BM, int BN>
__global__ void __launch_bounds__(kScheduleThreads)
    bwd_lpt_schedule(const gpu::BwdParams p, HeadTile* order, int n, int heads,
                     int64_t interleave_rows) {
  lpt_sort(
      n, [&](int x) { return p.kv_tiles.locate(x, p.segs.cu_kv); },
      // A key tile's work: its segment's steps (those of the segment's first key tile).
      [&](const TileCoord& tc) {
        return gpu::key_tile_work<BM, BN>(p, TileCoord{tc.segment, 0}).m_count;
      },
      [&](const TileCoord& tc, int pos) {
        // A gap's index stands alone (its CTAs return at once): a segment of one tile.
        const Segment seg = tc.segment >= 0 ? p.segs.get(tc.segment) : Segment{};
        const int K = tc.segment >= 0 ? int(p.kv_tiles.count(seg.len_kv)) : 1;
        const int kt = tc.segment >= 0 ? tc.tile : 0;
        const bool interleaved = tc.segment < 0 || seg.len_q <= interleave_rows;
        for (int h = 0; h < heads; ++h) {
          order[schedule_slot(pos - kt, kt, K, h, heads, interleaved)] = HeadTile{tc, h};
        }
      });
}

// The Hopper forward's query-tile order (FwdWorkspace::schedule), the same for every head: the
// tiles with the most key tiles first over all segments (longest processing time first: the last
// wave, or the persistent kernel's last items, are the lightest tiles), ties in tile-map order.
// Both forward kernels take their tiles from it (the grid kernel's x, the persistent kernel's
// items), so their KV heads still run one after the other and a tile's GQA group together. A
// query tile's work is its key tiles (gpu::key_tiles of query_tile_work: the count its
// producer and consumers loop over); a gap's index or a tile that sees no key counts as none.
template <int BM, int BN>
__global__ void __launch_bounds__(kScheduleThreads)
    fwd_lpt_schedule(const gpu::FwdParams p, TileCoord* order, int n) {
  lpt_sort(
      n, [&](int x) { return p.tiles.locate(x, p.segs.cu_q); },
      [&](const TileCoord& tc) {
        return gpu::key_tiles<BN>(gpu::query_tile_work<BM>(p, tc)).count;
      },
      [&](const TileCoord& tc, int pos) { order[pos] = tc; });
}

}  // namespace sm90
}  // namespace raggedattn

// What a Plan holds. Built once by make_plan; read by workspace sizing and by every launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dq_accum_layout.hpp"
#include "core/mask.hpp"
#include "core/segments.hpp"
#include "raggedattn/raggedattn.hpp"

namespace raggedattn {

// A byte range inside a caller's workspace.
struct Region {
  size_t offset = 0;
  size_t bytes = 0;
  template <class T>
  T* in(void* workspace) const {
    return bytes ? reinterpret_cast<T*>(static_cast<char*>(workspace) + offset) : nullptr;
  }
};

// The backward's scratch: where each piece lives and, for dQ, how it is addressed.
struct BwdWorkspace {
  DqAccumLayout dq_accum;  // the single description of the dQ scratch
  Region dq_accum_region;  // dq_accum.bytes() at an aligned offset
  Region dpsum;            // fp32 dot(dO, O), RowStatLayout
  Region locks;            // int32 per (query tile, query head): deterministic ordering
  // int32 per 64-row tile of the dQ scratch (DqAccumLayout::tile_of), zeroed by the dot(dO, O)
  // kernel in place of the scratch: 0 no key tile has written the tile, 1 one is storing it, 2
  // written (policy::bwd_dq_claimed; the Hopper backward only).
  Region dq_claims;
  // HeadTile per CTA of the Hopper backward (LaunchShape::tiles x inner_heads: every key tile for
  // every KV head): the order its CTAs take (key tile, KV head) in, segment by segment, the
  // segments with the most work first (written by sm90::bwd_lpt_schedule before each main
  // kernel). A segment of at most interleave_rows query rows runs its KV heads tile by tile
  // together (the last wave then holds the lightest tiles of every head); a longer one KV head by
  // KV head (policy::bwd_interleave_rows: its heads' query-side rows together would not stay in
  // L2). Not in deterministic mode (its turns need each segment's tiles in order).
  Region schedule;
  int64_t interleave_rows = 0;
  // With sinks: fp32 [num_heads_q][post_tiles], each post CTA's share of d_sink for each head,
  // summed in a fixed order afterwards (so d_sink is deterministic in every mode).
  Region sink_partials;
  // The post kernels' CTAs over the queries (ragged tiles of DqAccumLayout::kTileRows rows, the
  // post kernels' kPostRows): their grid's x, and the count of d_sink's shares per head.
  int64_t post_tiles = 0;
  size_t total = 0;
  // What the dot(dO, O) kernel zeroes before the main kernel: the claims where the plan has them,
  // the dQ scratch otherwise.
  const Region& cleared() const { return dq_claims.bytes ? dq_claims : dq_accum_region; }
};

struct FwdWorkspace {
  // TileCoord per query tile (LaunchShape::tiles): the order the Hopper forward's kernels take
  // the query tiles in, most key tiles first over all segments (written by
  // sm90::fwd_lpt_schedule before each kernel; the Hopper forward only).
  Region schedule;
  // uint64: the Hopper forward's work-item counter, zeroed by the launch sequence before each
  // kernel (LaunchShape::item_ctas > 0 only).
  Region work_counter;
  size_t total = 0;
};

// Which kernels run a direction: the portable ones (mma.sync, sm80+) or the Hopper ones (wgmma,
// sm_90a). The Hopper path may run a direction on the portable kernel where that measured faster;
// the dispatcher follows this field.
enum class KernelFamily { MmaSync, Wgmma };
inline const char* kernel_family_name(KernelFamily f) {
  return f == KernelFamily::Wgmma ? "wgmma" : "mma.sync";
}

// A kernel's launch shape, as chosen by the path.
struct LaunchShape {
  KernelFamily family = KernelFamily::MmaSync;
  int block_m = 0;
  int block_n = 0;
  int threads = 0;
  int stages = 1;
  size_t smem_bytes = 0;
  int64_t tiles = 0;  // the ragged tile map's index space (grid.x)
  // > 0: a persistent kernel that takes the tiles x grid_y work items (the grid it would
  // otherwise have) from a counter, its first from its CTA index, on a grid of (item_ctas, 1);
  // 0: the grid kernel (policy::fwd_ctas decides for the Hopper forward).
  int64_t item_ctas = 0;
  // The backward: each step's dQ tile goes through shared memory into the scratch by bulk
  // reduce-adds rather than by atomics (portable) or vector reductions (Hopper) from registers.
  // Portable: sm_90, fp32 scratch, atomic mode. Hopper: policy::bwd_dq_from_registers's answer,
  // negated; the Hopper kernel it selects has the shared memory and stages of this shape.
  bool dq_staged = false;
  // The grid kernel's CTAs over (tile, head). 0: grid (tiles, heads), CTA (x, y) on tile x and
  // head y, so the heads run one after the other. n > 0 (n divides the heads): grid
  // (tiles * n, heads / n). The Hopper forward's grid kernel takes a KV head's query heads, CTA
  // (x, y) on grid_slot(x, y, n): a tile's GQA group launches together (they read the same K/V
  // tiles at once). The Hopper backward outside deterministic mode takes every KV head, CTA x on
  // its schedule's entry x (BwdWorkspace::schedule: one order over every (key tile, KV head)).
  int inner_heads = 0;

  // The launch's grid for grid_y heads (the forward's query heads, the backward's KV heads):
  // cuda::launch_kernel launches it, make_plan checks it against the device's grid limits.
  struct Grid {
    int64_t x, y;
  };
  Grid grid(int grid_y) const {
    return item_ctas > 0     ? Grid{item_ctas, 1}
           : inner_heads > 0 ? Grid{tiles * inner_heads, grid_y / inner_heads}
                             : Grid{tiles, grid_y};
  }
};

// CTA (x, y)'s tile index and head under LaunchShape::inner_heads = n: x = tile * n + head % n,
// y = head / n, the grid LaunchShape::grid launches. 32-bit: make_plan keeps the grid under 2^31
// CTAs.
struct GridSlot {
  int64_t tile;
  int head;
};
RATTN_HD GridSlot grid_slot(uint32_t x, uint32_t y, uint32_t n) {
  return GridSlot{int64_t(x / n), int(y * n + x % n)};
}

struct PlanData {
  Problem problem;  // validated, defaults resolved
  DeviceCaps caps;
  Path path = Path::Cpu;
  MaskSpec mask;
  float scale = 0.f;
  LaunchShape fwd;
  LaunchShape bwd;
  FwdWorkspace fwd_ws;
  BwdWorkspace bwd_ws;

  TensorLayout q() const { return {problem.q.token, problem.q.head}; }
  TensorLayout k() const { return {problem.k.token, problem.k.head}; }
  TensorLayout v() const { return {problem.v.token, problem.v.head}; }
  TensorLayout o() const { return {problem.o.token, problem.o.head}; }
  TensorLayout d_o() const { return {problem.d_o.token, problem.d_o.head}; }
  TensorLayout dq() const { return {problem.dq.token, problem.dq.head}; }
  TensorLayout dk() const { return {problem.dk.token, problem.dk.head}; }
  TensorLayout dv() const { return {problem.dv.token, problem.dv.head}; }
  RowStatLayout row_stats() const { return {problem.total_q}; }
};

}  // namespace raggedattn

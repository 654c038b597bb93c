// Kernel parameters of the portable path, built from a Plan and the call's tensors.
//
// Plain C++ so that CPU tests can check them: every layout and size here is copied from the
// PlanData (never recomputed), which is what makes workspace sizing and kernel addressing one
// decision.
#pragma once

#include <cmath>

#include "core/dq_accum_layout.hpp"
#include "core/mask.hpp"
#include "core/segments.hpp"
#include "core/tile_map.hpp"
#include "plan/plan_data.hpp"

namespace raggedattn {
namespace gpu {

constexpr float kLog2e = 1.4426950408889634f;

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  const float* sink;  // [heads_q] sink logits; null: no sinks
  SegmentArrays segs;
  TensorLayout q_layout, k_layout, v_layout, o_layout;
  RowStatLayout stats;
  MaskSpec mask;
  RaggedTiles tiles;  // query tiles of block_m rows
  float scale_log2;   // softmax scale * log2(e): scores go straight to exp2
  float scale;
  float softcap;  // 0: off
  int group;      // query heads per KV head
};

struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* d_o;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  SegmentArrays segs;
  TensorLayout q_layout, k_layout, v_layout, o_layout, do_layout, dq_layout, dk_layout, dv_layout;
  RowStatLayout stats;  // LSE and dpsum
  MaskSpec mask;
  RaggedTiles kv_tiles;  // key tiles of block_n rows (main kernel grid)
  int q_tile_rows;       // block_m: query tile of the main kernel (deterministic lock index)
  DqAccumLayout dq_accum;
  void* dq_accum_ptr;
  float* dpsum;
  // Sinks (all null without them): the logits, their gradient, and its per-CTA shares
  // (BwdWorkspace::sink_partials, [heads_q][post_tiles]).
  const float* sink;
  float* d_sink;
  float* sink_partials;
  int64_t post_tiles;  // BwdWorkspace::post_tiles: the post kernels' grid.x
  const float* d_lse;  // the LSE's cotangent; null: zeros
  int32_t* locks;      // deterministic mode only
  // The Hopper backward's claims on the scratch's dQ tiles (BwdWorkspace::dq_claims); null: the
  // scratch is zeroed before the main kernel and every tile is added.
  int32_t* dq_claims;
  // The Hopper backward's order (BwdWorkspace::schedule): CTA x takes key tile schedule[x].tc for
  // KV head schedule[x].head; null: CTA (x, y) the tile map's x-th for KV head y.
  const HeadTile* schedule;
  float scale_log2;
  float scale;
  float softcap;
  int group;
  int heads_q;
  int stages;
  bool dq_staged;  // LaunchShape::dq_staged
};

inline FwdParams make_fwd_params(const PlanData& d, const FwdTensors& t) {
  FwdParams p{};
  p.q = t.q;
  p.k = t.k;
  p.v = t.v;
  p.o = t.o;
  p.lse = t.lse;
  p.sink = d.problem.has_sink ? t.sink : nullptr;
  p.segs = {t.cu_seqlens_q, t.cu_seqlens_kv, t.seq_offsets_q, t.seq_offsets_kv};
  p.q_layout = d.q();
  p.k_layout = d.k();
  p.v_layout = d.v();
  p.o_layout = d.o();
  p.stats = d.row_stats();
  p.mask = d.mask;
  p.tiles = RaggedTiles{d.fwd.block_m, d.problem.batch};
  p.scale = d.scale;
  p.scale_log2 = d.scale * kLog2e;
  p.softcap = d.problem.softcap;
  p.group = d.problem.num_heads_q / d.problem.num_heads_kv;
  return p;
}

inline BwdParams make_bwd_params(const PlanData& d, const BwdTensors& t, void* workspace) {
  BwdParams p{};
  p.q = t.q;
  p.k = t.k;
  p.v = t.v;
  p.o = t.o;
  p.d_o = t.d_o;
  p.lse = t.lse;
  p.dq = t.dq;
  p.dk = t.dk;
  p.dv = t.dv;
  p.segs = {t.cu_seqlens_q, t.cu_seqlens_kv, t.seq_offsets_q, t.seq_offsets_kv};
  p.q_layout = d.q();
  p.k_layout = d.k();
  p.v_layout = d.v();
  p.o_layout = d.o();
  p.do_layout = d.d_o();
  p.dq_layout = d.dq();
  p.dk_layout = d.dk();
  p.dv_layout = d.dv();
  p.stats = d.row_stats();
  p.mask = d.mask;
  p.kv_tiles = RaggedTiles{d.bwd.block_n, d.problem.batch};
  p.q_tile_rows = d.bwd.block_m;
  p.dq_accum = d.bwd_ws.dq_accum;
  p.dq_accum_ptr = d.bwd_ws.dq_accum_region.in<void>(workspace);
  p.dpsum = d.bwd_ws.dpsum.in<float>(workspace);
  p.sink = d.problem.has_sink ? t.sink : nullptr;
  p.d_sink = d.problem.has_sink ? t.d_sink : nullptr;
  p.sink_partials = d.bwd_ws.sink_partials.in<float>(workspace);
  p.post_tiles = d.bwd_ws.post_tiles;
  p.d_lse = t.d_lse;
  p.locks = d.bwd_ws.locks.in<int32_t>(workspace);
  p.dq_claims = d.bwd_ws.dq_claims.in<int32_t>(workspace);
  p.schedule = d.bwd_ws.schedule.in<HeadTile>(workspace);
  p.scale = d.scale;
  p.scale_log2 = d.scale * kLog2e;
  p.softcap = d.problem.softcap;
  p.group = d.problem.num_heads_q / d.problem.num_heads_kv;
  p.heads_q = d.problem.num_heads_q;
  p.stages = d.bwd.stages;
  p.dq_staged = d.bwd.dq_staged;
  return p;
}

}  // namespace gpu
}  // namespace raggedattn

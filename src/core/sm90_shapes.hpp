// Tile shapes and shared-memory layout of the Hopper (sm_90a, wgmma) kernels.
//
// Plain C++ (constexpr, host+device): the Plan sizes launches from these functions and the kernels
// lay out shared memory with the very same ones. Which kernel runs a problem is the Plan's rule
// (plan/policy.hpp); what each kernel looks like is here.
//
// Forward: a CTA owns block_m = 128 query rows of one head. Warp-specialized: one producer
// warpgroup copies Q once and K/V tiles of block_n = 128 keys into a three-stage ring (cp.async,
// mbarrier hand-off); two consumer warpgroups own 64 query rows each (the M of one wgmma) and run
// the products and the softmax, each at its own pace. Every tile is
// stored in the layout wgmma reads with 128-byte swizzling: the head dim is cut into panels of 64
// elements (128 bytes); a panel holds all rows of the tile, 128 bytes per row, with the 16-byte
// chunks of row r permuted by chunk ^ (r % 8).
#pragma once

#include <cstddef>

#include "core/defs.hpp"
#include "core/mask.hpp"

namespace raggedattn {
namespace sm90 {

// setmaxnreg moves registers within the CTA's own pool: what the launch allocated, threads times
// the per-thread count ptxas gives a kernel under __launch_bounds__(threads, 1) (the register
// file's share, a multiple of 8). A setmaxnreg.inc that the pool cannot serve blocks forever, so
// the warpgroups' counts after reallocation must fit this pool, not the whole register file.
RATTN_HD constexpr int register_pool(int threads) {
  return (65536 / threads) / 8 * 8 * threads;
}

// A warp-specialized kernel's tiles, ring depth and register split: one producer warpgroup and
// `consumers` consumer warpgroups of 128 threads. In the forward a CTA's block_m query rows (64
// per consumer) meet K/V tiles of block_n keys; in the backward a CTA owns block_n keys (64 per
// consumer) and streams block_m query rows per step.
struct WsConfig {
  int block_m;
  int block_n;
  int consumers;                     // consumer warpgroups
  int stages;                        // the streamed operands' ring depth (K/V; Q/dO)
  int producer_regs, consumer_regs;  // registers per thread after reallocation
};
using FwdConfig = WsConfig;
using BwdConfig = WsConfig;
RATTN_HD constexpr int ws_threads(const WsConfig& c) {
  return (c.consumers + 1) * 128;
}
// The warpgroups' registers after reallocation fit the CTA's pool.
RATTN_HD constexpr bool fits_register_pool(const WsConfig& c) {
  return 128 * c.producer_regs + 128 * c.consumers * c.consumer_regs <=
         register_pool(ws_threads(c));
}

// Per head dims: 128 keys per K/V tile and three stages up to D = 128; two stages at Dqk = 192
// (Dv = 128), where a stage's K tile is 48 KiB, and 56 producer registers (its 24 copies per
// thread of the Q tile spill under 40); at D = 256 the O accumulator (m64n256, 128
// registers) leaves room for a 64-key score tile only, and two stages fit next to the 64 KiB Q
// tile.
// The persistent kernel (`persistent`) double-buffers Q where that leaves at least two K/V stages
// (D = 64 and 128; fwd_q_buffers), so an item's Q loads while the previous item runs; at D = 128
// that costs the third stage. Its producer then takes 56 registers (its bookkeeping of two Q
// buffers spilled 36 B under 40) and the consumers 224.
RATTN_HD constexpr int fwd_q_buffers(int dqk, int /*dv*/, bool persistent) {
  return persistent && dqk <= 128 ? 2 : 1;
}
RATTN_HD constexpr FwdConfig fwd_config(int dqk, int dv, bool persistent = false) {
  return dqk == 256   ? FwdConfig{128, 64, 2, 2, 40, 232}
         : dqk == 192 ? FwdConfig{128, 128, 2, 2, 56, 224}
         : dqk == 128 && fwd_q_buffers(dqk, dv, persistent) == 2
             ? FwdConfig{128, 128, 2, 2, 56, 224}
         : fwd_q_buffers(dqk, dv, persistent) == 2 ? FwdConfig{128, 128, 2, 3, 56, 224}
                                                   : FwdConfig{128, 128, 2, 3, 40, 232};
}
// The forward's k16 steps of S = Q K^T whose Q fragments a consumer holds in registers for the
// whole item (4 registers per thread each; the rest read Q from shared memory with K). Each saves
// 2 KiB of a consumer's shared-memory operand reads per K/V tile, where at D = 128 a CTA step's
// products read 160 KiB and its K/V copies write 64 KiB. As many as fit
// without spilling inside the key loop (ptxas, sm_90a): the grid kernel holds all four at Dqk = 64
// and four of eight at Dqk = 128 (all eight spilled 84 bytes, six 92); none where O's or Q's share
// of the registers is larger (Dqk 192 and 256), and none in the persistent kernel, whose consumers
// have 224 registers (two of eight steps at Dqk = 128 spilled 76 bytes there, four at Dqk = 64 12).
RATTN_HD constexpr int fwd_q_reg_ksteps(int dqk, bool persistent) {
  return persistent ? 0 : dqk == 64 || dqk == 128 ? 4 : 0;
}
// Every head dims' config has the same warpgroups (fwd_config_ok), so one thread count.
constexpr int kFwdConsumers = 2;
RATTN_HD constexpr bool fwd_config_ok(FwdConfig c) {
  return c.consumers == kFwdConsumers && c.block_m == 64 * c.consumers && fits_register_pool(c);
}
constexpr int kFwdThreads = ws_threads(fwd_config(128, 128));
static_assert(fwd_config_ok(fwd_config(64, 64)) && fwd_config_ok(fwd_config(128, 128)) &&
                  fwd_config_ok(fwd_config(192, 128)) && fwd_config_ok(fwd_config(256, 256)) &&
                  fwd_config_ok(fwd_config(64, 64, true)) &&
                  fwd_config_ok(fwd_config(128, 128, true)),
              "one wgmma M per consumer warpgroup, and the warpgroups' registers after "
              "reallocation within the CTA's pool");

// The (head_dim_qk, head_dim_v) pairs the Hopper forward has kernels for, bf16 and fp16 each: the
// one list that fwd_supports and the entry point's dispatch (fwd_sm90.cu) read.
#define RATTN_SM90_FWD_HEAD_DIMS(X) X(64, 64) X(128, 128) X(192, 128) X(256, 256)
#define RATTN_SM90_IS_PAIR(DQK, DV) (dqk == DQK && dv == DV) ||
RATTN_HD constexpr bool fwd_supports(int dqk, int dv) {
  return RATTN_SM90_FWD_HEAD_DIMS(RATTN_SM90_IS_PAIR) false;
}

constexpr int kSwizzleBytes = 128;   // one panel row
constexpr size_t kSmemAlign = 1024;  // a swizzle atom: 8 rows x 128 bytes

RATTN_HD constexpr size_t tile_bytes(int rows, int dim) {
  return size_t(rows) * size_t(dim) * 2;
}

// Backward: a CTA owns block_n keys of one KV head (dK and dV accumulate in registers for the
// CTA's life, so GQA needs no reduction: the CTA loops over the query heads of its group) and
// streams block_m = 64 query rows per step. Warp-specialized like the forward: a producer
// warpgroup (warp 0 copies K/V once and the Q/dO/LSE/dot(dO,O) ring, Q and dO by TMA; warp 1 adds
// each step's dQ tile into the scratch with one bulk reduce from shared memory) and two consumer
// warpgroups that never wait on global memory or atomics. How the consumers share the work:
//   - D = 64, 128 and Dqk 192 / Dv 128 (key split): 128 keys, 64 per consumer (the M of one
//     wgmma); each computes the scores of its keys, and dS^T goes through shared memory to both
//     for dQ, whose columns they split. Three Q/dO stages at D = 64, two at D = 128
//     (bwd_key_split_stages). At 192/128 a consumer's dK and dV take 160 accumulator registers
//     (m64n192 and m64n128), so the consumers run at 240 registers (the producer at 24), compute
//     S^T, P^T and then dP^T in turn (not both score products in flight: bwd_kernel.cuh's
//     kScoresInTurn) and dQ in parts of 32 columns; with any of the three undone ptxas
//     serializes the wgmmas (C7512). Two stages and one dS^T buffer
//     (bwd_ds_buffers): K 48 KiB, V 32 KiB, two stages of 40 KiB, the dS^T buffer 16 KiB and the
//     fp32 dQ tile 48 KiB take 225 KiB of 227 (the column split would do 1.38x the minimum
//     matrix work here).
//   - D = 256 (column split): 64 keys, whose dK and dV (64 x 256 fp32 each) do not fit one
//     warpgroup's registers, so the consumers split their columns (bwd_columns): both compute the
//     full S^T and dP^T of the 64 keys (the same products twice, 40% more matrix work than the
//     minimum, against an exchange through shared memory), then each its columns of dV, dK and
//     dQ, from its own dS^T copy. Two stages where dQ goes from registers (below; K and V 64 KiB,
//     two stages of 64 KiB and two dS^T copies 16 KiB take 208 KiB of 227), one where the dQ
//     tile (64 KiB in fp32) takes the second's room.
RATTN_HD constexpr bool bwd_column_split(int dqk, int dv) {
  return dqk == 256 && dv == 256;
}
// A key split whose dK and dV accumulators take more than D = 128's 128 registers (192/128: 160):
// scores in turn, dQ in parts, 240 / 24 registers, two stages and one dS^T buffer (above;
// bwd_kernel.cuh).
RATTN_HD constexpr bool bwd_scores_in_turn(int dqk, int dv) {
  return !bwd_column_split(dqk, dv) && dqk + dv > 256;
}
// The key split's Q/dO stages: two at D = 128, where a third (32 KiB) hides no more latency than
// two, three at D = 64, whose tiles are half the size.
RATTN_HD constexpr int bwd_key_split_stages(int dqk) {
  return dqk == 128 ? 2 : 3;
}
// How a step's dQ reaches the scratch is the kernel's template parameter DQ_REGS (the Plan's
// choice, policy::bwd_dq_from_registers): through a shared-memory tile in the scratch's element
// type and tile order, which producer warp 1 adds with one bulk reduce-add (in deterministic mode
// once the tile's turn has come; the turns wait on other CTAs, which the consumers never do), or
// from registers, each consumer thread adding its accumulator fragments with vector reductions
// into the 16-bit scratch, the tile's shared memory then going to a second Q/dO stage.
RATTN_HD constexpr BwdConfig bwd_config(int dqk, int dv, bool dq_regs) {
  return bwd_scores_in_turn(dqk, dv)  ? BwdConfig{64, 128, 2, 2, 24, 240}
         : !bwd_column_split(dqk, dv) ? BwdConfig{64, 128, 2, bwd_key_split_stages(dqk), 40, 232}
                                      : BwdConfig{64, 64, 2, dq_regs ? 2 : 1, 40, 232};
}
constexpr BwdConfig kBwd = bwd_config(128, 128, false);
constexpr BwdConfig kBwdColumnSplit = bwd_config(256, 256, false);
constexpr int kBwdThreads = ws_threads(kBwd);
static_assert(ws_threads(kBwdColumnSplit) == kBwdThreads &&
                  ws_threads(bwd_config(256, 256, true)) == kBwdThreads &&
                  ws_threads(bwd_config(192, 128, false)) == kBwdThreads,
              "one thread count for the backward");
static_assert(kBwd.block_n == 64 * kBwd.consumers, "key split: one wgmma M of keys per consumer");
static_assert(kBwdColumnSplit.block_n == 64 && kBwdColumnSplit.consumers == 2,
              "column split: one wgmma M of keys, two sets of columns");
static_assert(fits_register_pool(kBwd) && fits_register_pool(kBwdColumnSplit) &&
                  fits_register_pool(bwd_config(256, 256, true)) &&
                  fits_register_pool(bwd_config(192, 128, false)),
              "the warpgroups' registers after reallocation exceed the CTA's pool");

// The pairs the Hopper backward has kernels for, likewise (bwd_sm90.cu).
#define RATTN_SM90_BWD_HEAD_DIMS(X) X(64, 64) X(128, 128) X(192, 128) X(256, 256)
RATTN_HD constexpr bool bwd_supports(int dqk, int dv) {
  return RATTN_SM90_BWD_HEAD_DIMS(RATTN_SM90_IS_PAIR) false;
}

// The head dims the Hopper path takes: a Hopper kernel in either direction (the other direction
// runs the portable kernel). The Plan's refusal, `check`'s skip list and the GPU suites ask this.
RATTN_HD constexpr bool path_supports(int dqk, int dv) {
  return fwd_supports(dqk, dv) || bwd_supports(dqk, dv);
}
// Consumer c's columns of dK, dV and dQ: the first and how many (a wgmma N). Key split: all of
// dK and dV (its own keys), half of dQ. Column split (D = 256): halves of each.
struct BwdColumns {
  int dk0, dkn, dv0, dvn, dq0, dqn;
};
RATTN_HD constexpr BwdColumns bwd_columns(int dqk, int dv, int c) {
  if (!bwd_column_split(dqk, dv)) return {0, dqk, 0, dv, c * dqk / 2, dqk / 2};
  return {128 * c, 128, 128 * c, 128, 128 * c, 128};
}
// The two consumers' columns cover each tensor once, in wgmma widths (96: a consumer's dQ
// columns at Dqk 192, issued in parts of 32), and have the same widths (the kernel instantiates
// one consumer loop).
RATTN_HD constexpr bool wgmma_width_ok(int n) {
  return n == 32 || n == 64 || n == 96 || n == 128;
}
RATTN_HD constexpr bool bwd_columns_ok(int dqk, int dv) {
  const BwdColumns a = bwd_columns(dqk, dv, 0), b = bwd_columns(dqk, dv, 1);
  const bool split = bwd_column_split(dqk, dv);
  const bool dk_ok = split ? (a.dk0 == 0 && b.dk0 == a.dkn && a.dkn + b.dkn == dqk)
                           : (a.dk0 == 0 && b.dk0 == 0 && a.dkn == dqk && b.dkn == dqk);
  const bool dv_ok = split ? (a.dv0 == 0 && b.dv0 == a.dvn && a.dvn + b.dvn == dv)
                           : (a.dv0 == 0 && b.dv0 == 0 && a.dvn == dv && b.dvn == dv);
  const bool dq_ok = a.dq0 == 0 && b.dq0 == a.dqn && a.dqn + b.dqn == dqk;
  const bool same = a.dkn == b.dkn && a.dvn == b.dvn && a.dqn == b.dqn;
  return dk_ok && dv_ok && dq_ok && same && wgmma_width_ok(a.dqn) && wgmma_width_ok(b.dqn) &&
         (!split || (wgmma_width_ok(a.dkn) && wgmma_width_ok(b.dkn) && wgmma_width_ok(a.dvn) &&
                     wgmma_width_ok(b.dvn)));
}
static_assert(bwd_columns_ok(64, 64) && bwd_columns_ok(128, 128) && bwd_columns_ok(256, 256) &&
                  bwd_columns_ok(192, 128),
              "each consumer's columns in wgmma widths, the two covering each tensor once");

struct FwdSmem {
  size_t q, k, v;  // byte offsets from the 1024-aligned base
  size_t q_stage, k_stage, v_stage;
  int q_buffers;
  size_t bars;   // mbarriers (fwd_barriers)
  size_t slots;  // the persistent kernel's fetched work item indices: int64 fetched[2]
  size_t items;  // and its items handed to the consumers: [q_buffers] of kFwdItemBytes
  size_t bytes;  // dynamic shared memory to request (alignment slack included)
};
// K and V of a K/V ring stage on barriers of their own (fwd_kernel.cuh's KvRing: a stage's K is
// freed once the score products with it have landed, a step before its V): in the persistent
// kernel, whose items of one to a few tiles wait for their first K at every item, and in every
// two-stage ring, where K and V freed together leave the producer only the softmax's few hundred
// cycles to land the tile two steps ahead. The grid kernel's three-stage ring has slack enough,
// and one pair of barriers per stage costs it less.
RATTN_HD constexpr bool fwd_kv_split(int dqk, int dv, bool persistent) {
  return persistent || fwd_config(dqk, dv, persistent).stages == 2;
}
// The K/V ring's mbarriers: full and empty per stage, or full_k, full_v, empty_k and empty_v per
// stage where K and V are apart.
RATTN_HD constexpr int fwd_ring_barriers(int dqk, int dv, bool persistent) {
  return (fwd_kv_split(dqk, dv, persistent) ? 4 : 2) * fwd_config(dqk, dv, persistent).stages;
}
// mbarriers: q_full[q_buffers], q_empty[q_buffers], the K/V ring's, and the producer's own for a
// partial K/V tile's TMA boxes (it zeroes the rows past the segment after).
RATTN_HD constexpr int fwd_barriers(int dqk, int dv, bool persistent) {
  return 2 * fwd_q_buffers(dqk, dv, persistent) + fwd_ring_barriers(dqk, dv, persistent) + 1;
}
// The persistent kernel hands each Q buffer's work item to the consumers whole (its segment, rows
// and key range, as the producer found them): bytes per item slot, at least the kernel's Item.
constexpr size_t kFwdItemBytes = 64;
RATTN_HD constexpr FwdSmem fwd_smem(int dqk, int dv, bool persistent = false) {
  const FwdConfig c = fwd_config(dqk, dv, persistent);
  FwdSmem s{};
  s.q_buffers = fwd_q_buffers(dqk, dv, persistent);
  s.q_stage = tile_bytes(c.block_m, dqk);
  s.k_stage = tile_bytes(c.block_n, dqk);
  s.v_stage = tile_bytes(c.block_n, dv);
  s.q = 0;
  s.k = s.q + s.q_buffers * s.q_stage;
  s.v = s.k + c.stages * s.k_stage;
  s.bars = s.v + c.stages * s.v_stage;
  s.slots = s.bars + fwd_barriers(dqk, dv, persistent) * 8;
  s.items = s.slots + 2 * 8;
  s.bytes = s.items + s.q_buffers * kFwdItemBytes + kSmemAlign;
  return s;
}
static_assert(fwd_smem(64, 64, true).bytes <= 227 * 1024 &&
                  fwd_smem(128, 128, true).bytes <= 227 * 1024 &&
                  fwd_smem(192, 128, true).bytes <= 227 * 1024 &&
                  fwd_smem(256, 256, true).bytes <= 227 * 1024,
              "the persistent forward's buffers fit an H100/H200 CTA's shared memory");

// The backward's dS^T buffers ([key][query], the A operand of dQ = dS K read M-major). Column
// split: one per consumer (each computed all of it). Key split: each consumer writes its 64 key
// rows and both read all 128 for dQ, so a step's dS^T may be written only once the other
// consumer's dQ has read the previous one: with two buffers, alternating steps, the step's dS^T
// barrier orders that; with one (the in-turn shape at Dqk 192, whose room goes to a second Q/dO
// stage), each consumer waits for the other's arrival after its dQ before it writes
// (bwd_kernel.cuh's wait_ds_free).
RATTN_HD constexpr int bwd_ds_buffers(int dqk, int dv) {
  return bwd_scores_in_turn(dqk, dv) ? 1 : 2;
}
// Backward: K, V for the CTA's life; Q, dO, LSE and dot(dO, O) in `stages` buffers; the dS^T
// buffers (bwd_ds_buffers); the dQ tile in the scratch's own element type and tile order (the
// source of the bulk reduce; none where dQ goes from registers); the mbarriers.
struct BwdSmem {
  size_t k, v, q, d_o, ds, dq, lse, dpsum, bars;  // byte offsets from the 1024-aligned base
  size_t q_stage, do_stage, ds_stage, stat_stage;
  size_t dq_tile;  // the dQ tile's bytes: room for fp32, the larger scratch type; 0 from registers
  int ds_buffers;
  size_t bytes;  // dynamic shared memory to request (alignment slack included)
};
// mbarriers: K/V landed, Q/dO stage full[stages] and empty[stages], each consumer's slice of the
// dQ tile full and empty, and the producer's own for a partial tile's TMA boxes (it zeroes the
// rows past the segment after).
RATTN_HD constexpr int bwd_barriers(int stages, int consumers) {
  return 1 + 2 * stages + 2 * consumers + 1;
}
RATTN_HD constexpr BwdSmem bwd_smem(int dqk, int dv, bool dq_regs) {
  const BwdConfig c = bwd_config(dqk, dv, dq_regs);
  BwdSmem s{};
  s.q_stage = tile_bytes(c.block_m, dqk);
  s.do_stage = tile_bytes(c.block_m, dv);
  s.ds_stage = tile_bytes(c.block_n, c.block_m);
  s.stat_stage = size_t(c.block_m) * 4;
  s.ds_buffers = bwd_ds_buffers(dqk, dv);
  s.k = 0;
  s.v = s.k + tile_bytes(c.block_n, dqk);
  s.q = s.v + tile_bytes(c.block_n, dv);
  s.d_o = s.q + c.stages * s.q_stage;
  s.ds = s.d_o + c.stages * s.do_stage;
  s.dq = s.ds + s.ds_buffers * s.ds_stage;
  s.dq_tile = dq_regs ? 0 : size_t(c.block_m) * dqk * 4;
  s.lse = s.dq + s.dq_tile;
  s.dpsum = s.lse + c.stages * s.stat_stage;
  s.bars = s.dpsum + c.stages * s.stat_stage;
  s.bytes = s.bars + bwd_barriers(c.stages, c.consumers) * 8 + kSmemAlign;
  return s;
}
static_assert(bwd_smem(64, 64, false).bytes <= 227 * 1024 &&
                  bwd_smem(128, 128, false).bytes <= 227 * 1024 &&
                  bwd_smem(256, 256, false).bytes <= 227 * 1024 &&
                  bwd_smem(256, 256, true).bytes <= 227 * 1024 &&
                  bwd_smem(192, 128, false).bytes <= 227 * 1024,
              "the backward's shared memory fits the opt-in limit of sm_90");

}  // namespace sm90
}  // namespace raggedattn

// Tile shapes and shared-memory layout of the Hopper (sm_90a, wgmma) kernels.
//
// Plain C++ (constexpr, host+device): the Plan sizes launches from these functions and the kernels
// lay out shared memory with the very same ones.
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
// products read 160 KiB and its K/V copies write 64 KiB (PERFORMANCE.md item 76). As many as fit
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

// The shortest longest-segment (max_seqlen_kv) for which backend auto/cuda runs the Hopper
// forward (the Hopper backward runs wherever the path takes the problem). Measured on the H200
// (docs/PERFORMANCE.md item 51, 2026-12-01; 32k tokens of equal causal documents, Hq 32 / Hkv 8,
// D 128, forward TFLOP/s, portable against the persistent Hopper forward): 32 tokens 9 / 7, 64
// 31 / 26, 96 50 / 53, 128 85 / 99, 192 94 / 118, 256 145 / 209. Below 96 an item has a single
// key tile and the portable kernel's lighter start wins. (Items 18 and 43 had put the crossover at
// 384, before items 47, 49 and 50 made the persistent forward 45% faster on short documents.) A
// forced cuda_sm90 runs every problem it supports on the Hopper kernels in both directions.
constexpr int kAutoMinSeqlenKv = 96;

// The Hopper forward's schedule (LaunchShape::item_ctas): 0 for the grid kernel (one CTA per
// query tile x head, the hardware's block dispatch), or the CTA count of the persistent kernel
// (one CTA per SM over work_items items, the first from its CTA index, the rest from a counter).
// The persistent kernel pays its set-up once per SM and overlaps the next item's loads with the
// current one's last product and epilogue, a gain per item that shrinks as items grow. At D = 64
// and 128 the grid kernel holds half of Q in registers (fwd_q_reg_ksteps) and at D = 128 a third
// K/V stage where the persistent one has a second Q buffer (fwd_config); at Dqk 192 and 256 both
// have one Q buffer and two stages. fwd_persistent decides from the key tiles
// (the kernel's block_n) a document's query tiles see on average (fwd_mean_key_tiles, under the
// problem's mask): persistent where a document of the problem's mean length (total / batch: the
// Plan knows the bounds, not the lengths) sees at most fwd_persistent_max_mean_key_tiles and its
// longest at most fwd_persistent_max_longest_key_tiles. What decides is the length of the items
// the problem has, and a pack's items are mostly its shorter documents' (item 103: docs_mixed_32k,
// longest 29, all its items 21.7 on average, +0.8-0.9% persistent, where equal documents of 28.5
// ran 0.9% faster on the grid kernel). For equal documents (mean = longest) the first limit
// decides. Measured on the
// H200 (Hq 32 / Hkv 8, bf16, 32k-token packs of equal causal documents, docs_mixed_32k's
// documents and one 16k document, forward TFLOP/s, persistent against grid; the mean in
// parentheses):
//   D = 128 (docs/PERFORMANCE.md item 89, two rounds): 1536 tokens (6.5) +7.2%, 2048 (8.5)
//     +5.2%, 3072 (12.5) +2.3%, 4096 (16.5) +3.6%, 6144 (24.5) +0.8%; one round: docs_mixed_32k
//     (longest 7198: 29) +0.2%, 16384 (64.5) -0.9%. Again after item 101 (item 103, three rounds):
//     3072 (12.5) +2.7%, 6144 (24.5) -0.3%, 7168 (28.5) -0.9%, 7552 (30) -0.6%, docs_mixed_32k
//     (29; its mean document 3641 tokens: 14.7) +0.9% and +0.8% (two calls), docs_mixed_32k_full
//     (57) -1.6%, 16384 (64.5) -2.3%. Up to 25, the longest up to 29. This rule against the
//     previous one (item 104, four rounds): docs_mixed_32k +0.8%.
//   D = 64 (item 91, one round): 1536 (6.5) +12.7%, 3072 (12.5) +2.7%, 4096 (16.5) +1.6%, 6144
//     (24.5) -1.9%. Up to 17.
//   Dqk 192 / Dv 128 (item 91, one round): 1536 (6.5) +8.6%, 6144 (24.5) +3.1%, docs_mixed_32k
//     (29) +1.9%, 16384 (64.5) +0.7%. Up to 64.5, the longest measured.
//   D = 256, 64-key tiles (item 91, one round): 1536 (13) +3.1%, 3072 (25) +2.6%, 6144 (49)
//     +1.7%, docs_mixed_32k (58) +1.2%, 16384 (129) +1.2%. Up to 129, the longest measured.
// (Items 24 and 27 had measured the grid kernel ahead above 1024 tokens at D = 128, before items
// 47-59 made the persistent kernel's items cheaper; until item 91 the other head dims kept that
// rule.)
RATTN_HD constexpr double fwd_persistent_max_mean_key_tiles(int dqk, int /*dv*/) {
  return dqk == 64 ? 17 : dqk == 128 ? 25 : dqk == 192 ? 64.5 : 129;
}
// Measured beyond the mean's limit on a mixed pack at D = 128 only; elsewhere the same limit.
RATTN_HD constexpr double fwd_persistent_max_longest_key_tiles(int dqk, int dv) {
  return dqk == 128 ? 29 : fwd_persistent_max_mean_key_tiles(dqk, dv);
}
// The mean over the query tiles (bm rows) of one document of len_q queries and len_kv keys of the
// key tiles (bn keys) each sees under `mask`: the forward's work items' length in key tiles.
inline double fwd_mean_key_tiles(const MaskSpec& mask, int len_q, int len_kv, int bm, int bn) {
  const int tiles_q = (len_q + bm - 1) / bm;
  if (tiles_q == 0) return 0.0;
  int64_t seen = 0;
  for (int t = 0; t < tiles_q; ++t) {
    const int m0 = t * bm, rows = m0 + bm < len_q ? bm : len_q - m0;
    seen += mask.key_tiles(m0, rows, bn, len_q, len_kv).count;
  }
  return double(seen) / tiles_q;
}
// The problem's documents as the Plan knows them: its longest (the bounds) and one of its mean
// length (rows over segments, rounded up, at most the bound: padded THD's rows and bounds that
// are loose both stay within it; empty segments count, as they lower the items' average too).
struct FwdDocs {
  int64_t max_q, max_kv;    // max_seqlen_q, max_seqlen_kv
  int64_t mean_q, mean_kv;  // min(ceil(total / batch), max)
  static FwdDocs of(int64_t total_q, int64_t total_kv, int64_t batch, int64_t max_q,
                    int64_t max_kv) {
    const int64_t b = batch > 0 ? batch : 1;
    const auto mean = [b](int64_t total, int64_t max) {
      const int64_t m = (total + b - 1) / b;
      return m < max ? m : max;
    };
    return {max_q, max_kv, mean(total_q, max_q), mean(total_kv, max_kv)};
  }
  static FwdDocs equal(int64_t len) { return {len, len, len, len}; }  // documents of one length
};
inline bool fwd_persistent(int dqk, int dv, const MaskSpec& mask, const FwdDocs& docs) {
  const FwdConfig c = fwd_config(dqk, dv, true);
  const auto tiles = [&](int64_t q, int64_t kv) {
    return fwd_mean_key_tiles(mask, int(q), int(kv), c.block_m, c.block_n);
  };
  return tiles(docs.mean_q, docs.mean_kv) <= fwd_persistent_max_mean_key_tiles(dqk, dv) &&
         tiles(docs.max_q, docs.max_kv) <= fwd_persistent_max_longest_key_tiles(dqk, dv);
}
inline int64_t fwd_ctas(int num_sms, int64_t work_items, bool persistent) {
  if (!persistent || work_items <= 0) return 0;
  return num_sms < work_items ? int64_t(num_sms) : work_items;
}

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
//     fp32 dQ tile 48 KiB take 225 KiB of 227. (Until item 86 192/128 took the column split:
//     1.38x the minimum matrix work; until item 88 it had one stage and two dS^T buffers.)
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
// How a step's dQ reaches the scratch (the backward kernel's template parameter DQ_REGS; the Plan
// and the launch ask this, and bwd_config and bwd_smem take its answer):
//   through a tile (false): the consumers store dQ into a shared-memory tile in the scratch's
//     element type and tile order, and producer warp 1 adds the tile with one bulk reduce-add,
//     in deterministic mode once the tile's turn has come (the turns wait on other CTAs, which
//     the consumers never do);
//   from registers (true): each consumer thread adds its accumulator fragments itself with vector
//     reductions into the 16-bit scratch (red.global.add.noftz.v2.bf16x2 / .v2.f16x2), and the
//     tile's shared memory goes to a second Q/dO stage. Taken by the column split (D = 256) with
//     a 16-bit scratch outside deterministic mode, where the tile is what keeps the kernel at one
//     stage. Measured on the H200 (docs/PERFORMANCE.md item 90, 2026-12-02; D = 256, Hq 32 /
//     Hkv 8, backward TFLOP/s against the tile and one stage): 16-bit scratch, one causal document
//     of 16k tokens +18.8%, docs_short_32k's documents +11%; an fp32 scratch by
//     red.global.add.v4.f32 -7.0% and -6.9% on one document and docs_mixed_32k's, -5.5% without a
//     mask, level on short documents: fp32 reductions from registers cost more than the stage
//     gains (as at D = 128, where they freed no stage: -2.4 to -3.3%, item 75).
RATTN_HD constexpr bool bwd_dq_from_registers(int dqk, int dv, bool deterministic, bool fp32_dq) {
  return bwd_column_split(dqk, dv) && !deterministic && !fp32_dq;
}
// Whether the scratch's dQ tiles are claimed rather than zeroed first (BwdWorkspace::dq_claims):
// producer warp 1 claims each tile it writes (an int32 per 64-row tile of the scratch,
// DqAccumLayout::tile_of): the first key tile to claim a tile stores it with a plain bulk copy and
// then marks it written, the others add into it once it is marked; dq_convert writes zeros where
// no key tile claimed one. The scratch then needs no zeroing pass (its whole region, 2x dQ's bytes
// in fp32), and no first reduce-add reads zeros back. Taken wherever warp 1 adds the tiles
// (DQ_REGS off) outside deterministic mode, whose turns keep the zeroed scratch. Measured on the
// H200 (docs/PERFORMANCE.md item 93, 2026-12-03; D = 128, Hq 32 / Hkv 8, backward TFLOP/s against
// the zeroed scratch): docs_short_32k +4.0%, its 16-bit mode +1.7%, 32k tokens of 1536-token
// documents +2.9%, the long workloads level (-1.1 to +0.6%), with each step's claim taken before
// its tile is in (warp 1's CAS after the tile: -2.8% there and -6% on long documents). Not at
// D = 64, whose steps are half as long: there the claims cost the backward 19% (item 115,
// 2026-12-04: one causal 16k-token document 415 before them, 338 after; with them off at D = 64
// only, fp32 / 16-bit dQ: 346 -> 423 / 384 -> 434 on that document, 170 -> 179 / 187 -> 196 on
// docs_short_32k's documents). Kept at 192/128 and 256, where they gain 17% and 8% on
// docs_short_32k's documents (at D = 256 one 16k document ran 2.4% behind the zeroed scratch).
RATTN_HD constexpr bool bwd_dq_claimed(int dqk, bool dq_regs, bool deterministic) {
  return dqk != 64 && !dq_regs && !deterministic;
}
// The longest segment (query rows) whose KV heads the backward's schedule interleaves tile by
// tile (BwdWorkspace::schedule): one whose query side for every head, what its CTAs stream (Q and
// dO rows, the dQ scratch's, LSE and dot(dO, O)), fits 1 / kBwdInterleaveL2Share of the L2 (at
// D = 128, Hq 32 and the fp32 scratch, 1 587 rows of a 50 MB L2). A longer segment runs KV
// head by KV head: its CTAs in flight then share one KV head's query heads. Measured on the H200
// (docs/PERFORMANCE.md item 99; D = 128, Hq 32 / Hkv 8, backward against heads one after the
// other): every segment interleaved, docs_short_32k +2.8% and docs_mixed_32k +1.0% but
// docs_mixed_32k_full -0.8% and one_doc_16k -0.6% (all 32 heads' rows of a long document in
// flight at once); by this rule, with the whole L2, +1.8%, +1.8%, +0.8% and level (one_doc_16k's
// order is the old one); with half of it +2.1%, +1.4%, +0.7%.
constexpr int64_t kBwdInterleaveL2Share = 1;
inline int64_t bwd_interleave_rows(int64_t l2_bytes, int heads_q, int dqk, int dv,
                                   int accum_bytes) {
  const int64_t row_bytes = int64_t(heads_q) * (2 * dqk + 2 * dv + accum_bytes * dqk + 8);
  return l2_bytes / kBwdInterleaveL2Share / row_bytes;
}
// The key split's Q/dO stages at D = 64 and 128. At D = 128 the third stage (32 KiB) gains
// nothing: measured on the H200 (docs/PERFORMANCE.md item 110, 2026-12-04; Hq 32 / Hkv 8, two
// rounds in two calls, backward TFLOP/s, two stages against three) docs_mixed_32k +0.4 / +0.8%,
// docs_short_32k +0.8 / +0.4%, one_doc_16k +1.0 / +0.6%, docs_mixed_32k_full +1.2% (one round);
// the 16-bit mode +0.4 to +1.8%. (Item 17 had measured the third stage at +1-5% when the kernel
// ran at 130-370.) D = 64 keeps the three it was measured with.
RATTN_HD constexpr int bwd_key_split_stages(int dqk) {
  return dqk == 128 ? 2 : 3;
}
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
// two-stage ring, where K and V freed together leave the producer the softmax's few hundred cycles
// to land the tile two steps ahead (the D = 256 and Dqk 192 grid kernels: item 84's profile put
// 27% of the D = 256 consumers' stall samples on that wait). Measured on the H200
// (docs/PERFORMANCE.md items 50 and 85): the persistent kernel's two-stage ring +4.6% on
// docs_short_32k at D = 128; the grid kernel's three-stage ring -1.3% on one_doc_16k, so it keeps
// one pair of barriers per stage.
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
// mbarriers: K/V landed, Q/dO stage full[stages] and empty[stages], dQ tile full and empty, and
// the producer's own for a partial tile's TMA boxes (it zeroes the rows past the segment after).
RATTN_HD constexpr int bwd_barriers(int stages) {
  return 1 + 2 * stages + 2 + 1;
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
  s.bytes = s.bars + bwd_barriers(c.stages) * 8 + kSmemAlign;
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

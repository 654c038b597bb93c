// The Plan's rules: which kernel of a path runs a problem, and how. Each rule is a plain function
// of the problem and the device that make_plan asks once; the kernels read its answer from the
// PlanData (LaunchShape, the workspaces) and never ask again. The measurements behind each rule
// are in docs/PERFORMANCE.md ("Design decisions"); a comment here says what the rule trades.
#pragma once

#include <cstdint>

#include "core/defs.hpp"
#include "core/mask.hpp"
#include "core/sm90_shapes.hpp"

namespace raggedattn {
namespace policy {

// --- Which forward kernel: portable or Hopper ---------------------------------------------------

// Backend auto/cuda runs the Hopper forward from this longest key segment (max_seqlen_kv) up: below
// it a query tile sees a single key tile, and the portable kernel's lighter start wins. The Hopper
// backward runs wherever the path takes the problem; a forced cuda_sm90 uses the Hopper kernels
// for every problem they take.
constexpr int kAutoMinSeqlenKv = 96;

// --- The Hopper forward: persistent or grid kernel -----------------------------------------------

// The persistent kernel (one CTA per SM taking work items from a counter) pays its set-up once
// per SM and loads the next item's Q during the current item's last product, a gain per item that
// shrinks as items grow longer; the grid kernel keeps Q in registers and, at D = 128, a third K/V
// stage. So the persistent kernel runs where a document of the problem's mean length sees at most
// this many key tiles per query tile on average (the crossover measured at each head dim)...
RATTN_HD constexpr double fwd_persistent_max_mean_key_tiles(int dqk, int /*dv*/) {
  return dqk == 64 ? 17 : dqk == 128 ? 25 : dqk == 192 ? 64.5 : 129;
}
// ...and its longest document at most this many: a mixed pack's items are mostly its shorter
// documents', so the longest may exceed the mean's limit (measured at D = 128 only).
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
// length (rows over segments, rounded up, at most the bound: padded THD's rows and loose bounds
// both stay within it; empty segments count, as they lower the items' average too).
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
  const sm90::FwdConfig c = sm90::fwd_config(dqk, dv, true);
  const auto tiles = [&](int64_t q, int64_t kv) {
    return fwd_mean_key_tiles(mask, int(q), int(kv), c.block_m, c.block_n);
  };
  return tiles(docs.mean_q, docs.mean_kv) <= fwd_persistent_max_mean_key_tiles(dqk, dv) &&
         tiles(docs.max_q, docs.max_kv) <= fwd_persistent_max_longest_key_tiles(dqk, dv);
}

// The Hopper forward's CTA count (LaunchShape::item_ctas): 0 for the grid kernel, else one CTA per
// SM, or per item where there are fewer items than SMs.
inline int64_t fwd_ctas(int num_sms, int64_t work_items, bool persistent) {
  if (!persistent || work_items <= 0) return 0;
  return num_sms < work_items ? int64_t(num_sms) : work_items;
}

// --- The Hopper backward: how dQ reaches the scratch ---------------------------------------------

// dQ from the consumers' registers (vector reductions into the scratch) instead of through a
// shared-memory tile that producer warp 1 adds: only at D = 256 with a 16-bit scratch outside
// deterministic mode, where the tile's 64 KiB become a second Q/dO stage. fp32 reductions from
// registers cost more than the stage gains, and deterministic mode needs warp 1's turns.
RATTN_HD constexpr bool bwd_dq_from_registers(int dqk, int dv, bool deterministic, bool fp32_dq) {
  return sm90::bwd_column_split(dqk, dv) && !deterministic && !fp32_dq;
}

// dQ tiles claimed instead of zeroed first (BwdWorkspace::dq_claims): the first key tile to claim
// a scratch tile stores it with a plain copy, so no pass zeroes the scratch and no first add reads
// zeros back. The claims pay off where steps are long enough to hide them; at D = 64 their cost
// outweighs the zeroing saved. Deterministic mode keeps the zeroed scratch its turns add into.
RATTN_HD constexpr bool bwd_dq_claimed(int dqk, bool dq_regs, bool deterministic) {
  return dqk != 64 && !dq_regs && !deterministic;
}

// --- The Hopper backward's schedule -------------------------------------------------------------

// The longest segment (query rows) whose KV heads the backward's schedule interleaves tile by
// tile (BwdWorkspace::schedule): one whose query side for every head (Q and dO rows, the dQ
// scratch's, LSE and dot(dO, O)) fits 1 / kBwdInterleaveL2Share of the L2. Interleaving balances
// short documents across heads; a longer segment runs KV head by KV head, so that its CTAs in
// flight share one KV head's query heads in L2.
constexpr int64_t kBwdInterleaveL2Share = 1;
inline int64_t bwd_interleave_rows(int64_t l2_bytes, int heads_q, int dqk, int dv,
                                   int accum_bytes) {
  const int64_t row_bytes = int64_t(heads_q) * (2 * dqk + 2 * dv + accum_bytes * dqk + 8);
  return l2_bytes / kBwdInterleaveL2Share / row_bytes;
}

}  // namespace policy
}  // namespace raggedattn

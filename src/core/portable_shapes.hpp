// Tile shapes and shared-memory layouts of the portable (sm80+, mma.sync) kernels.
//
// Plain C++ (constexpr, host+device): the Plan sizes launches from these functions and the kernels
// lay out shared memory with the very same ones, so the two cannot disagree.
//
// Why these shapes:
//  - Forward: a CTA owns block_m query rows of one head and streams block_n keys at a time.
//    Head dims <= 128 give each of 4 warps 32 rows (two m16 fragments share every K/V fragment
//    load, halving shared-memory reads per FLOP); head dims >= 192 would then need > 255
//    registers for the output accumulator, so 8 warps own 16 rows each.
//  - Backward: a CTA owns block_n keys of one KV head (dK, dV accumulate in registers, so GQA
//    needs no scratch reduction: the CTA loops over the query heads of its group) and streams
//    block_m query rows. block_n = 128 for head dims <= 128; 64 above, where 16 keys x 256 dims
//    of dK plus dV would not fit one warp's registers.
//  - Every shared-memory row is padded by 16 bytes: row pitches of 4 words mod 32 banks make
//    ldmatrix's eight 16-byte row reads conflict-free for every supported head dim (96 included,
//    where an XOR swizzle over 12 chunks would not be closed).
#pragma once

#include <cstddef>

#include "core/defs.hpp"

namespace raggedattn {
namespace portable {

constexpr int kSmemPad = 8;  // elements of 16-bit data: 16 bytes

struct FwdConfig {
  int block_m;
  int block_n;
  int warps;
};

struct BwdConfig {
  int block_m;  // queries per step
  int block_n;  // keys per CTA
  int warps;
  int s_warps_key;   // score tiles [block_n x block_m]: warps along keys (the rest along queries)
  int kv_warps_key;  // dK/dV [block_n x dim]: warps along keys (the rest along the head dim)
  int dq_warps_q;    // dQ tile [block_m x dqk]: warps along queries (the rest along the head dim)
};

RATTN_HD constexpr FwdConfig fwd_config(int dqk, int /*dv*/) {
  return dqk <= 128 ? FwdConfig{128, 64, 4} : FwdConfig{128, 64, 8};
}
// Warp tiles of 32 x 32 (or larger along the head dim) in every product: each warp reuses every
// fragment it loads twice or more, which keeps shared-memory reads under the tensor-core time.
RATTN_HD constexpr BwdConfig bwd_config(int dqk, int /*dv*/) {
  return dqk <= 128 ? BwdConfig{64, 128, 8, 4, 4, dqk == 96 ? 4 : 2}
                    : BwdConfig{64, 64, 8, 2, 2, 2};
}

// Columns of the dQ tile [block_m x dqk] one warp computes (warps split queries x head dim).
RATTN_HD constexpr int bwd_dq_warp_cols(int dqk, int dv) {
  const BwdConfig c = bwd_config(dqk, dv);
  return dqk / (c.warps / c.dq_warps_q);
}

// The largest power of two <= n (n >= 1), without a loop (it folds wherever n is a constant).
RATTN_HD constexpr int pow2_floor(int n) {
  unsigned p = unsigned(n);
  p |= p >> 1;
  p |= p >> 2;
  p |= p >> 4;
  p |= p >> 8;
  p |= p >> 16;
  return int(p - (p >> 1));
}
// The staged dQ tile's store order (sm_90 build of the backward). A thread holds nc chunks of a
// row (8 columns each, bwd_dq_warp_cols / 8) and writes them into the scratch's row layout, rows
// dqk floats apart: a multiple of 128 bytes, so rows r = lane / 4 = 0..7 of one store would all
// hit the same banks. The chunks form blocks of a power of two (6 = 4 + 2), and store k of row r
// writes chunk b0 + (k - b0 + r) mod B of the block [b0, b0 + B) holding k, which spreads the
// eight rows over the banks (tests/cpu/smem_layout_test.cpp counts the passes). At most two
// blocks: nc - pow2_floor(nc) must be a power of two or 0 (nc = 2, 4, 6, 8 here).
struct DqStageBlocks {
  int first, second;  // chunks [0, first) and [first, first + second)
};
RATTN_HD constexpr DqStageBlocks dq_stage_blocks(int nc) {
  return {pow2_floor(nc), nc - pow2_floor(nc)};
}
RATTN_HD constexpr int dq_stage_chunk(int k, int r, int nc) {
  const DqStageBlocks s = dq_stage_blocks(nc);
  const int b0 = k < s.first ? 0 : s.first, b = k < s.first ? s.first : s.second;
  return b0 + ((k - b0 + r) & (b - 1));
}

// Byte offsets inside the dynamic shared memory of one forward CTA.
struct FwdSmem {
  int q_pitch, k_pitch, v_pitch;  // elements
  size_t q, k, v, bytes;
};
RATTN_HD constexpr FwdSmem fwd_smem(int dqk, int dv) {
  FwdConfig c = fwd_config(dqk, dv);
  FwdSmem s{};
  s.q_pitch = dqk + kSmemPad;
  s.k_pitch = dqk + kSmemPad;
  s.v_pitch = dv + kSmemPad;
  s.q = 0;
  s.k = s.q + size_t(c.block_m) * s.q_pitch * 2;
  s.v = s.k + size_t(c.block_n) * s.k_pitch * 2;
  s.bytes = s.v + size_t(c.block_n) * s.v_pitch * 2;
  return s;
}

// Backward: K, V stay for the CTA's life; Q, dO, LSE, dot(dO,O) come in `stages` buffers;
// P^T and dS^T ([key][query]) hand the score tiles from one warp layout to the next.
// dq_staged (the Plan's choice on sm_90, LaunchShape::dq_staged): a step's fp32 dQ tile
// [block_m][dqk] also passes through shared memory in the scratch's own row layout (rows dqk floats
// apart), added into the scratch by one bulk reduce-add; dq is then its offset, else dq == bytes
// and dq_pitch == 0.
struct BwdSmem {
  int stages;
  int q_pitch, k_pitch, v_pitch, do_pitch, s_pitch;  // elements
  int dq_pitch;                                      // floats
  size_t k, v, q, d_o, pt, dst, lse, dpsum, dq;      // bytes
  size_t q_stage, do_stage, stat_stage;              // bytes per stage
  size_t bytes;
};
RATTN_HD constexpr BwdSmem bwd_smem(int dqk, int dv, int stages, bool dq_staged = false) {
  BwdConfig c = bwd_config(dqk, dv);
  BwdSmem s{};
  s.stages = stages;
  s.q_pitch = dqk + kSmemPad;
  s.k_pitch = dqk + kSmemPad;
  s.v_pitch = dv + kSmemPad;
  s.do_pitch = dv + kSmemPad;
  s.s_pitch = c.block_m + kSmemPad;
  s.q_stage = size_t(c.block_m) * s.q_pitch * 2;
  s.do_stage = size_t(c.block_m) * s.do_pitch * 2;
  s.stat_stage = size_t(c.block_m) * 4;
  s.k = 0;
  s.v = s.k + size_t(c.block_n) * s.k_pitch * 2;
  s.q = s.v + size_t(c.block_n) * s.v_pitch * 2;
  s.d_o = s.q + s.q_stage * stages;
  s.pt = s.d_o + s.do_stage * stages;
  s.dst = s.pt + size_t(c.block_n) * s.s_pitch * 2;
  s.lse = s.dst + size_t(c.block_n) * s.s_pitch * 2;
  s.dpsum = s.lse + s.stat_stage * stages;
  const size_t end = s.dpsum + s.stat_stage * stages;
  s.dq_pitch = dq_staged ? dqk : 0;
  s.dq = dq_staged ? (end + 127) / 128 * 128 : end;
  s.bytes = s.dq + size_t(c.block_m) * s.dq_pitch * 4;
  return s;
}

// Rows of alignment of a segment's slot in the dQ accumulation scratch (16-row aligned slots).
constexpr int kDqAccumAlign = 16;

}  // namespace portable
}  // namespace raggedattn

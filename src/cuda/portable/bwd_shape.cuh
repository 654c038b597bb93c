// What every part of the portable backward kernel shares: its compile-time shape (BwdWarps: the
// CTA's tiles and each product's warp tile, from core/portable_shapes.hpp's bwd_config) and where
// one warp's tiles start (BwdWarpOrigin). The parts: bwd_scores.cuh (P^T and dS^T),
// bwd_dq_out.cuh (the step's dQ into the scratch), bwd_epilogue.cuh (dK and dV out);
// bwd_kernel.cuh runs the loads and the products around them.
#pragma once

#include "core/portable_shapes.hpp"
#include "cuda/common/bwd_work.cuh"
#include "cuda/portable/warp_mma.cuh"

namespace raggedattn {
namespace portable {

template <class T_, int DQK_, int DV_>
struct BwdWarps {
  using T = T_;
  using Mma = gpu::MmaType<T>;
  static constexpr int DQK = DQK_, DV = DV_;
  static constexpr BwdConfig C = bwd_config(DQK, DV);
  static constexpr int BM = C.block_m, BN = C.block_n, NW = C.warps, NT = NW * 32;
  // Score tiles [BN keys x BM queries]: warp tile S_KW keys x S_QW queries.
  static constexpr int S_KW = BN / C.s_warps_key, S_QW = BM / (NW / C.s_warps_key);
  // dK/dV [BN keys x dim]: warp tile KV_KW keys x (DK_W | DV_W) columns.
  static constexpr int KV_KW = BN / C.kv_warps_key, KV_DW = NW / C.kv_warps_key;
  static constexpr int DK_W = DQK / KV_DW, DV_W = DV / KV_DW;
  // dQ tile [BM queries x DQK]: warp tile DQ_QW queries x DQ_W columns.
  static constexpr int DQ_QW = BM / C.dq_warps_q, DQ_W = bwd_dq_warp_cols(DQK, DV);
  static constexpr int S_MF = S_KW / 16, S_NF = S_QW / 8;
  static constexpr int KV_MF = KV_KW / 16, DQ_MF = DQ_QW / 16;
  static_assert(S_KW % 16 == 0 && S_QW % 16 == 0, "score warp tile");
  static_assert(KV_KW % 16 == 0 && DK_W % 16 == 0 && DV_W % 16 == 0, "dK/dV warp tile");
  static_assert(DQ_QW % 16 == 0 && DQ_W % 16 == 0, "dQ warp tile");
};

// Warp `warp`'s first row and column in each product's grid.
struct BwdWarpOrigin {
  int s_key0, s_q0;             // scores
  int kv_key0, dk_col0, dv_col0;  // dK and dV
  int dq_row0, dq_col0;         // dQ

  template <class W>
  __device__ __forceinline__ static BwdWarpOrigin of(int warp) {
    constexpr BwdConfig C = W::C;
    BwdWarpOrigin o;
    o.s_key0 = (warp % C.s_warps_key) * W::S_KW;
    o.s_q0 = (warp / C.s_warps_key) * W::S_QW;
    o.kv_key0 = (warp % C.kv_warps_key) * W::KV_KW;
    o.dk_col0 = (warp / C.kv_warps_key) * W::DK_W;
    o.dv_col0 = (warp / C.kv_warps_key) * W::DV_W;
    o.dq_row0 = (warp % C.dq_warps_q) * W::DQ_QW;
    o.dq_col0 = (warp / C.dq_warps_q) * W::DQ_W;
    return o;
  }
};

}  // namespace portable
}  // namespace raggedattn

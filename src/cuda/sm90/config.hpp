// Tile shapes and shared-memory layout of the Hopper (sm_90a, wgmma) kernels.
//
// Plain C++ (constexpr, host+device): the Plan sizes launches from these functions and the kernels
// lay out shared memory with the very same ones.
//
// Forward: a CTA owns block_m = 128 query rows of one head, as two warpgroups of 64 rows (the M of
// one wgmma), and streams block_n = 128 keys per step through a two-stage K/V ring. Every tile is
// stored in the layout wgmma reads with 128-byte swizzling: the head dim is cut into panels of 64
// elements (128 bytes); a panel holds all rows of the tile, 128 bytes per row, with the 16-byte
// chunks of row r permuted by chunk ^ (r % 8).
#pragma once

#include <cstddef>

#include "core/defs.hpp"

namespace raggedattn {
namespace sm90 {

struct FwdConfig {
  int block_m;
  int block_n;
  int warpgroups;
};

constexpr FwdConfig kFwd{128, 128, 2};

// The head dims the Hopper forward is built for (one instantiation each, bf16 and fp16).
RATTN_HD constexpr bool fwd_supports(int dqk, int dv) {
  return dqk == 128 && dv == 128;
}

constexpr int kSwizzleBytes = 128;  // one panel row
constexpr int kPanelElems = 64;     // 16-bit elements per panel row
constexpr size_t kSmemAlign = 1024;  // a swizzle atom: 8 rows x 128 bytes

RATTN_HD constexpr size_t tile_bytes(int rows, int dim) {
  return size_t(rows) * size_t(dim) * 2;
}

struct FwdSmem {
  size_t q, k, v;     // byte offsets from the 1024-aligned base
  size_t k_stage, v_stage;
  size_t bytes;       // dynamic shared memory to request (alignment slack included)
};
RATTN_HD constexpr FwdSmem fwd_smem(int dqk, int dv) {
  FwdSmem s{};
  s.k_stage = tile_bytes(kFwd.block_n, dqk);
  s.v_stage = tile_bytes(kFwd.block_n, dv);
  s.q = 0;
  s.k = s.q + tile_bytes(kFwd.block_m, dqk);
  s.v = s.k + 2 * s.k_stage;
  s.bytes = s.v + 2 * s.v_stage + kSmemAlign;
  return s;
}

}  // namespace sm90
}  // namespace raggedattn

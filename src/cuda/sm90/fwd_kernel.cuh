// Forward kernel of the Hopper path (sm_90a): one CTA per (query tile of a segment, query head),
// two warpgroups of 64 query rows each, wgmma with register accumulators.
//
// Per key tile n (128 keys):
//   S = Q K_n^T      8 x wgmma m64n128k16, both operands from shared memory (K-major)
//   online softmax   on the S registers (same fragment layout as mma.sync: the masking and the
//                    row statistics are the portable kernel's)
//   O += P V_n       P re-packed in registers as the A operand; 8 x 2 wgmma m64n64k16 with V
//                    read N-major (transposed) from shared memory
// K and V stream through a two-stage ring: tile n + 1 loads (cp.async) while tile n computes.
// The CTA tile map, the tile order (heaviest causal tiles first), the mask band and the outputs
// are the portable forward's; only the matrix products and the shared-memory layout differ.
#pragma once

#include "cuda/portable/math.cuh"
#include "cuda/portable/params.hpp"
#include "cuda/portable/warp_mma.cuh"
#include "cuda/sm90/config.hpp"
#include "cuda/sm90/hopper.cuh"
#include "cuda/sm90/wgmma_ops.hpp"

namespace raggedattn {
namespace sm90 {

using portable::FwdParams;

template <class T, int D>
__global__ void __launch_bounds__(kFwd.warpgroups * 128, 1)
    fwd_kernel(const __grid_constant__ FwdParams p) {
  constexpr int BM = kFwd.block_m, BN = kFwd.block_n, NT = kFwd.warpgroups * 128;
  constexpr int NF = BN / 8;   // n8 fragments of a score row block
  constexpr int OP = D / 64;   // output panels of 64 columns (one m64n64 accumulator each)
  constexpr int KSTEPS = D / 16;
  constexpr FwdSmem L = fwd_smem(D, D);
  static_assert(D % 64 == 0, "head dim in whole panels");
  using Mma = portable::MmaType<T>;

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlign - 1) & ~uintptr_t(kSmemAlign - 1));
  unsigned char* sQ = smem + L.q;
  const uint32_t q_addr = portable::smem_addr(sQ);
  const uint32_t k_addr = portable::smem_addr(smem + L.k);
  const uint32_t v_addr = portable::smem_addr(smem + L.v);

  const int tid = threadIdx.x, lane = tid % 32;
  const int wg = tid / 128, warp_in_wg = (tid % 128) / 32;
  const TileCoord tc = p.tiles.locate(gridDim.x - 1 - blockIdx.x, p.segs.cu_q);
  if (tc.segment < 0) return;
  const int h = blockIdx.y, hk = h / p.group;
  const Segment seg = p.segs.get(tc.segment);
  const int m0 = tc.tile * BM;
  const int rows = min(BM, seg.len_q - m0);
  const int key_lo = p.mask.key_begin(m0, seg.len_q, seg.len_kv);
  const int key_hi = p.mask.key_end(m0 + rows - 1, seg.len_q, seg.len_kv);

  T* o = static_cast<T*>(p.o) + p.o_layout.offset(seg.q_row0 + m0, h);
  float* lse = p.lse + p.stats.offset(h, seg.q_row0 + m0);
  const int64_t o_stride = p.o_layout.token_stride;

  if (key_lo >= key_hi) {  // no row of this tile sees a key: O = 0, LSE = -inf
    for (int c = tid; c < rows * (D / 8); c += NT) {
      const int r = c / (D / 8), col = (c % (D / 8)) * 8;
      *reinterpret_cast<uint4*>(o + r * o_stride + col) = make_uint4(0, 0, 0, 0);
    }
    for (int r = tid; r < rows; r += NT) lse[r] = -INFINITY;
    return;
  }

  const T* q = static_cast<const T*>(p.q) + p.q_layout.offset(seg.q_row0 + m0, h);
  const T* k = static_cast<const T*>(p.k) + p.k_layout.offset(seg.kv_row0, hk);
  const T* v = static_cast<const T*>(p.v) + p.v_layout.offset(seg.kv_row0, hk);
  const int64_t k_stride = p.k_layout.token_stride, v_stride = p.v_layout.token_stride;
  const int n_first = key_lo / BN, n_last = (key_hi - 1) / BN;

  auto load_kv = [&](int n, int stage) {
    const int n0 = n * BN;
    load_tile_sw128<BN, D, NT>(smem + L.k + stage * L.k_stage, k + int64_t(n0) * k_stride,
                               k_stride, seg.len_kv - n0, tid);
    load_tile_sw128<BN, D, NT>(smem + L.v + stage * L.v_stage, v + int64_t(n0) * v_stride,
                               v_stride, seg.len_kv - n0, tid);
  };
  load_tile_sw128<BM, D, NT>(sQ, q, p.q_layout.token_stride, rows, tid);
  load_kv(n_first, 0);
  portable::cp_async_commit();

  float acc_o[OP][8][4];
  float row_max[2], row_sum[2];
  portable::zero(acc_o);
  row_max[0] = row_max[1] = -INFINITY;
  row_sum[0] = row_sum[1] = 0.f;
  // This thread's rows in the CTA tile (the wgmma accumulator layout).
  const int row_a = wg * 64 + warp_in_wg * 16 + lane / 4;

  for (int n = n_first; n <= n_last; ++n) {
    const int n0 = n * BN;
    const int stage = (n - n_first) & 1;
    portable::cp_async_wait<0>();
    fence_proxy_async_smem();
    __syncthreads();  // K_n, V_n are in; every warpgroup is done with tile n - 1's stage
    if (n < n_last) {
      load_kv(n + 1, stage ^ 1);
      portable::cp_async_commit();
    }

    // S = Q K_n^T for this warpgroup's 64 rows.
    float s[NF][4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      const uint32_t panel = kk / 4, within = (kk % 4) * 32;
      const uint64_t da = desc_k_major(q_addr + panel * BM * kSwizzleBytes +
                                       wg * 64 * kSwizzleBytes + within);
      const uint64_t db = desc_k_major(k_addr + stage * uint32_t(L.k_stage) +
                                       panel * BN * kSwizzleBytes + within);
      ss_m64n128k16<T>(s, da, db, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    pin(s);

    // Scores to the log2 domain (soft-cap first), then the mask where the tile straddles the band.
    if (p.softcap > 0.f) {
      const float pre = p.scale / p.softcap, post = p.softcap * portable::kLog2e;
#pragma unroll
      for (int f = 0; f < NF; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[f][e] = portable::fast_tanh(s[f][e] * pre) * post;
    } else {
#pragma unroll
      for (int f = 0; f < NF; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[f][e] *= p.scale_log2;
    }
    if (!p.mask.block_full(m0, m0 + BM, n0, n0 + BN, seg.len_q, seg.len_kv)) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = m0 + row_a + 8 * half;
        const int lo = p.mask.key_begin(i, seg.len_q, seg.len_kv);
        const int hi = p.mask.key_end(i, seg.len_q, seg.len_kv);
#pragma unroll
        for (int f = 0; f < NF; ++f)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = n0 + f * 8 + 2 * (lane % 4) + e;
            if (j < lo || j >= hi) s[f][2 * half + e] = -INFINITY;
          }
      }
    }

    // Online softmax over this thread's two rows.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float mx = row_max[half];
#pragma unroll
      for (int f = 0; f < NF; ++f) mx = fmaxf(mx, fmaxf(s[f][2 * half], s[f][2 * half + 1]));
      mx = portable::quad_max(mx);
      const float base = mx == -INFINITY ? 0.f : mx;  // a row with nothing visible yet
      const float alpha = portable::fast_exp2(row_max[half] - base);
      row_max[half] = mx;
      float sum = 0.f;
#pragma unroll
      for (int f = 0; f < NF; ++f)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pr = portable::fast_exp2(s[f][2 * half + e] - base);
          s[f][2 * half + e] = pr;
          sum += pr;
        }
      row_sum[half] = row_sum[half] * alpha + sum;
#pragma unroll
      for (int pn = 0; pn < OP; ++pn)
#pragma unroll
        for (int f = 0; f < 8; ++f) {
          acc_o[pn][f][2 * half] *= alpha;
          acc_o[pn][f][2 * half + 1] *= alpha;
        }
    }

    // O += P V_n: P as the register A operand, 16 keys per instruction.
    uint32_t a[BN / 16][4];
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
      a[kc][0] = Mma::pack(s[2 * kc][0], s[2 * kc][1]);
      a[kc][1] = Mma::pack(s[2 * kc][2], s[2 * kc][3]);
      a[kc][2] = Mma::pack(s[2 * kc + 1][0], s[2 * kc + 1][1]);
      a[kc][3] = Mma::pack(s[2 * kc + 1][2], s[2 * kc + 1][3]);
    }
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc)
#pragma unroll
      for (int pn = 0; pn < OP; ++pn) {
        const uint64_t db = desc_n_major(v_addr + stage * uint32_t(L.v_stage) +
                                         pn * BN * kSwizzleBytes + kc * 16 * kSwizzleBytes);
        rs_m64n64k16_tb<T>(acc_o[pn], a[kc], db, 1);
      }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int pn = 0; pn < OP; ++pn) pin(acc_o[pn]);
  }

  // Epilogue: normalize and write this thread's O elements; LSE in natural log.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float l = portable::quad_sum(row_sum[half]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int r = row_a + 8 * half;
    if (r < rows) {
      T* orow = o + r * o_stride + 2 * (lane % 4);
#pragma unroll
      for (int pn = 0; pn < OP; ++pn)
#pragma unroll
        for (int f = 0; f < 8; ++f) {
          *reinterpret_cast<uint32_t*>(orow + pn * 64 + f * 8) =
              Mma::pack(acc_o[pn][f][2 * half] * inv, acc_o[pn][f][2 * half + 1] * inv);
        }
      if (lane % 4 == 0) lse[r] = l > 0.f ? row_max[half] * portable::kLn2 + logf(l) : -INFINITY;
    }
  }
}

}  // namespace sm90
}  // namespace raggedattn

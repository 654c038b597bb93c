// Forward kernel of the portable path: one CTA per (query tile of a segment, query head).
//
// Per key tile: S = Q K^T (tensor cores, fp32), scale into the log2 domain (soft-cap first),
// mask only where the tile straddles a band edge, online softmax, O += P V with P re-packed from
// the S accumulators in registers (the softmax: fwd_softmax.cuh). K and V have one shared-memory
// buffer each: V_n loads while S_n is computed, K_{n+1} while P V_n is.
#pragma once

#include "core/portable_shapes.hpp"
#include "cuda/common/fwd_work.cuh"
#include "cuda/common/math.cuh"
#include "cuda/common/params.hpp"
#include "cuda/portable/fwd_softmax.cuh"
#include "cuda/portable/warp_mma.cuh"

namespace raggedattn {
namespace portable {

template <class T, int DQK, int DV>
__global__ void __launch_bounds__(fwd_config(DQK, DV).warps * 32)
    fwd_kernel(const __grid_constant__ gpu::FwdParams p) {
  constexpr FwdConfig C = fwd_config(DQK, DV);
  constexpr int BM = C.block_m, BN = C.block_n, NT = C.warps * 32;
  constexpr int WM = BM / C.warps;  // query rows per warp
  constexpr int MF = WM / 16;       // m16 fragments per warp
  constexpr int NF = BN / 8;        // n8 fragments of a score tile
  constexpr int OF = DV / 8;        // n8 fragments of the output
  constexpr FwdSmem L = fwd_smem(DQK, DV);
  static_assert(WM % 16 == 0 && BN % 16 == 0 && DQK % 16 == 0 && DV % 16 == 0, "tile shapes");
  using Mma = gpu::MmaType<T>;

  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + L.q);
  T* sK = reinterpret_cast<T*>(smem + L.k);
  T* sV = reinterpret_cast<T*>(smem + L.v);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Under a causal mask a segment's last query tiles see the most keys: walking the index space
  // backwards starts the longest CTAs first and leaves the short ones to fill the tail.
  const TileCoord tc = p.tiles.locate(gridDim.x - 1 - blockIdx.x, p.segs.cu_q);
  if (tc.segment < 0) return;
  const int h = blockIdx.y, hk = h / p.group;
  const gpu::QueryTileWork w = gpu::query_tile_work<BM>(p, tc);
  const Segment seg = w.seg;
  const int m0 = w.m0, rows = w.rows, key_lo = w.key_lo, key_hi = w.key_hi;

  T* o = static_cast<T*>(p.o) + p.o_layout.offset(seg.q_row0 + m0, h);
  float* lse = p.lse + p.stats.offset(h, seg.q_row0 + m0);
  const int64_t o_stride = p.o_layout.token_stride;

  if (key_lo >= key_hi) {  // no row of this tile sees a key: O = 0, LSE = -inf
    gpu::write_unseen_tile<T, DV>(p, w, h, tid, NT);
    return;
  }

  const T* q = static_cast<const T*>(p.q) + p.q_layout.offset(seg.q_row0 + m0, h);
  const T* k = static_cast<const T*>(p.k) + p.k_layout.offset(seg.kv_row0, hk);
  const T* v = static_cast<const T*>(p.v) + p.v_layout.offset(seg.kv_row0, hk);
  const int64_t k_stride = p.k_layout.token_stride, v_stride = p.v_layout.token_stride;
  const int n_first = key_lo / BN, n_last = (key_hi - 1) / BN;

  load_tile_async<BM, DQK, NT>(sQ, L.q_pitch, q, p.q_layout.token_stride, rows, tid);
  load_tile_async<BN, DQK, NT>(sK, L.k_pitch, k + int64_t(n_first) * BN * k_stride, k_stride,
                               seg.len_kv - n_first * BN, tid);
  gpu::cp_async_commit();

  float acc_o[MF][OF][4];
  float row_max[MF][2], row_sum[MF][2];
#pragma unroll
  for (int mf = 0; mf < MF; ++mf) {
#pragma unroll
    for (int f = 0; f < OF; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mf][f][e] = 0.f;
    row_max[mf][0] = row_max[mf][1] = -INFINITY;
    row_sum[mf][0] = row_sum[mf][1] = 0.f;
  }
  const int wm0 = warp * WM;

  for (int n = n_first; n <= n_last; ++n) {
    const int n0 = n * BN;
    gpu::cp_async_wait<0>();
    __syncthreads();  // K_n is in; every warp is done with V_{n-1}
    load_tile_async<BN, DV, NT>(sV, L.v_pitch, v + int64_t(n0) * v_stride, v_stride,
                                seg.len_kv - n0, tid);
    gpu::cp_async_commit();

    float s[MF][NF][4];
    zero(s);
    warp_gemm<T, MF, NF, DQK, false, false>(s, sQ, L.q_pitch, wm0, sK, L.k_pitch, 0, lane);

    online_softmax<BM, MF, NF, OF>(p, seg, m0, n0, wm0, lane, s, row_max, row_sum, acc_o);

    gpu::cp_async_wait<0>();
    __syncthreads();  // V_n is in; every warp is done with K_n
    if (n < n_last) {
      load_tile_async<BN, DQK, NT>(sK, L.k_pitch, k + int64_t(n0 + BN) * k_stride, k_stride,
                                   seg.len_kv - n0 - BN, tid);
      gpu::cp_async_commit();
    }

    // O += P V, P from the score registers.
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
      uint32_t a[MF][4];
#pragma unroll
      for (int mf = 0; mf < MF; ++mf) {
        a[mf][0] = Mma::pack(s[mf][2 * kc][0], s[mf][2 * kc][1]);
        a[mf][1] = Mma::pack(s[mf][2 * kc][2], s[mf][2 * kc][3]);
        a[mf][2] = Mma::pack(s[mf][2 * kc + 1][0], s[mf][2 * kc + 1][1]);
        a[mf][3] = Mma::pack(s[mf][2 * kc + 1][2], s[mf][2 * kc + 1][3]);
      }
#pragma unroll
      for (int nd = 0; nd < DV / 16; ++nd) {
        uint32_t b[4];
        load_b_kn(b, sV, L.v_pitch, nd * 16, kc * 16, lane);
#pragma unroll
        for (int mf = 0; mf < MF; ++mf) {
          mma_16x8x16<T>(acc_o[mf][2 * nd], a[mf], b[0], b[1]);
          mma_16x8x16<T>(acc_o[mf][2 * nd + 1], a[mf], b[2], b[3]);
        }
      }
    }
  }

  // Epilogue: normalize; stage this warp's O rows in its own rows of the Q buffer (only this warp
  // ever read them), then write whole rows with 16-byte stores; LSE in natural log.
  T* sO = sQ;
  static_assert(DV <= DQK, "O is staged in the Q buffer");
  const float sink2 = gpu::sink_log2(p, h);
#pragma unroll
  for (int mf = 0; mf < MF; ++mf)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const gpu::RowScale fin =
          gpu::finish_row(row_max[mf][half], gpu::quad_sum(row_sum[mf][half]), sink2);
      const float inv = fin.inv;
      const int r = wm0 + mf * 16 + lane / 4 + 8 * half;
      T* srow = sO + r * L.q_pitch + 2 * (lane % 4);
#pragma unroll
      for (int f = 0; f < OF; ++f) {
        *reinterpret_cast<uint32_t*>(srow + f * 8) =
            Mma::pack(acc_o[mf][f][2 * half] * inv, acc_o[mf][f][2 * half + 1] * inv);
      }
      if (lane % 4 == 0 && r < rows) lse[r] = fin.lse;
    }
  __syncwarp();
  constexpr int kChunks = DV / 8;  // 16-byte chunks per row
#pragma unroll
  for (int c = lane; c < WM * kChunks; c += 32) {
    const int r = wm0 + c / kChunks, col = (c % kChunks) * 8;
    if (r < rows) {
      *reinterpret_cast<uint4*>(o + r * o_stride + col) =
          *reinterpret_cast<const uint4*>(sO + r * L.q_pitch + col);
    }
  }
}

}  // namespace portable
}  // namespace raggedattn

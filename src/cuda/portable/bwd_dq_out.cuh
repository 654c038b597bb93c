// The portable backward's step, after dQ's product: this warp's rows of the step's dQ tile into
// the scratch. Either added from the registers (atomics, or in the key tiles' turn in
// deterministic mode), or, where the Plan stages dQ (sm_90, fp32, atomic mode), written into
// shared memory in the scratch's row layout for one bulk reduce-add of the whole tile by thread 0
// after the next CTA barrier (the rows of a query tile are contiguous in the scratch): atomics
// from registers stall the next writer of each source register until the atomic has read it,
// where the bulk copy reads shared memory asynchronously.
#pragma once

#include <type_traits>

#include "cuda/common/bulk_async.cuh"
#include "cuda/portable/bwd_shape.cuh"

namespace raggedattn {
namespace portable {

// Deterministic mode: the key tiles that add into a query tile take turns (MaskSpec::
// key_tile_turn), so every run sums alike. Thread 0 waits for this CTA's turn on query tile
// m_tile of head h (key tile `key_tile`), then the CTA; returns the tile's lock.
template <int BM, int BN>
__device__ __forceinline__ int32_t* wait_dq_turn(const gpu::BwdParams& p, int key_tile, int b,
                                                 const Segment& seg, int h, int m_tile, int tid) {
  const int expected = p.mask.key_tile_turn(key_tile, m_tile * BM, BN, seg.len_q, seg.len_kv);
  int32_t* lock = gpu::dq_tile_lock<BM>(p, b, seg, h, m_tile);
  if (tid == 0) {
    while (atomicAdd(lock, 0) != expected) __nanosleep(64);
    __threadfence();
  }
  __syncthreads();
  return lock;
}
// The turn passes on once every thread's additions are performed.
__device__ __forceinline__ void pass_dq_turn(int32_t* lock, int tid) {
  __threadfence();
  __syncthreads();
  if (tid == 0) atomicAdd(lock, 1);
}

// c[B0 + f] <- c[B0 + (f + r) mod B] over the block [B0, B0 + B) (B a power of two), by a shifter
// of selects on r's bits: the staged dQ tile's registers in dq_stage_chunk's store order.
template <int B0, int B, int N>
__device__ __forceinline__ void rotate_chunks(float2 (&c)[N], int r) {
#pragma unroll
  for (int sh = 1; sh < B; sh <<= 1) {
    const bool on = (r & sh) != 0;
    float2 n[B];
#pragma unroll
    for (int f = 0; f < B; ++f) {
      n[f].x = on ? c[B0 + (f + sh) % B].x : c[B0 + f].x;
      n[f].y = on ? c[B0 + (f + sh) % B].y : c[B0 + f].y;
    }
#pragma unroll
    for (int f = 0; f < B; ++f) c[B0 + f] = n[f];
  }
}

// The staged tile (sdq, rows dq_pitch floats apart): each row writes its 8-column chunks in
// dq_stage_chunk's order (rotated by the row inside power-of-two blocks), so a store's eight rows,
// DQK floats apart, spread over the banks instead of all landing in one. The registers follow by
// a shifter of selects on r's bits.
template <class W>
__device__ __forceinline__ void stage_dq_tile(float* sdq, int dq_pitch, const BwdWarpOrigin& o,
                                              int lane,
                                              const float (&dq)[W::DQ_MF][W::DQ_W / 8][4]) {
  constexpr int NC = W::DQ_W / 8;
  constexpr DqStageBlocks kBlocks = dq_stage_blocks(NC);  // 6 = 4 + 2
  constexpr int NB1 = kBlocks.first, NB2 = kBlocks.second;
  static_assert(NB2 == 0 || pow2_floor(NB2) == NB2, "at most two power-of-two blocks");
  const int r = lane / 4;
#pragma unroll
  for (int mf = 0; mf < W::DQ_MF; ++mf)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float* srow = sdq + (o.dq_row0 + mf * 16 + r + 8 * half) * dq_pitch + o.dq_col0 +
                    2 * (lane % 4);
      float2 c[NC];
#pragma unroll
      for (int f = 0; f < NC; ++f) {
        c[f] = make_float2(dq[mf][f][2 * half], dq[mf][f][2 * half + 1]);
      }
      rotate_chunks<0, NB1>(c, r);
      if constexpr (NB2 > 0) rotate_chunks<NB1, NB2>(c, r);
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        *reinterpret_cast<float2*>(srow + dq_stage_chunk(k, r, NC) * 8) = c[k];
      }
    }
  gpu::fence_proxy_async_smem();  // visible to the bulk copy (async proxy) after the barrier
}

// This thread's rows, from row i0 of the segment (the others 8, 16, ... below) at scratch offset
// dq_first, into the scratch of element type fp32 (kF32) or the input's, in turn (kInTurn: the
// tile's lock is held) or by atomics. The scratch's rows are DQK elements apart (the Plan's layout
// has the problem's head dim, checked at launch), so one address serves all of a thread's rows
// with constant offsets: a register reused for the next row's address would wait for the atomics
// still reading it.
template <class W, bool kF32, bool kInTurn>
__device__ __forceinline__ void add_dq_rows(const gpu::BwdParams& p, int64_t dq_first, int i0,
                                            int len_q,
                                            const float (&dq)[W::DQ_MF][W::DQ_W / 8][4]) {
  using Elem = std::conditional_t<kF32, float, typename W::T>;
  Elem* dst = static_cast<Elem*>(p.dq_accum_ptr) + dq_first;
  asm volatile("" : "+l"(dst));  // made once: not rebuilt per row in a reused register
#pragma unroll
  for (int mf = 0; mf < W::DQ_MF; ++mf)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mf * 16 + 8 * half;
      if (i0 + r < len_q) {
        gpu::add_dq_fragments<typename W::T, kF32, kInTurn>(dst + r * W::DQK, dq[mf], half);
      }
    }
}

// The accumulation mode, one branch per step.
template <class W>
__device__ __forceinline__ void add_dq(const gpu::BwdParams& p, bool in_turn, int64_t dq_first,
                                       int i0, int len_q,
                                       const float (&dq)[W::DQ_MF][W::DQ_W / 8][4]) {
  if (in_turn) {
    if (p.dq_accum.type == AccumType::F32) {
      add_dq_rows<W, true, true>(p, dq_first, i0, len_q, dq);
    } else {
      add_dq_rows<W, false, true>(p, dq_first, i0, len_q, dq);
    }
  } else if (p.dq_accum.type == AccumType::F32) {
    add_dq_rows<W, true, false>(p, dq_first, i0, len_q, dq);
  } else {
    add_dq_rows<W, false, false>(p, dq_first, i0, len_q, dq);
  }
}

}  // namespace portable
}  // namespace raggedattn

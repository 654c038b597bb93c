// The Hopper backward's dQ writer, producer warp 1 (lane 0): each step's dQ tile, rows
// [m0, m0 + BM) of head h, from shared memory into the scratch with one bulk copy. In
// deterministic mode it waits for the tile's turn first; elsewhere, where the Plan reserved
// claims (BwdWorkspace::dq_claims), the first key tile to claim a scratch tile stores it and the
// others add into it once it is written, so the scratch is never zeroed. Not in the kernel that
// adds dQ from the consumers' registers (DQ_REGS).
#pragma once

#include "cuda/sm90/bwd_cta.cuh"

namespace raggedattn {
namespace sm90 {

template <class S>
__device__ __forceinline__ void bwd_dq_writer(const BwdParams& p, const BwdCta& cta) {
  constexpr int BM = S::BM, BN = S::BN;
  const gpu::KeyTileWork& w = cta.w;
  const Segment& seg = w.seg;
  const BwdBarriers& bars = cta.bars;
  for (int it = 0, qt = w.m_rot, qh = 0; it < w.steps; ++it, w.next_step(qt, qh)) {
    const int h = cta.hk * p.group + qh;  // as warp 0 counts them
    const int m_tile = w.m_first + qt;
    const int m0 = m_tile * BM;
    // The whole tile, in the scratch's tile order (rows past the segment's end, whatever they
    // hold, land in its own slot's last tile and are never read).
    const int64_t off = p.dq_accum.offset(0, cta.b, seg.cu_q, h, m0);
    // Claimed tiles: the first key tile to claim this one (0 -> 1) stores it and marks it
    // written (2) once its bulk copy has completed; any other adds only once the tile is marked.
    // The marking mirrors the deterministic turns' release and acquire. The claim is taken before
    // the step's tile is in (its round trip overlaps the consumers' step, not this warp's
    // hand-off).
    int32_t* claim = p.dq_claims ? p.dq_claims + p.dq_accum.tile_of(off) : nullptr;
    const int claimed = claim ? atomicCAS(claim, 0, 1) : 2;
    mbar_wait(bars.dq_full, it & 1);
    int32_t* lock = nullptr;
    int expected = 0;
    if (p.locks != nullptr) {  // deterministic: this key tile's turn on the dQ tile
      expected = p.mask.key_tile_turn(cta.tc.tile, m0, BN, seg.len_q, seg.len_kv);
      lock = gpu::dq_tile_lock<BM>(p, cta.b, seg, h, m_tile);
      while (atomicAdd(lock, 0) != expected) __nanosleep(64);
      __threadfence();
    }
    const bool first = claimed == 0;
    if (claim && !first) {  // another key tile's: wait for its store
      for (int state = claimed; state != 2; state = atomicAdd(claim, 0)) __nanosleep(32);
      __threadfence();
      fence_proxy_async_global();  // the store seen before this thread's bulk reduce-add
    }
    void* dst = static_cast<unsigned char*>(p.dq_accum_ptr) + off * p.dq_accum.elem_bytes();
    const uint32_t bytes = uint32_t(BM) * S::DQK * uint32_t(p.dq_accum.elem_bytes());
    unsigned char* tile = cta.smem + S::L.dq;
    if (first) {
      bulk_store(dst, tile, bytes);
    } else if (p.dq_accum.type == AccumType::F32) {
      bulk_reduce_add(static_cast<float*>(dst), tile, bytes);
    } else {
      // The 16-bit scratch is in the input's own format (the Plan's AccumType).
      bulk_reduce_add(static_cast<typename S::T*>(dst), tile, bytes);
    }
    bulk_commit();
    if (lock) {
      bulk_wait_done();
      fence_proxy_async_global();
      __threadfence();
      atomicAdd(lock, 1);
    } else {
      bulk_wait_read();
    }
    mbar_arrive(bars.dq_empty);  // the tile's shared memory may be written again
    if (first) {                 // the tile is written: the other key tiles may add into it
      bulk_wait_done();
      fence_proxy_async_global();
      __threadfence();
      atomicExch(claim, 2);
    }
  }
  bulk_wait_done();
}

}  // namespace sm90
}  // namespace raggedattn

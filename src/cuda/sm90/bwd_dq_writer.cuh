// The Hopper backward's dQ writer, producer warp 1 (lane 0): each step's dQ tile, rows
// [m0, m0 + BM) of head h, from shared memory into the scratch with one bulk copy per consumer's
// slice. In deterministic mode it waits for the tile's turn first; elsewhere, where the Plan
// reserved claims (BwdWorkspace::dq_claims), the first key tile to claim a scratch tile stores it
// and the others add into it once it is written, so the scratch is never zeroed. Not in the
// kernel that adds dQ from the consumers' registers (DQ_REGS).
#pragma once

#include "cuda/sm90/bwd_cta.cuh"

namespace raggedattn {
namespace sm90 {

// One consumer's slice of the step's dQ tile (its bytes at `off` in both) into the scratch at
// `dst`: stored by the tile's first claimer, added otherwise, in the scratch's element type.
template <class S>
__device__ __forceinline__ void dq_slice_out(const BwdParams& p, void* dst, const void* src,
                                             uint32_t bytes, bool first) {
  if (first) {
    bulk_store(dst, src, bytes);
  } else if (p.dq_accum.type == AccumType::F32) {
    bulk_reduce_add(static_cast<float*>(dst), src, bytes);
  } else {
    // The 16-bit scratch is in the input's own format (the Plan's AccumType).
    bulk_reduce_add(static_cast<typename S::T*>(dst), src, bytes);
  }
  bulk_commit();
}

// Each consumer's slice goes out as soon as that consumer has written it (dq_full[c]) and is
// handed back once read (dq_empty[c]), so a consumer never waits for the other's dQ.
template <class S>
__device__ __forceinline__ void bwd_dq_writer(const BwdParams& p, const BwdCta& cta) {
  constexpr int BM = S::BM, BN = S::BN;
  const gpu::KeyTileWork& w = cta.w;
  const Segment& seg = w.seg;
  const BwdBarriers& bars = cta.bars;
  const uint32_t slice_bytes = uint32_t(BM) * S::kDqSliceCols * uint32_t(p.dq_accum.elem_bytes());
  // The step's whole tile, in the scratch's tile order (rows past the segment's end, whatever
  // they hold, land in its own slot's last tile and are never read).
  auto head = [&](int qh) { return cta.hk * p.group + qh; };  // as warp 0 counts them
  auto tile_offset = [&](int qt, int qh) {
    return p.dq_accum.offset(0, cta.b, seg.cu_q, head(qh), (w.m_first + qt) * BM);
  };
  // Claimed tiles: the first key tile to claim one (0 -> 1) stores it and marks it written (2)
  // once its bulk copies have completed; any other adds only once the tile is marked. The
  // marking mirrors the deterministic turns' release and acquire. Each step's claim is taken
  // while the step before it is read out, so its round trip overlaps that wait, not this warp's
  // hand-off.
  auto take_claim = [&](int64_t off, int& claimed) -> int32_t* {
    int32_t* claim = p.dq_claims ? p.dq_claims + p.dq_accum.tile_of(off) : nullptr;
    claimed = claim ? atomic_cas_acquire(claim, 0, 1) : 2;
    return claim;
  };
  // A key tile no query row sees has no step; its first tile (query_tiles' empty span) may be a
  // tile other key tiles write, and a claim taken on it would never be marked.
  if (w.steps == 0) return;
  int qt = w.m_rot, qh = 0;
  int64_t off = tile_offset(qt, qh);
  int claimed;
  int32_t* claim = take_claim(off, claimed);
  for (int it = 0; it < w.steps; ++it) {
    const int m_tile = w.m_first + qt;
    mbar_wait(&bars.dq_full[0], it & 1);
    int32_t* lock = nullptr;
    int expected = 0;
    if (p.locks != nullptr) {  // deterministic: this key tile's turn on the dQ tile
      const int m0 = m_tile * BM;
      expected = p.mask.key_tile_turn(cta.tc.tile, m0, BN, seg.len_q, seg.len_kv);
      lock = gpu::dq_tile_lock<BM>(p, cta.b, seg, head(qh), m_tile);
      while (load_acquire(lock) != expected) __nanosleep(64);
      fence_proxy_async_global();  // the earlier turns' adds seen before this thread's
    }
    const bool first = claimed == 0;
    if (claim && !first) {  // another key tile's: wait for its store (acquired with the mark)
      for (int state = claimed; state != 2; state = load_acquire(claim)) __nanosleep(32);
      fence_proxy_async_global();  // the store seen before this thread's bulk reduce-add
    }
    unsigned char* dst =
        static_cast<unsigned char*>(p.dq_accum_ptr) + off * p.dq_accum.elem_bytes();
    const unsigned char* tile = cta.smem + S::L.dq;
    dq_slice_out<S>(p, dst, tile, slice_bytes, first);
    mbar_wait(&bars.dq_full[1], it & 1);
    dq_slice_out<S>(p, dst + slice_bytes, tile + slice_bytes, slice_bytes, first);
    // The next step's tile and claim, while this step's slices are read.
    int32_t* const step_claim = claim;
    if (it + 1 < w.steps) {
      w.next_step(qt, qh);
      off = tile_offset(qt, qh);
      claim = take_claim(off, claimed);
    }
    // Each slice's shared memory may be written again once its group has read it.
    bulk_wait_read_but<1>();  // slice 0's group
    mbar_arrive(&bars.dq_empty[0]);
    bulk_wait_read();
    mbar_arrive(&bars.dq_empty[1]);
    // The next turn, or the other key tiles' adds, once this step's writes are performed.
    if (lock || first) {
      bulk_wait_done();
      fence_proxy_async_global();
      if (lock) add_release(lock, 1);
      if (first) store_release(step_claim, 2);
    }
  }
  bulk_wait_done();
}

}  // namespace sm90
}  // namespace raggedattn

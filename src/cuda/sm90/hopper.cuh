// Hopper building blocks: shared-memory addressing, stmatrix, the wgmma fences, mbarriers, named
// barriers, TMA and bulk copies, setmaxnreg, and the loader that writes a tile in the
// 128-byte-swizzled panel layout of sm90_shapes.hpp (the wgmma descriptors: descriptor.hpp).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; nothing here calls the driver)

#include <cstdint>

#include "cuda/common/bulk_async.cuh"
#include "cuda/common/warp.cuh"
#include "core/sm90_shapes.hpp"
#include "cuda/sm90/descriptor.hpp"

namespace raggedattn {
namespace sm90 {

// The dynamic shared memory rounded up to kSmemAlign. The offset is added to the __shared__ array
// itself, so the compiler still knows the result points into shared memory; a round trip through
// an integer made it a generic pointer, and every access through it a generic LD.E / ST.E with
// its address conversion (profiled in the backward's LSE reads, dS^T and dQ tile stores). The
// backward and the persistent forward use it; the grid forward keeps the round trip (see
// fwd_kernel.cuh).
__device__ __forceinline__ unsigned char* aligned_smem(unsigned char* raw) {
  const uint32_t misalign = gpu::smem_addr(raw) % uint32_t(kSmemAlign);
  return raw + (misalign == 0 ? 0 : uint32_t(kSmemAlign) - misalign);
}

// Byte offset of 16-byte chunk `chunk` (along the head dim) of row `row` in a tile of `rows`
// rows: panel chunk / 8, then the row, then the chunk permuted within the row's 128 bytes.
__device__ __forceinline__ uint32_t swizzled_offset(int rows, int row, int chunk) {
  return uint32_t((chunk >> 3) * rows * kSwizzleBytes + row * kSwizzleBytes +
                  (((chunk & 7) ^ (row & 7)) << 4));
}

// Four 8x8 tiles of 16-bit elements, from the mma fragment layout into shared memory (stmatrix
// .x4): r[i] holds this thread's pair of tile i (row lane / 4, columns 2 (lane % 4) and the next);
// lanes 8i .. 8i + 7 give the shared-memory addresses of tile i's eight 16-byte rows.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// The proxy fences and bulk reduce-adds (plain sm_90, shared with the portable backward's sm_90
// build): fence_proxy_async_smem makes this thread's generic-proxy shared-memory writes (cp.async
// included) visible to the async proxy that wgmma and TMA read through (a CTA barrier must follow).
using gpu::add_release;
using gpu::atomic_cas_acquire;
using gpu::bulk_commit;
using gpu::bulk_reduce_add;
using gpu::bulk_store;
using gpu::bulk_wait_done;
using gpu::bulk_wait_read;
using gpu::bulk_wait_read_but;
using gpu::fence_proxy_async_global;
using gpu::fence_proxy_async_smem;
using gpu::load_acquire;
using gpu::store_release;

// mbarrier (shared memory, CTA scope): a phase completes when `count` arrivals have happened.
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(gpu::smem_addr(bar)),
               "r"(count));
}
// Arrival with release semantics: this thread's earlier writes are visible to whoever completes
// a wait on the phase.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.release.cta.shared::cta.b64 st, [%0];\n}\n" ::"r"(
                   gpu::smem_addr(bar))
               : "memory");
}
// Waits until the phase of parity `parity` has completed (acquire).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(gpu::smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// Adds `bytes` to the transaction count the current phase waits for (the TMA copies that
// complete_tx on it); issue before the copies.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(gpu::smem_addr(bar)),
      "r"(bytes)
      : "memory");
}

// TMA: box (c0, c1, c2) of a 3-d tensor map (tensor_map.hpp: dim 0 the head dim, 1 the head,
// 2 the row) into shared memory, completing `bytes` of the barrier's transaction count.
__device__ __forceinline__ void tma_load_3d(void* smem, const CUtensorMap* map, int c0, int c1,
                                            int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(gpu::smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(gpu::smem_addr(bar))
      : "memory");
}

// Vector reductions into global memory (sm_90): one thread adds 4 consecutive elements of a
// 16-bit type, two packed pairs (the backward's dQ from registers, sm90_shapes.hpp's
// bwd_dq_from_registers). Nothing in the kernel reads what they add.
__device__ __forceinline__ void red_add(__nv_bfloat16* g, uint32_t ab, uint32_t cd) {
  asm volatile("red.global.add.noftz.v2.bf16x2 [%0], {%1, %2};\n" ::"l"(g), "r"(ab), "r"(cd));
}
__device__ __forceinline__ void red_add(__half* g, uint32_t ab, uint32_t cd) {
  asm volatile("red.global.add.noftz.v2.f16x2 [%0], {%1, %2};\n" ::"l"(g), "r"(ab), "r"(cd));
}

using gpu::named_barrier_arrive;  // named barriers: cuda/common/warp.cuh
using gpu::named_barrier_sync;

// Warpgroup register reallocation: producers give registers back, consumers take them.
template <int N>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Keeps the accumulator registers in place across the asynchronous wgmma (the compiler must not
// move or reuse them between issue and wait).
template <int NF>
__device__ __forceinline__ void pin(float (&d)[NF][4]) {
#pragma unroll
  for (int j = 0; j < NF; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

}  // namespace sm90
}  // namespace raggedattn

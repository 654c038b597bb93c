// Hopper building blocks: wgmma shared-memory descriptors, the wgmma fences, and the loader that
// writes a tile in the 128-byte-swizzled panel layout of config.hpp.
#pragma once

#include <cstdint>

#include "cuda/portable/warp_mma.cuh"
#include "cuda/sm90/config.hpp"

namespace raggedattn {
namespace sm90 {

// Byte offset of 16-byte chunk `chunk` (along the head dim) of row `row` in a tile of `rows`
// rows: panel chunk / 8, then the row, then the chunk permuted within the row's 128 bytes.
__device__ __forceinline__ uint32_t swizzled_offset(int rows, int row, int chunk) {
  return uint32_t((chunk >> 3) * rows * kSwizzleBytes + row * kSwizzleBytes +
                  (((chunk & 7) ^ (row & 7)) << 4));
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle (PTX ISA, "Matrix Descriptor Format"):
// bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension
// byte offset >> 4, 62-63 swizzle mode (1 = 128B). The stride between 8-row groups is 1024
// bytes in every tile here. K-major operands (the reduction dim contiguous) never cross a panel
// inside one instruction, so their leading offset is unused (1, as conventional); the N-major
// operand (V) is read 64 columns = one panel per instruction, so its leading offset (the panel
// stride) is unused too, and both offsets are given as the 8-row stride.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_byte_addr, uint32_t lead_bytes) {
  uint64_t d = 0;
  d |= uint64_t((smem_byte_addr & 0x3FFFF) >> 4);
  d |= uint64_t((lead_bytes >> 4) & 0x3FFF) << 16;
  d |= uint64_t((1024u >> 4) & 0x3FFF) << 32;
  d |= uint64_t(1) << 62;
  return d;
}
__device__ __forceinline__ uint64_t desc_k_major(uint32_t addr) {
  return desc_sw128(addr, 16);
}
__device__ __forceinline__ uint64_t desc_n_major(uint32_t addr) {
  return desc_sw128(addr, 1024);
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
// Makes this thread's generic-proxy shared-memory writes (cp.async included) visible to the
// async proxy that wgmma reads operands through; a CTA barrier must follow.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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

// Copies rows [0, ROWS) of a [tokens, heads, DIM] tile (head fixed) into the swizzled panel
// layout at `smem`; rows at or past `valid` are zero-filled. All THREADS threads take part.
template <int ROWS, int DIM, int THREADS, class T>
__device__ __forceinline__ void load_tile_sw128(unsigned char* smem, const T* gmem_row0,
                                                int64_t token_stride, int valid, int tid) {
  constexpr int kChunksPerRow = DIM / 8;
  constexpr int kChunks = ROWS * kChunksPerRow;
  static_assert(kChunks % THREADS == 0, "tile chunks per thread");
#pragma unroll
  for (int c = tid; c < kChunks; c += THREADS) {
    const int r = c / kChunksPerRow, chunk = c % kChunksPerRow;
    const bool ok = r < valid;
    const T* src = ok ? gmem_row0 + r * token_stride + chunk * 8 : gmem_row0;
    portable::cp_async_16(smem + swizzled_offset(ROWS, r, chunk), src, ok);
  }
}

}  // namespace sm90
}  // namespace raggedattn

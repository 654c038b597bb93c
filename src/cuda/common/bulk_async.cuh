// Bulk asynchronous copies of sm_90 (cp.async.bulk, plain sm_90: no sm_90a features) that the
// Hopper kernels and the portable backward's sm_90 build share: reduce-adds from shared memory into
// global memory, their groups, and the proxy fences that order them with ordinary accesses. Only
// device code compiled for sm_90 or newer may call them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/warp.cuh"

namespace raggedattn {
namespace gpu {

// Makes this thread's shared-memory writes visible to the async proxy (TMA, bulk copies, wgmma).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Orders this thread's async-proxy global accesses with its later generic-proxy ones.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Bulk reduce-add of `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared memory
// into global memory, element-wise atomic, in the bulk-async group of the issuing thread.
__device__ __forceinline__ void bulk_reduce_add(float* gmem, const void* smem, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
      "r"(smem_addr(smem)), "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void bulk_reduce_add(__nv_bfloat16* gmem, const void* smem,
                                                uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.bf16 [%0], [%1], %2;\n" ::"l"(
          gmem),
      "r"(smem_addr(smem)), "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void bulk_reduce_add(__half* gmem, const void* smem, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.noftz.f16 [%0], [%1], %2;\n" ::"l"(
          gmem),
      "r"(smem_addr(smem)), "r"(bytes)
      : "memory");
}
// Bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared memory into
// global memory, in the bulk-async group of the issuing thread.
__device__ __forceinline__ void bulk_store(void* gmem, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(smem_addr(smem)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until this thread's bulk groups have read their shared-memory sources (the buffer may be
// written again).
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// The same for all but the N most recent of them.
template <int N>
__device__ __forceinline__ void bulk_wait_read_but() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until this thread's bulk groups are complete (their global writes performed).
__device__ __forceinline__ void bulk_wait_done() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Compare-and-swap at GPU scope with acquire semantics, whether or not it swaps: what the thread
// that released `*p` wrote before its release is visible to this thread's later accesses. Cheaper
// than a relaxed atomicCAS followed by __threadfence, whose fence.sc first drains the thread's
// outstanding writes (its bulk reduce-adds included).
__device__ __forceinline__ int32_t atomic_cas_acquire(int32_t* p, int32_t expected,
                                                      int32_t desired) {
  int32_t old;
  asm volatile("atom.acquire.gpu.global.cas.b32 %0, [%1], %2, %3;\n"
               : "=r"(old)
               : "l"(p), "r"(expected), "r"(desired)
               : "memory");
  return old;
}
// A GPU-scope load with acquire semantics.
__device__ __forceinline__ int32_t load_acquire(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A GPU-scope store and addition with release semantics: this thread's earlier accesses are
// visible to whoever acquires the new value (without fence.sc's drain).
__device__ __forceinline__ void store_release(int32_t* p, int32_t v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void add_release(int32_t* p, int32_t v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

}  // namespace gpu
}  // namespace raggedattn

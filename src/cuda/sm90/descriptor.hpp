// wgmma shared-memory matrix descriptors (PTX ISA, "Matrix Descriptor Format"), 128-byte swizzle.
//
// Plain C++ (constexpr, host+device): the kernels make their descriptors with these functions and
// the CPU tests check the encoding and desc_advance's arithmetic over the whole shared memory.
//
// Bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension
// byte offset >> 4, 62-63 swizzle mode (1 = 128B). In the canonical 128B-swizzled layouts, in
// 16-byte units (CUTLASS's make_gmma_desc states them the same way):
//   K-major  ((8 rows, m), (8 chunks, k)) : ((8, SBO), (1, -))   one instruction's K (16
//            elements = 32 bytes) stays inside a row's 128 bytes; the leading offset is unused (1);
//   MN-major ((8 chunks, n), (8 rows, k)) : ((1, LBO), (8, SBO)) 64 contiguous elements of N per
//            row, the next 64 at LBO (our panel stride), the next 8 rows of K at SBO.
// Every tile here advances 8 rows in 1024 bytes.
#pragma once

#include <cstdint>

#include "core/defs.hpp"

namespace raggedattn {
namespace sm90 {

// A CTA's shared memory on sm_90 (228 KiB): every address a kernel hands to a descriptor is below
// it, so its start-address field (14 bits of address >> 4) never overflows.
constexpr uint32_t kSmemAddressLimit = 228u * 1024u;
static_assert((kSmemAddressLimit >> 4) <= (1u << 14), "a shared-memory address fits 14 bits");

RATTN_HD constexpr uint64_t desc_sw128(uint32_t smem_byte_addr, uint32_t lead_bytes) {
  return uint64_t((smem_byte_addr & 0x3FFFFu) >> 4) |
         (uint64_t((lead_bytes >> 4) & 0x3FFFu) << 16) | (uint64_t((1024u >> 4) & 0x3FFFu) << 32) |
         (uint64_t(1) << 62);
}
// The descriptor of the same tile `bytes` further on: only the start address field moves, and it
// cannot carry into bit 14 while the address stays below kSmemAddressLimit. One 32-bit add on the
// low word, where a descriptor made afresh costs a mask, a shift and an or per word (a kernel's
// loop makes one base per operand and adds each k-step's constant offset).
RATTN_HD constexpr uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return (uint64_t(uint32_t(desc >> 32)) << 32) | uint32_t(uint32_t(desc) + (bytes >> 4));
}
RATTN_HD constexpr uint64_t desc_k_major(uint32_t addr) {
  return desc_sw128(addr, 16);
}
// `panel_bytes`: the distance between the tile's 64-column panels (rows x 128 bytes).
RATTN_HD constexpr uint64_t desc_mn_major(uint32_t addr, uint32_t panel_bytes) {
  return desc_sw128(addr, panel_bytes);
}

}  // namespace sm90
}  // namespace raggedattn

// The Hopper kernels' wgmma descriptors (src/cuda/sm90/descriptor.hpp): the encoding against the
// PTX ISA's matrix descriptor format, and desc_advance, which the kernels use to step through a
// tile with one 32-bit add, against a descriptor made afresh at every address of shared memory.
#include "cuda/sm90/descriptor.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/sm90_shapes.hpp"

namespace raggedattn {
namespace {

TEST(Descriptor, FieldsAreWhereThePtxFormatPutsThem) {
  // 0x1230 >> 4 in bits 0-13; LBO 2048 >> 4 in bits 16-29; SBO 1024 >> 4 in bits 32-45; mode 1
  // (128-byte swizzle) in bits 62-63.
  const uint64_t d = sm90::desc_mn_major(0x1230, 2048);
  EXPECT_EQ(d & 0x3FFF, 0x123u);
  EXPECT_EQ((d >> 16) & 0x3FFF, 128u);
  EXPECT_EQ((d >> 32) & 0x3FFF, 64u);
  EXPECT_EQ(d >> 62, 1u);
  EXPECT_EQ(d & ((uint64_t(1) << 62) - 1) & ~((uint64_t(0x3FFF) << 32) | (0x3FFFu << 16) | 0x3FFFu),
            0u);  // nothing else set
  // K-major: the leading offset is unused and set to 1 (16 bytes).
  EXPECT_EQ((sm90::desc_k_major(0x1230) >> 16) & 0x3FFF, 1u);
}

TEST(Descriptor, AdvanceMatchesAFreshDescriptorEverywhereInSharedMemory) {
  // Every 16-byte-aligned start address and every offset the kernels add (k-steps of 32 bytes
  // inside a panel row, 2 KiB steps of 16 rows, panels of up to 256 rows of 128 bytes), while the
  // end stays inside shared memory.
  std::vector<uint32_t> offsets;
  for (uint32_t within = 0; within < 128; within += 32)
    for (uint32_t rows16 = 0; rows16 < 16; ++rows16)
      for (uint32_t panel = 0; panel < 4; ++panel)
        offsets.push_back(within + rows16 * 16 * sm90::kSwizzleBytes + panel * 256 * 128);
  int64_t checked = 0;
  for (uint32_t addr = 0; addr < sm90::kSmemAddressLimit; addr += 16) {
    const uint64_t k = sm90::desc_k_major(addr), mn = sm90::desc_mn_major(addr, 8192);
    for (const uint32_t off : offsets) {
      if (addr + off >= sm90::kSmemAddressLimit) continue;
      ASSERT_EQ(sm90::desc_advance(k, off), sm90::desc_k_major(addr + off)) << addr << "+" << off;
      ASSERT_EQ(sm90::desc_advance(mn, off), sm90::desc_mn_major(addr + off, 8192))
          << addr << "+" << off;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000000);
}

TEST(Descriptor, AdvancePastTheAddressFieldIsDetected) {
  // The limit is what makes the add safe: past 256 KiB the start address would carry into the
  // reserved bits, and a fresh descriptor (which masks the address) differs. This is why
  // kSmemAddressLimit is checked against the field's width.
  const uint32_t addr = (1u << 18) - 16;
  EXPECT_NE(sm90::desc_advance(sm90::desc_k_major(addr), 16), sm90::desc_k_major(addr + 16));
}

}  // namespace
}  // namespace raggedattn

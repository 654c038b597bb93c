// Helpers shared by the CPU tests.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "core/dq_accum_layout.hpp"
#include "raggedattn/raggedattn.hpp"
#include "verify/rng.hpp"

namespace raggedattn {

// Readable parameters in test names and failure messages (found by argument-dependent lookup).
inline void PrintTo(DqSlotScheme s, std::ostream* os) {
  *os << (s == DqSlotScheme::Compact       ? "Compact"
          : s == DqSlotScheme::PaddedBatch ? "PaddedBatch"
                                           : "PackedTokens");
}
inline void PrintTo(AccumType t, std::ostream* os) {
  *os << (t == AccumType::F32 ? "fp32" : t == AccumType::BF16 ? "bf16" : "fp16");
}

namespace testing_util {

// Asked of the library itself, not of a compile flag of the tests.
inline const bool kBuiltWithCuda = built_with_cuda();

// An H100/H200-like device, for plans made without a GPU.
inline DeviceCaps fake_hopper_caps() {
  DeviceCaps c = cpu_caps();
  c.cuda = 1;
  c.device = 0;
  c.cc_major = 9;
  c.cc_minor = 0;
  c.num_sms = 132;
  c.smem_per_block_optin = 232448;
  c.l2_bytes = 50 << 20;
  return c;
}

// Segment lengths of the kinds layouts get wrong: not multiples of 16, 0, 1, exact multiples,
// and (sometimes) one very long segment among short ones.
inline std::vector<int32_t> random_lengths(uint64_t seed) {
  verify::Rng r(seed);
  const int n = int(r.range(1, 40));
  std::vector<int32_t> lens;
  for (int i = 0; i < n; ++i) {
    const double u = r.uniform();
    if (u < 0.15)
      lens.push_back(0);
    else if (u < 0.3)
      lens.push_back(1);
    else if (u < 0.4)
      lens.push_back(int32_t(16 * r.range(1, 8)));
    else
      lens.push_back(int32_t(r.range(2, 300)));
  }
  if (r.chance(0.3)) lens[size_t(r.range(0, n - 1))] = int32_t(r.range(50000, 200000));
  return lens;
}

inline std::vector<int32_t> prefix_sums(const std::vector<int32_t>& lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); ++i) cu[i + 1] = cu[i] + lens[i];
  return cu;
}

}  // namespace testing_util
}  // namespace raggedattn

// Shared pieces of the GPU tests: the skip where there is no device, fresh seeds, and a failure
// message that carries the whole per-segment table.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>

#include "raggedattn/raggedattn.hpp"
#include "verify/report.hpp"
#include "verify/runner.hpp"

namespace raggedattn {
namespace gpu_test {

inline bool have_gpu() {
  return query_device(-1).cuda != 0;
}

// An sm_90 device and a build with the Hopper kernels.
inline bool have_sm90() {
  const DeviceCaps c = query_device(-1);
  return c.cuda != 0 && c.cc_major == 9 && c.cc_minor == 0 && path_in_build(Path::CudaSm90);
}

#define RATTN_REQUIRE_GPU()                                                    \
  do {                                                                         \
    if (!::raggedattn::gpu_test::have_gpu()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// A fresh seed per process (printed by the tests), overridable for reproduction.
inline uint64_t run_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("RATTN_TEST_SEED")) return uint64_t(std::stoull(s));
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ uint64_t(rd()) ^
           uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  }();
  return seed;
}

inline std::string table(const verify::CaseReport& r) {
  std::ostringstream os;
  verify::print_case(os, r);
  return os.str();
}

}  // namespace gpu_test
}  // namespace raggedattn

// Shared pieces of the GPU tests: the skip where there is no device, fresh seeds, and a failure
// message that carries the whole per-segment table.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "raggedattn/raggedattn.hpp"
#include "verify/case_spec.hpp"
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
#define RATTN_REQUIRE_SM90()                                                                \
  do {                                                                                      \
    if (!::raggedattn::gpu_test::have_sm90()) GTEST_SKIP() << "no sm_90 device or kernels"; \
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

// One parameter of a named-suite test: the case and its test-name label.
struct SuiteParam {
  verify::CaseSpec spec;
  std::string label;
};
struct Variant {
  const char* tag;
  rattn_dtype dtype;
  rattn_dq_accum accum;
  bool deterministic;
};

// The named suite (Hq = 32, Hkv = 8) on `backend`, each configuration `keep` accepts crossed with
// every variant; labels are "<config>__<variant tag>".
template <class Keep>
std::vector<SuiteParam> named_variants(rattn_backend backend, const std::vector<Variant>& variants,
                                       Keep keep) {
  std::vector<SuiteParam> out;
  for (const verify::CaseSpec& base : verify::named_suite(32, 8)) {
    if (!keep(base)) continue;
    for (const Variant& v : variants) {
      verify::CaseSpec s = base;
      s.backend = backend;
      s.dtype = v.dtype;
      s.dq_accum = v.accum;
      s.deterministic = v.deterministic;
      out.push_back({s, base.name + "__" + v.tag});
    }
  }
  return out;
}

// Runs one case on a fresh seed and expects every segment to pass on a plan whose description
// contains every one of `path_parts`; deterministic cases must also repeat bitwise.
// Runs `spec` with this run's seed and expects every segment to pass, the Plan's description to
// hold each of path_parts, and a deterministic run to repeat bitwise; returns the report for what
// a test checks beyond that.
inline verify::CaseReport expect_case_passes(const verify::CaseSpec& spec,
                                             const std::vector<std::string>& path_parts) {
  verify::RunOptions opt;
  opt.seed = run_seed();
  const verify::CaseReport r = verify::run_case(spec, opt);
  EXPECT_TRUE(r.pass) << "seed " << opt.seed << "\n" << table(r);
  EXPECT_EQ(r.status, RATTN_SUCCESS) << r.stage << ": " << r.error;
  for (const std::string& part : path_parts) {
    EXPECT_NE(r.path.find(part), std::string::npos) << "expected " << part << " in " << r.path;
  }
  if (spec.deterministic) {
    EXPECT_EQ(r.nondeterministic, 0);
  }
  return r;
}

}  // namespace gpu_test
}  // namespace raggedattn

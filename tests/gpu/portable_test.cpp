// The portable CUDA path against the CPU reference, per segment and per tensor: the named suite in
// both dQ accumulation modes, bf16 and fp16, deterministic mode, and 200+ random ragged problems
// drawn fresh every run (the seed is printed; RATTN_TEST_SEED reproduces a run).
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "verify/case_spec.hpp"

namespace raggedattn {
namespace {

using verify::CaseSpec;

using gpu_test::SuiteParam;

std::vector<SuiteParam> suite_params() {
  return gpu_test::named_variants(
      RATTN_BACKEND_CUDA_PORTABLE,
      {{"bf16_dq_fp32", RATTN_DTYPE_BF16, RATTN_DQ_ACCUM_FP32, false},
       {"bf16_dq_bf16", RATTN_DTYPE_BF16, RATTN_DQ_ACCUM_BF16, false},
       {"fp16_dq_fp32", RATTN_DTYPE_FP16, RATTN_DQ_ACCUM_FP32, false},
       {"bf16_deterministic", RATTN_DTYPE_BF16, RATTN_DQ_ACCUM_FP32, true}},
      [](const CaseSpec&) { return true; });
}

class NamedSuite : public ::testing::TestWithParam<SuiteParam> {};

TEST_P(NamedSuite, EverySegmentMatchesTheReference) {
  RATTN_REQUIRE_GPU();
  gpu_test::expect_case_passes(GetParam().spec, {"cuda_portable"});
}

INSTANTIATE_TEST_SUITE_P(Portable, NamedSuite, ::testing::ValuesIn(suite_params()),
                         [](const ::testing::TestParamInfo<SuiteParam>& suite) {
                           return suite.param.label;
                         });

// 240 random ragged problems over every supported shape, mask, window, softcap, GQA/MQA, padded
// THD and zero-length/length-1 segments, alternating dQ modes, dtypes and deterministic mode.
TEST(PortableRandom, FreshRaggedProblems) {
  RATTN_REQUIRE_GPU();
  const uint64_t base = gpu_test::run_seed();
  std::cout << "random cases from seed " << base << " (RATTN_TEST_SEED reproduces)\n";
  constexpr int kCases = 240;
  int failures = 0, rejected = 0;
  for (int i = 0; i < kCases; ++i) {
    verify::RandomLimits lim;
    // Eight query heads (groups 1, 2, 4, 8) or, in a third of the cases, six (groups 1, 2, 3, 6).
    lim.heads_q = (i % 3 == 1) ? 6 : 8;
    lim.max_segments = 8;
    lim.max_total = 700;
    lim.dtype = (i % 5 == 4) ? RATTN_DTYPE_FP16 : RATTN_DTYPE_BF16;
    lim.backend = RATTN_BACKEND_CUDA_PORTABLE;
    CaseSpec spec = verify::random_case(base + uint64_t(i), lim);
    spec.dq_accum = (i % 2) ? RATTN_DQ_ACCUM_BF16 : RATTN_DQ_ACCUM_FP32;
    spec.deterministic = (i % 7 == 3);
    verify::RunOptions opt;
    opt.seed = base + uint64_t(i);
    const verify::CaseReport r = verify::run_case(spec, opt);
    if (r.plan_error()) {
      ++rejected;  // a shape the library must reject is a test failure: random_case draws
      ADD_FAILURE() << "plan rejected a supported case: " << r.error;
      continue;
    }
    if (!r.pass) {
      ++failures;
      ADD_FAILURE() << "case " << i << " seed " << opt.seed << "\n" << gpu_test::table(r);
    }
  }
  std::cout << kCases << " random cases, " << failures << " failing, " << rejected << " rejected\n";
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace raggedattn

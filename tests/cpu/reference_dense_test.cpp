// The CPU reference backend against the dense float64 brute force: every named configuration,
// random ragged problems, and controls showing the comparison can fail.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "verify/verify.hpp"

namespace raggedattn {
namespace verify {
// Test names and failure messages show the case's name, not its bytes.
void PrintTo(const CaseSpec& c, std::ostream* os) {
  *os << c.name;
}
}  // namespace verify
namespace {

using verify::CaseReport;
using verify::CaseSpec;

// Reduced heads: the brute force is O(total^2) per head.
constexpr int32_t kHeadsQ = 4, kHeadsKv = 2;

std::string table(const CaseReport& r) {
  std::ostringstream os;
  verify::print_case(os, r);
  return os.str();
}

std::vector<CaseSpec> suite_with(rattn_dtype dtype) {
  std::vector<CaseSpec> s = verify::named_suite(kHeadsQ, kHeadsKv);
  for (CaseSpec& c : s) {
    c.dtype = dtype;
    c.backend = RATTN_BACKEND_CPU;
  }
  return s;
}

class NamedSuiteVsDense : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(NamedSuiteVsDense, EverySegmentPasses) {
  verify::RunOptions opt;
  opt.seed = 20261130;
  const CaseReport r = verify::run_case(GetParam(), opt);
  ASSERT_EQ(r.status, RATTN_SUCCESS) << r.error;
  EXPECT_EQ(r.mode, verify::CheckMode::Dense);
  EXPECT_EQ(r.segments.size(), GetParam().seqlens_q.size());
  EXPECT_TRUE(r.pass) << table(r);
}

std::string case_name(const ::testing::TestParamInfo<CaseSpec>& info) {
  return info.param.name + "_" + verify::dtype_str(info.param.dtype);
}

INSTANTIATE_TEST_SUITE_P(Fp32, NamedSuiteVsDense, ::testing::ValuesIn(suite_with(RATTN_DTYPE_FP32)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Bf16, NamedSuiteVsDense, ::testing::ValuesIn(suite_with(RATTN_DTYPE_BF16)),
                         case_name);

TEST(NamedSuite, CoversTheIssue) {
  const std::vector<CaseSpec> s = verify::named_suite(32, 8);
  auto find = [&](const std::string& n) -> const CaseSpec* {
    for (const CaseSpec& c : s) {
      if (c.name == n) return &c;
    }
    return nullptr;
  };
  for (const char* n :
       {"gqa_causal_256", "gqa_causal_100_80_76", "gqa_causal_128x2", "gqa_causal_64x4",
        "gqa_causal_200_56", "gqa_causal_103_77_61", "pack_2044", "mqa", "d192_dv128", "d64",
        "d256", "cross_bottom_right", "zero_length", "padded_thd", "gqa3_padded_d64",
        "sliding_window", "non_causal", "softcap", "many_docs", "padded_zeroed",
        "packed_tail_zeroed"}) {
    ASSERT_NE(find(n), nullptr) << n;
  }
  int total = 0;
  for (int32_t l : find("pack_2044")->seqlens_q) total += l;
  EXPECT_EQ(total, 2044);
  EXPECT_EQ(find("mqa")->hkv, 1);
  // Past one round of the post kernels' CTA-wide search (post::locate_cta, kPostThreads + 1).
  EXPECT_GT(find("many_docs")->seqlens_q.size(), 257u);
  EXPECT_EQ(find("gqa_causal_256")->hq, 32);
  EXPECT_EQ(find("gqa_causal_256")->hkv, 8);
  EXPECT_TRUE(find("padded_thd")->padded);
  EXPECT_FALSE(find("padded_thd")->zero_padding);
  // The bindings' mode on both kinds of padding: padded THD's gaps and a packed layout's tail.
  EXPECT_TRUE(find("padded_zeroed")->padded && find("padded_zeroed")->zero_padding);
  EXPECT_GT(find("padded_zeroed")->trailing_rows, 0);
  EXPECT_FALSE(find("packed_tail_zeroed")->padded);
  EXPECT_TRUE(find("packed_tail_zeroed")->zero_padding);
  EXPECT_GT(find("packed_tail_zeroed")->trailing_rows, 0);
  EXPECT_EQ(find("gqa3_padded_d64")->hq, 3 * find("gqa3_padded_d64")->hkv);
  EXPECT_TRUE(find("gqa3_padded_d64")->padded);
  EXPECT_EQ(find("cross_bottom_right")->alignment, RATTN_ALIGN_BOTTOM_RIGHT);
  EXPECT_NE(find("cross_bottom_right")->seqlens_kv, find("cross_bottom_right")->seqlens_q);
  bool one = false, zero = false, odd = false;
  for (const CaseSpec& c : s) {
    for (int32_t l : c.seqlens_q) {
      one |= l == 1;
      zero |= l == 0;
      odd |= l % 16 != 0;
    }
  }
  EXPECT_TRUE(one && zero && odd);
}

// The reference splits a segment's rows (and, for dK and dV, its keys) into chunks of 256 per
// work item: segments of several chunks and of none, under a sliding window on both sides (the
// key rows' query range is not the causal one) with a soft cap, GQA, and keys that are not the
// queries, against the brute force.
TEST(ReferenceChunks, LongSegmentsMatchDense) {
  CaseSpec c = verify::named_suite(kHeadsQ, kHeadsKv).front();
  c.name = "chunks";
  c.backend = RATTN_BACKEND_CPU;
  c.dtype = RATTN_DTYPE_FP32;
  c.seqlens_q = {1500, 3, 700, 0, 257};
  c.seqlens_kv = {1300, 9, 700, 40, 513};
  c.mask = RATTN_MASK_NONE;
  c.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
  c.window_left = 300;
  c.window_right = 40;
  c.softcap = 3.f;
  verify::RunOptions opt;
  opt.seed = 20261203;
  const CaseReport r = verify::run_case(c, opt);
  ASSERT_EQ(r.status, RATTN_SUCCESS) << r.error;
  EXPECT_EQ(r.mode, verify::CheckMode::Dense);
  EXPECT_TRUE(r.pass) << table(r);
}

TEST(RandomCases, ReferenceMatchesDense) {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    verify::RandomLimits lim;
    lim.heads_q = 4;
    lim.max_total = 200;
    lim.dtype = seed % 3 == 0   ? RATTN_DTYPE_FP32
                : seed % 3 == 1 ? RATTN_DTYPE_BF16
                                : RATTN_DTYPE_FP16;
    lim.backend = RATTN_BACKEND_CPU;
    const CaseSpec c = verify::random_case(seed, lim);
    verify::RunOptions opt;
    opt.seed = seed;
    const CaseReport r = verify::run_case(c, opt);
    ASSERT_EQ(r.status, RATTN_SUCCESS) << c.name << ": " << r.error;
    EXPECT_TRUE(r.pass) << table(r);
  }
}

TEST(RandomCases, DrawEveryFeature) {
  bool causal = false, window = false, softcap = false, padded = false, cross = false, mqa = false,
       d192_128 = false, zero = false, one = false;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const CaseSpec c = verify::random_case(seed, {});
    causal |= c.mask == RATTN_MASK_CAUSAL;
    window |= c.window_left >= 0;
    softcap |= c.softcap > 0;
    padded |= c.padded;
    cross |= !c.seqlens_kv.empty();
    mqa |= c.hkv == 1;
    d192_128 |= c.dqk == 192 && c.dv == 128;
    for (int32_t l : c.seqlens_q) {
      zero |= l == 0;
      one |= l == 1;
    }
    EXPECT_EQ(c.hq % c.hkv, 0);
    EXPECT_TRUE(c.mask != RATTN_MASK_CAUSAL || c.window_right <= 0) << c.name;
    // Same seed, same case.
    const CaseSpec again = verify::random_case(seed, {});
    EXPECT_EQ(again.seqlens_q, c.seqlens_q);
    EXPECT_EQ(again.seqlens_kv, c.seqlens_kv);
  }
  EXPECT_TRUE(causal && window && softcap && padded && cross && mqa && d192_128 && zero && one);
}

// A path that takes only some head dims gets random cases at those only (`check --random` on
// cuda_sm90), and the filter changes nothing else a seed draws.
TEST(RandomCases, DrawOnlyTheHeadDimsTheLimitsTake) {
  verify::RandomLimits hopper;
  hopper.takes_dims = [](int dqk, int dv) { return dqk == 128 && dv == 128; };
  bool other_dims_unfiltered = false;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    const CaseSpec c = verify::random_case(seed, hopper);
    EXPECT_EQ(c.dqk, 128) << c.name;
    EXPECT_EQ(c.dv, 128) << c.name;
    const CaseSpec free = verify::random_case(seed, {});
    other_dims_unfiltered |= free.dqk != 128;
    EXPECT_EQ(c.seqlens_q, free.seqlens_q) << c.name;  // one draw either way: the rest alike
    EXPECT_EQ(c.seqlens_kv, free.seqlens_kv) << c.name;
    EXPECT_EQ(c.mask, free.mask) << c.name;
  }
  EXPECT_TRUE(other_dims_unfiltered);
  verify::RandomLimits none;
  none.takes_dims = [](int, int) { return false; };
  EXPECT_THROW(verify::random_case(1, none), std::invalid_argument);
}

// Controls: the brute force and the checker together must notice a wrong mask alignment, per
// segment. Reference outputs of a top-left causal problem, judged against the brute force of the
// bottom-right one: segments with len_q != len_kv differ, the square one does not.
TEST(DenseControls, WrongAlignmentFailsExactlyTheNonSquareSegments) {
  CaseSpec tl;
  tl.name = "alignment_control";
  tl.seqlens_q = {20, 30, 25};
  tl.seqlens_kv = {35, 30, 10};
  tl.hq = 2;
  tl.hkv = 1;
  tl.dqk = tl.dv = 64;
  tl.dtype = RATTN_DTYPE_FP32;
  tl.mask = RATTN_MASK_CAUSAL;
  tl.backend = RATTN_BACKEND_CPU;
  CaseSpec br = tl;
  br.alignment = RATTN_ALIGN_BOTTOM_RIGHT;

  const verify::PackLayout l = verify::make_layout(tl, 3);
  const verify::HostInputs in = verify::make_inputs(tl, l, 3);
  verify::HostOutputs out = verify::make_outputs(tl, l, RATTN_DTYPE_FP32);
  Plan plan;
  ASSERT_TRUE(make_plan(verify::make_problem(tl, l), cpu_caps(), &plan).ok());
  FwdTensors f{};
  f.q = in.q.data();
  f.k = in.k.data();
  f.v = in.v.data();
  f.o = out.o.data();
  f.lse = static_cast<float*>(out.lse.data());
  f.cu_seqlens_q = l.cu_q.data();
  f.cu_seqlens_kv = l.cu_kv.data();
  ASSERT_TRUE(forward(plan, f, nullptr, 0).ok());

  const verify::DenseProblem dp = verify::dense_problem(br, l);
  const verify::DenseForward d = verify::dense_forward(dp, verify::to_dense(in.q.view(), l.total_q),
                                                       verify::to_dense(in.k.view(), l.total_kv),
                                                       verify::to_dense(in.v.view(), l.total_kv));
  const auto m = verify::check_tensor(verify::Tensor::O, l.segments, out.o.view(), d.o.view(),
                                      nullptr, verify::dense_tolerances(RATTN_DTYPE_FP32)[0]);
  EXPECT_FALSE(m[0].pass);
  EXPECT_TRUE(m[1].pass) << "len_q == len_kv: both alignments are the same mask";
  EXPECT_FALSE(m[2].pass);
}

TEST(DenseBruteForce, HandComputedValues) {
  // One query, two keys with q.k = 0 and q.k = sqrt(d) * ln 3: P = (1/4, 3/4).
  CaseSpec c;
  c.name = "hand";
  c.seqlens_q = {1};
  c.seqlens_kv = {2};
  c.hq = c.hkv = 1;
  c.dqk = c.dv = 64;
  const verify::PackLayout l = verify::make_layout(c, 1);
  const verify::DenseProblem p = verify::dense_problem(c, l);
  verify::DenseTensor q(1, 1, 64), k(2, 1, 64), v(2, 1, 64);
  q.row(0, 0)[0] = 1.0;
  k.row(1, 0)[0] = 8.0 * std::log(3.0);  // scale = 1/8
  for (int d = 0; d < 64; ++d) {
    v.row(0, 0)[d] = 1.0;
    v.row(1, 0)[d] = 5.0;
  }
  const verify::DenseForward f = verify::dense_forward(p, q, k, v);
  EXPECT_NEAR(f.o.row(0, 0)[7], 0.25 * 1.0 + 0.75 * 5.0, 1e-12);
  EXPECT_NEAR(f.lse.row(0, 0)[0], std::log(4.0), 1e-12);
  // dO = e_0: dV_j = P_j e_0; dP_j = v_j[0]; delta = O[0] = 4; dS = P (dP - 4) = (-3/4, 3/4);
  // dQ = scale * sum_j dS_j k_j = (1/8) * (3/4) * 8 ln 3 on column 0.
  verify::DenseTensor d_o(1, 1, 64);
  d_o.row(0, 0)[0] = 1.0;
  const verify::DenseBackward g = verify::dense_backward(p, q, k, v, f.o, d_o);
  EXPECT_NEAR(g.dv.row(0, 0)[0], 0.25, 1e-12);
  EXPECT_NEAR(g.dv.row(1, 0)[0], 0.75, 1e-12);
  EXPECT_NEAR(g.dq.row(0, 0)[0], 0.75 * std::log(3.0), 1e-12);
  EXPECT_NEAR(g.dk.row(0, 0)[0], -0.75 / 8.0, 1e-12);
  EXPECT_NEAR(g.dk.row(1, 0)[0], 0.75 / 8.0, 1e-12);
}

TEST(DenseBruteForce, RowsWithoutKeysGiveZeroAndMinusInfinity) {
  CaseSpec c;
  c.name = "empty_rows";
  c.seqlens_q = {5, 3};
  c.seqlens_kv = {2, 0};
  c.hq = c.hkv = 1;
  c.dqk = c.dv = 64;
  c.mask = RATTN_MASK_CAUSAL;
  c.alignment = RATTN_ALIGN_BOTTOM_RIGHT;  // rows 0..2 of segment 0 see no key
  const verify::PackLayout l = verify::make_layout(c, 1);
  const verify::HostInputs in = verify::make_inputs(c, l, 1);
  const verify::DenseForward f = verify::dense_forward(
      verify::dense_problem(c, l), verify::to_dense(in.q.view(), l.total_q),
      verify::to_dense(in.k.view(), l.total_kv), verify::to_dense(in.v.view(), l.total_kv));
  for (int r : {0, 1, 2, 5, 6, 7}) {
    EXPECT_TRUE(std::isinf(f.lse.row(r, 0)[0]) && f.lse.row(r, 0)[0] < 0) << "row " << r;
    EXPECT_EQ(f.o.row(r, 0)[0], 0.0);
  }
  EXPECT_TRUE(std::isfinite(f.lse.row(3, 0)[0]));
  EXPECT_TRUE(std::isfinite(f.lse.row(4, 0)[0]));
}

}  // namespace
}  // namespace raggedattn

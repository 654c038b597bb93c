// The CPU reference backend against the dense float64 brute force: every named configuration,
// random ragged problems, and controls showing the comparison can fail.
#include <gtest/gtest.h>

#include <algorithm>
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
  for (const char* n : {"gqa_causal_256",
                        "gqa_causal_100_80_76",
                        "gqa_causal_128x2",
                        "gqa_causal_64x4",
                        "gqa_causal_200_56",
                        "gqa_causal_103_77_61",
                        "pack_2044",
                        "mqa",
                        "d192_dv128",
                        "d64",
                        "d256",
                        "cross_bottom_right",
                        "zero_length",
                        "padded_thd",
                        "gqa3_padded_d64",
                        "sliding_window",
                        "non_causal",
                        "softcap",
                        "many_docs",
                        "padded_zeroed",
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

// The sink and LSE-cotangent cases: each has what its name promises.
TEST(NamedSuite, HasTheSinkCases) {
  const std::vector<CaseSpec> s = verify::named_suite(8, 2);
  auto find = [&](const std::string& n) -> CaseSpec {
    for (const CaseSpec& c : s) {
      if (c.name == n) return c;
    }
    ADD_FAILURE() << "no case " << n;
    return CaseSpec{};
  };
  auto has_len = [](const std::vector<int32_t>& lens, auto pred) {
    return std::any_of(lens.begin(), lens.end(), pred);
  };
  const CaseSpec gqa = find("sink_causal_gqa");
  EXPECT_TRUE(gqa.sink && !gqa.lse_grad && gqa.mask == RATTN_MASK_CAUSAL && gqa.hkv > 1 &&
              gqa.hq > gqa.hkv);
  EXPECT_TRUE(has_len(gqa.seqlens_q, [](int32_t l) { return l == 1; }));
  EXPECT_TRUE(has_len(gqa.seqlens_q, [](int32_t l) { return l % 16 != 0 && l > 1; }));
  const CaseSpec window = find("sink_window");
  EXPECT_TRUE(window.sink && window.window_left >= 0 && window.window_right > 0);
  EXPECT_NE(window.kv_lens(), window.seqlens_q);
  const CaseSpec zero = find("sink_zero_len");
  EXPECT_TRUE(zero.sink && zero.hkv == 1 && zero.mask == RATTN_MASK_CAUSAL &&
              zero.alignment == RATTN_ALIGN_BOTTOM_RIGHT);
  bool keyless = false, empty = false;
  for (size_t b = 0; b < zero.seqlens_q.size(); ++b) {
    keyless |= zero.seqlens_q[b] > zero.kv_lens()[b];  // bottom-right: its first rows see nothing
    empty |= zero.seqlens_q[b] == 0;
  }
  EXPECT_TRUE(keyless && empty);
  const CaseSpec lse = find("lse_grad");
  EXPECT_TRUE(lse.lse_grad && !lse.sink);
  const CaseSpec both = find("sink_lse_grad");
  EXPECT_TRUE(both.sink && both.lse_grad && both.softcap > 0 && both.padded && both.nan_padding);
  // The other cases stay as they were.
  for (const CaseSpec& c : s) {
    if (c.name.rfind("sink", 0) != 0 && c.name != "lse_grad") {
      EXPECT_FALSE(c.sink || c.lse_grad) << c.name;
    }
  }
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
  int sink = 0, lse_grad = 0, both = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const CaseSpec c = verify::random_case(seed, {});
    sink += c.sink;
    lse_grad += c.lse_grad;
    both += c.sink && c.lse_grad;
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
    EXPECT_EQ(again.sink, c.sink);
    EXPECT_EQ(again.lse_grad, c.lse_grad);
  }
  EXPECT_TRUE(causal && window && softcap && padded && cross && mqa && d192_128 && zero && one);
  // About one case in three each, drawn independently (about one in nine both).
  EXPECT_GT(sink, 60);
  EXPECT_LT(sink, 140);
  EXPECT_GT(lse_grad, 60);
  EXPECT_LT(lse_grad, 140);
  EXPECT_GT(both, 10);
  EXPECT_LT(both, 60);
}

// Seeds name cases in scripts and bug reports: the draws of sinks and d_lse (a stream of their
// own) left every other field of these seeds as it was before them.
TEST(RandomCases, SeedsDrawTheCasesTheyDrewBeforeSinks) {
  struct Drawn {
    uint64_t seed;
    const char* segments;
    const char* mask;
    int32_t hkv, dqk, dv;
    bool padded, zero_padding;
  };
  const Drawn before[] = {
      // Drawn by the build before sinks existed (segments_str, mask_str, fields).
      {1, "[18,56,34]", "causal top-left, window (39, 0)", 2, 64, 64, false, false},
      {3, "q[23,4,41,48] kv[46,10,44,26]", "no mask", 2, 192, 192, true, false},
      {25, "[33,38,33,15,183]", "causal bottom-right, window (45, 0), softcap 10", 1, 96, 96, false,
       true},
      {42, "[2,0,10,0,2]", "no mask", 1, 256, 256, false, false},
  };
  for (const Drawn& d : before) {
    CaseSpec c = verify::random_case(d.seed, {});
    c.sink = c.lse_grad = false;  // mask_str names them
    EXPECT_EQ(verify::segments_str(c), d.segments) << c.name;
    EXPECT_EQ(verify::mask_str(c), d.mask) << c.name;
    EXPECT_EQ(c.hkv, d.hkv) << c.name;
    EXPECT_EQ(c.dqk, d.dqk) << c.name;
    EXPECT_EQ(c.dv, d.dv) << c.name;
    EXPECT_EQ(c.padded, d.padded) << c.name;
    EXPECT_EQ(c.zero_padding, d.zero_padding) << c.name;
  }
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
  // The terms in absolute value: |dS_j| as P_j (|dP_j| + |delta|) = (1/4 * 5, 3/4 * 9); dQ's sum
  // is 9x dQ itself (its terms cancel), which is what widens the cpu path's bound on it.
  EXPECT_NEAR(g.dq_magnitude.row(0, 0)[0], 0.75 * 9.0 * std::log(3.0), 1e-12);
  EXPECT_NEAR(g.dk_magnitude.row(0, 0)[0], 0.25 * 5.0 / 8.0, 1e-12);
  EXPECT_NEAR(g.dk_magnitude.row(1, 0)[0], 0.75 * 9.0 / 8.0, 1e-12);
}

TEST(DenseBruteForce, HandComputedValuesWithASinkAndAnLseCotangent) {
  // Segment 0: one query, two keys with exp(score) = 1 and 3, and a sink of logit ln 4: the row's
  // weights are (1, 3, 4) / 8. Segment 1: one query and no key.
  CaseSpec c;
  c.name = "hand_sink";
  c.seqlens_q = {1, 1};
  c.seqlens_kv = {2, 0};
  c.hq = c.hkv = 1;
  c.dqk = c.dv = 64;
  const verify::PackLayout l = verify::make_layout(c, 1);
  verify::DenseProblem p = verify::dense_problem(c, l);
  p.sink = {std::log(4.0)};
  verify::DenseTensor q(2, 1, 64), k(2, 1, 64), v(2, 1, 64);
  q.row(0, 0)[0] = q.row(1, 0)[0] = 1.0;
  k.row(1, 0)[0] = 8.0 * std::log(3.0);  // scale = 1/8
  for (int d = 0; d < 64; ++d) {
    v.row(0, 0)[d] = 1.0;
    v.row(1, 0)[d] = 5.0;
  }
  const verify::DenseForward f = verify::dense_forward(p, q, k, v);
  EXPECT_NEAR(f.o.row(0, 0)[7], (1.0 * 1.0 + 3.0 * 5.0) / 8.0, 1e-12);
  EXPECT_NEAR(f.lse.row(0, 0)[0], std::log(8.0), 1e-12);
  EXPECT_EQ(f.o.row(1, 0)[7], 0.0);
  EXPECT_NEAR(f.lse.row(1, 0)[0], std::log(4.0), 1e-15);  // the sink's logit
  // dO = e_0, d_lse = (1/2, 1/4). Row 0: delta = O[0] - 1/2 = 3/2; dP = (1, 5);
  // dS = P (dP - delta) = (-1/16, 21/16); the sink's share -P_sink delta = -3/4. Row 1: its LSE is
  // the sink's, whose derivative is 1: + 1/4.
  verify::DenseTensor d_o(2, 1, 64), d_lse(2, 1, 1);
  d_o.row(0, 0)[0] = d_o.row(1, 0)[0] = 1.0;
  d_lse.row(0, 0)[0] = 0.5;
  d_lse.row(1, 0)[0] = 0.25;
  const verify::DenseBackward g = verify::dense_backward(p, q, k, v, f.o, d_o, &d_lse);
  ASSERT_EQ(g.d_sink.size(), 1u);
  EXPECT_NEAR(g.d_sink[0], -0.75 + 0.25, 1e-12);
  EXPECT_NEAR(g.dv.row(0, 0)[0], 1.0 / 8.0, 1e-12);
  EXPECT_NEAR(g.dv.row(1, 0)[0], 3.0 / 8.0, 1e-12);
  EXPECT_NEAR(g.dq.row(0, 0)[0], 21.0 / 16.0 * std::log(3.0), 1e-12);
  EXPECT_NEAR(g.dk.row(0, 0)[0], -1.0 / 16.0 / 8.0, 1e-12);
  EXPECT_NEAR(g.dk.row(1, 0)[0], 21.0 / 16.0 / 8.0, 1e-12);
  EXPECT_EQ(g.dq.row(1, 0)[0], 0.0);
}

// Controls: the reference's outputs with sinks and d_lse, judged against a brute force that
// leaves either out, fail where they should: a backend that ignored the sinks or the cotangent
// would not pass.
TEST(DenseControls, SinksAndTheLseCotangentAreSeen) {
  CaseSpec c;
  c.name = "sink_control";
  c.seqlens_q = {20, 30};
  c.seqlens_kv = {25, 30};
  c.hq = 2;
  c.hkv = 1;
  c.dqk = c.dv = 64;
  c.dtype = RATTN_DTYPE_FP32;
  c.mask = RATTN_MASK_CAUSAL;
  c.backend = RATTN_BACKEND_CPU;
  c.sink = c.lse_grad = true;
  const verify::PackLayout l = verify::make_layout(c, 5);
  const verify::HostInputs in = verify::make_inputs(c, l, 5);
  verify::HostOutputs out = verify::make_outputs(c, l, RATTN_DTYPE_FP32);
  Plan plan;
  ASSERT_TRUE(make_plan(verify::make_problem(c, l), cpu_caps(), &plan).ok());
  FwdTensors f{};
  f.q = in.q.data();
  f.k = in.k.data();
  f.v = in.v.data();
  f.o = out.o.data();
  f.lse = static_cast<float*>(out.lse.data());
  f.cu_seqlens_q = l.cu_q.data();
  f.cu_seqlens_kv = l.cu_kv.data();
  f.sink = static_cast<const float*>(in.sink.data());
  ASSERT_TRUE(forward(plan, f, nullptr, 0).ok());
  BwdTensors b{};
  b.q = f.q;
  b.k = f.k;
  b.v = f.v;
  b.o = f.o;
  b.d_o = in.d_o.data();
  b.lse = f.lse;
  b.dq = out.dq.data();
  b.dk = out.dk.data();
  b.dv = out.dv.data();
  b.cu_seqlens_q = f.cu_seqlens_q;
  b.cu_seqlens_kv = f.cu_seqlens_kv;
  b.sink = f.sink;
  b.d_sink = static_cast<float*>(out.d_sink.data());
  b.d_lse = static_cast<const float*>(in.d_lse.data());
  ASSERT_TRUE(backward(plan, b, nullptr, 0).ok());

  verify::DenseProblem with = verify::dense_problem(c, l), without = with;
  for (int32_t h = 0; h < c.hq; ++h) with.sink.push_back(in.sink.view().at(h, 0, 0));
  const verify::DenseTensor q = verify::to_dense(in.q.view(), l.total_q);
  const verify::DenseTensor k = verify::to_dense(in.k.view(), l.total_kv);
  const verify::DenseTensor v = verify::to_dense(in.v.view(), l.total_kv);
  const verify::DenseTensor d_o = verify::to_dense(in.d_o.view(), l.total_q);
  const verify::DenseTensor d_lse = verify::to_dense(in.d_lse.view(), l.total_q);
  const verify::DenseTensor o = verify::to_dense(out.o.view(), l.total_q);
  const verify::Tolerances tol = verify::dense_tolerances(RATTN_DTYPE_FP32);
  auto passes = [&](verify::Tensor t, const verify::DenseTensor& ref) {
    const auto m = verify::check_tensor(t, l.segments, verify::views(out)[size_t(t)], ref.view(),
                                        nullptr, tol[size_t(t)]);
    return std::all_of(m.begin(), m.end(), [](const verify::Metrics& x) { return x.pass; });
  };
  const verify::DenseForward fw = verify::dense_forward(with, q, k, v);
  const verify::DenseForward fw_no_sink = verify::dense_forward(without, q, k, v);
  EXPECT_TRUE(passes(verify::Tensor::O, fw.o) && passes(verify::Tensor::Lse, fw.lse));
  EXPECT_FALSE(passes(verify::Tensor::O, fw_no_sink.o));
  EXPECT_FALSE(passes(verify::Tensor::Lse, fw_no_sink.lse));

  const verify::DenseBackward g = verify::dense_backward(with, q, k, v, o, d_o, &d_lse);
  const verify::DenseBackward g_no_lse = verify::dense_backward(with, q, k, v, o, d_o);
  EXPECT_TRUE(passes(verify::Tensor::Dq, g.dq) && passes(verify::Tensor::Dk, g.dk) &&
              passes(verify::Tensor::Dv, g.dv));
  EXPECT_FALSE(passes(verify::Tensor::Dq, g_no_lse.dq));
  EXPECT_FALSE(passes(verify::Tensor::Dk, g_no_lse.dk));
  for (int32_t h = 0; h < c.hq; ++h) {
    const double x = out.d_sink.view().at(h, 0, 0);
    EXPECT_NEAR(x, g.d_sink[size_t(h)], 1e-5 * std::fabs(g.d_sink[size_t(h)]) + 1e-6) << h;
    EXPECT_GT(std::fabs(x - g_no_lse.d_sink[size_t(h)]), 1e-2) << h;
  }
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

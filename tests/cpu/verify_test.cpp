// The verification library's own pieces: the pass rule, non-finite and -inf handling, poison and
// padding detection, layouts with padding, the mask rules, FLOP counts.
#include "verify/verify.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/mask.hpp"
#include "verify/gpu_sensors.hpp"
#include "verify/mask_rules.hpp"
#include "verify/rng.hpp"
#include "verify/watchdog.hpp"

namespace raggedattn {
namespace {

using verify::Metrics;
using verify::Tolerance;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> noisy(const std::vector<double>& ref, double rel, uint64_t seed) {
  // ref + e with ||e|| = rel * ||ref||.
  verify::Rng r(seed);
  std::vector<double> e(ref.size());
  double ne = 0, nr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    e[i] = r.normal();
    ne += e[i] * e[i];
    nr += ref[i] * ref[i];
  }
  std::vector<double> x(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) x[i] = ref[i] + e[i] * rel * std::sqrt(nr / ne);
  return x;
}

std::vector<double> randn(size_t n, uint64_t seed) {
  verify::Rng r(seed);
  std::vector<double> v(n);
  for (double& x : v) x = r.normal();
  return v;
}

TEST(Compare, IdenticalPasses) {
  const std::vector<double> ref = randn(500, 1);
  const Metrics m = verify::compare(ref.data(), ref.data(), nullptr, 500, {});
  EXPECT_TRUE(m.pass);
  EXPECT_DOUBLE_EQ(m.cos, 1.0);
  EXPECT_EQ(m.rel, 0.0);
  EXPECT_EQ(m.max_abs, 0.0);
  EXPECT_EQ(m.elements, 500);
}

TEST(Compare, BoundIsTwiceTheLowPrecisionErrorPlusTheFloor) {
  const std::vector<double> ref = randn(4000, 2);
  const std::vector<double> lowp = noisy(ref, 3e-3, 3);
  // bound = 2 * 3e-3 + 1e-3 = 7e-3.
  const std::vector<double> good = noisy(ref, 6.5e-3, 4);
  const std::vector<double> bad = noisy(ref, 7.5e-3, 5);
  const Metrics g = verify::compare(good.data(), ref.data(), lowp.data(), 4000, {});
  const Metrics b = verify::compare(bad.data(), ref.data(), lowp.data(), 4000, {});
  EXPECT_NEAR(g.rel_lowp, 3e-3, 1e-12);
  EXPECT_NEAR(g.bound, 7e-3, 1e-12);
  EXPECT_TRUE(g.pass) << g.rel;
  EXPECT_FALSE(b.pass) << b.rel;
  // Without a low-precision result, only the floor remains.
  EXPECT_FALSE(verify::compare(good.data(), ref.data(), nullptr, 4000, {}).pass);
}

TEST(Compare, CosineBelowThresholdFails) {
  // A generous relative bound cannot rescue a cosine under 0.9999.
  const std::vector<double> ref = randn(1000, 6);
  const std::vector<double> x = noisy(ref, 0.02, 7);  // cos ~ 0.9998
  const Metrics m = verify::compare(x.data(), ref.data(), nullptr, 1000, Tolerance{0.9999, 0, 1.0});
  EXPECT_LT(m.cos, 0.9999);
  EXPECT_FALSE(m.pass);
}

TEST(Compare, IllConditionedSegmentsAreHeldToThePlainImplementationsCosine) {
  // A plain low-precision result with cos ~ 0.9992 (rel 4e-2): the cosine bar becomes
  // 1 - cos <= 4 (1 - cos_lowp), twice the plain error in rel terms, like the rel bound.
  const std::vector<double> ref = randn(2000, 8);
  const std::vector<double> lowp = noisy(ref, 0.04, 9);
  const std::vector<double> near = noisy(ref, 0.06, 10);  // 1.5x the plain error: passes
  const std::vector<double> far = noisy(ref, 0.12, 11);   // 3x: fails both bars
  const Metrics a = verify::compare(near.data(), ref.data(), lowp.data(), 2000, {});
  const Metrics b = verify::compare(far.data(), ref.data(), lowp.data(), 2000, {});
  EXPECT_LT(a.cos_lowp, 0.9999);
  EXPECT_LT(a.cos, 0.9999);
  EXPECT_TRUE(a.pass) << a.cos << " vs plain " << a.cos_lowp;
  EXPECT_FALSE(b.pass) << b.cos << " vs plain " << b.cos_lowp;
  // Where the plain implementation reaches 0.9999, the bar is 0.9999 whatever the rel bound.
  const std::vector<double> good_lowp = noisy(ref, 1e-3, 12);
  const std::vector<double> x = noisy(ref, 0.02, 13);
  const Metrics c = verify::compare(x.data(), ref.data(), good_lowp.data(), 2000,
                                    Tolerance{0.9999, 2.0, 1.0, verify::kZeroRefAbsFloor});
  EXPECT_GE(c.cos_lowp, 0.9999);
  EXPECT_FALSE(c.pass) << c.cos;
  // The bar is continuous in the plain cosine: a plain result just above 0.9999 (1 - cos ~ 6e-5)
  // allows 4x its 1 - cos, as one just below it does.
  const std::vector<double> edge_lowp = noisy(ref, 0.011, 14);
  const std::vector<double> y = noisy(ref, 0.0145, 15);
  const Metrics d = verify::compare(y.data(), ref.data(), edge_lowp.data(), 2000, {});
  EXPECT_GE(d.cos_lowp, 0.9999);
  EXPECT_LT(d.cos, 0.9999);
  EXPECT_TRUE(d.pass) << d.cos << " vs plain " << d.cos_lowp;
}

TEST(Compare, NonFiniteOutputFails) {
  std::vector<double> ref = randn(100, 8), x = ref;
  x[17] = kNaN;
  Metrics m = verify::compare(x.data(), ref.data(), nullptr, 100, {});
  EXPECT_FALSE(m.pass);
  EXPECT_EQ(m.nonfinite, 1);
  x[17] = kInf;
  m = verify::compare(x.data(), ref.data(), nullptr, 100, {});
  EXPECT_FALSE(m.pass);
  EXPECT_EQ(m.nonfinite, 1);
}

TEST(Compare, MinusInfinityRowsMustMatch) {
  std::vector<double> ref = randn(10, 9), x = ref;
  ref[3] = x[3] = -kInf;
  Metrics m = verify::compare(x.data(), ref.data(), nullptr, 10, {});
  EXPECT_TRUE(m.pass);
  EXPECT_EQ(m.elements, 9);
  x[3] = 0.5;  // a finite LSE where the row sees no key
  m = verify::compare(x.data(), ref.data(), nullptr, 10, {});
  EXPECT_FALSE(m.pass);
  EXPECT_EQ(m.inf_mismatch, 1);
  x[3] = -kInf;
  x[4] = -kInf;  // -inf where the reference is finite
  m = verify::compare(x.data(), ref.data(), nullptr, 10, {});
  EXPECT_FALSE(m.pass);
  EXPECT_EQ(m.inf_mismatch, 1);
}

TEST(Compare, AllZeroReferenceBoundsMaxAbs) {
  const std::vector<double> zero(64, 0.0);
  std::vector<double> x(64, 0.0);
  Metrics m = verify::compare(x.data(), zero.data(), nullptr, 64, {});
  EXPECT_TRUE(m.zero_ref);
  EXPECT_TRUE(m.pass);
  x[5] = 2e-6;  // fp32 cancellation noise (a length-1 segment's dQ)
  EXPECT_TRUE(verify::compare(x.data(), zero.data(), nullptr, 64, {}).pass);
  Tolerance exact;
  exact.zero_abs = 0;
  EXPECT_FALSE(verify::compare(x.data(), zero.data(), nullptr, 64, exact).pass);
  x[5] = 0.05;  // what reading another segment's slot gives
  m = verify::compare(x.data(), zero.data(), nullptr, 64, {});
  EXPECT_FALSE(m.pass);
  EXPECT_EQ(m.max_abs, 0.05);
  // The low-precision implementation's own max abs error widens the bound: 2 x 0.03 + 1e-3.
  std::vector<double> lowp(64, 0.0);
  lowp[9] = -0.03;
  m = verify::compare(x.data(), zero.data(), lowp.data(), 64, {});
  EXPECT_NEAR(m.bound, 0.061, 1e-12);
  EXPECT_TRUE(m.pass);
}

TEST(Compare, TermMagnitudesWidenEachSegmentsFloorByItsCancellation) {
  // Two segments of one row, 64 values: the first a sum whose terms are 1000x it (it cancels),
  // the second one that does not. Both carry 5e-6 of relative error, over the 1e-6 floor.
  verify::HostTensor ref(RATTN_DTYPE_FP32, 2, 1, 64), x(RATTN_DTYPE_FP32, 2, 1, 64),
      magnitude(RATTN_DTYPE_FP32, 2, 1, 64);
  const std::vector<double> r = randn(128, 16), e = noisy(r, 5e-6, 17);
  for (int i = 0; i < 128; ++i) {
    static_cast<float*>(ref.data())[i] = float(r[size_t(i)]);
    static_cast<float*>(x.data())[i] = float(e[size_t(i)]);
    static_cast<float*>(magnitude.data())[i] = float(std::fabs(r[size_t(i)]) * (i < 64 ? 1e3 : 1));
  }
  std::vector<verify::SegmentRows> segments(2);
  segments[0].q_row0 = 0;
  segments[1].q_row0 = 1;
  segments[0].len_q = segments[1].len_q = 1;
  // A floor of 1e-6 relative to the terms plus 1e-7 of the output's own rounding, which does not
  // grow with the terms.
  const Tolerance tol{verify::kMinCosine, 0.0, 1.1e-6, verify::kZeroRefAbsFloor, 1e-6};
  const verify::TensorView mag = magnitude.view();
  const std::vector<Metrics> plain =
      verify::check_tensor(verify::Tensor::Dq, segments, x.view(), ref.view(), nullptr, tol);
  const std::vector<Metrics> wide =
      verify::check_tensor(verify::Tensor::Dq, segments, x.view(), ref.view(), nullptr, tol, &mag);
  EXPECT_FALSE(plain[0].pass);
  EXPECT_FALSE(plain[1].pass);
  EXPECT_NEAR(wide[0].bound, 1e-3 + 1e-7, 1e-9);
  EXPECT_TRUE(wide[0].pass) << wide[0].rel;
  EXPECT_DOUBLE_EQ(wide[1].bound, 1.1e-6);  // magnitudes equal to the sum: no allowance
  EXPECT_FALSE(wide[1].pass) << wide[1].rel;
  EXPECT_EQ(verify::cancellation(0.0, 5.0), 1.0);
  EXPECT_EQ(verify::cancellation(2.0, 1.0), 1.0);
  // Without a terms' part (the GPU paths' tolerances) nothing grows.
  const Tolerance fixed{verify::kMinCosine, 0.0, 1.1e-6};
  EXPECT_DOUBLE_EQ(fixed.with_cancellation(1e3).rel_floor, 1.1e-6);
}

TEST(Compare, EmptySegmentPasses) {
  verify::HostTensor t(RATTN_DTYPE_BF16, 4, 2, 64);
  const Metrics m = verify::check_rows(t.view(), t.view(), nullptr, 2, 0, {});
  EXPECT_TRUE(m.empty());
  EXPECT_TRUE(m.pass);
}

TEST(HostData, PaddedLayoutHasGapsAndFlagsThem) {
  verify::CaseSpec c;
  c.name = "gaps";
  c.seqlens_q = {5, 0, 7};
  c.seqlens_kv = {3, 4, 0};
  c.padded = true;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const verify::PackLayout l = verify::make_layout(c, seed);
    ASSERT_EQ(l.off_q.size(), 4u);
    EXPECT_EQ(l.cu_q, (std::vector<int32_t>{0, 5, 5, 12}));
    EXPECT_GE(l.off_q[0], 1);  // padding before the first segment too
    for (int b = 0; b < 3; ++b) {
      EXPECT_GT(l.off_q[size_t(b) + 1], l.off_q[size_t(b)] + c.seqlens_q[size_t(b)]) << "no gap";
    }
    EXPECT_EQ(l.total_q, l.off_q[3]);
    int64_t valid = 0;
    for (uint8_t pad : l.q_padding) valid += !pad;
    EXPECT_EQ(valid, 12);
    EXPECT_EQ(l.q_padding[size_t(l.off_q[0])], 0);
    EXPECT_EQ(l.q_padding[size_t(l.off_q[0]) - 1], 1);
  }
}

TEST(HostData, OutputsArePoisonedAndPaddingIsWatched) {
  verify::CaseSpec c;
  c.name = "poison";
  c.seqlens_q = {5, 7};
  c.hq = 2;
  c.hkv = 1;
  c.dqk = c.dv = 64;
  c.padded = true;
  const verify::PackLayout l = verify::make_layout(c, 1);
  verify::HostOutputs out = verify::make_outputs(c, l, RATTN_DTYPE_BF16);
  const int64_t row = l.off_q[0];
  EXPECT_TRUE(std::isnan(out.o.view().at(row, 1, 3))) << "unwritten outputs must read as NaN";
  EXPECT_TRUE(std::isnan(out.lse.view().at(row, 1, 0)));
  for (const verify::HostTensor* t : {&out.o, &out.lse, &out.dq}) {
    EXPECT_EQ(verify::changed_padding(*t, l.q_padding), 0);
  }
  out.dq.set(row - 1, 0, 0, 1.f);  // a write into the padding before segment 0
  out.lse.set(l.total_q - 1, 1, 0, 0.f);
  EXPECT_EQ(verify::changed_padding(out.dq, l.q_padding), 1);
  EXPECT_EQ(verify::changed_padding(out.lse, l.q_padding), 1);

  const verify::HostInputs in = verify::make_inputs(c, l, 1);
  EXPECT_EQ(in.q.view().at(row - 1, 0, 0), double(verify::kInputPaddingValue));
  EXPECT_NE(in.q.view().at(row, 0, 0), 0.0);
  // Fresh data per seed.
  const verify::HostInputs other = verify::make_inputs(c, l, 2);
  EXPECT_NE(in.q.view().at(row, 0, 0), other.q.view().at(row, 0, 0));
}

TEST(HostData, NanPaddingFillsEveryInputsPaddingRowsWithNan) {
  verify::CaseSpec c;
  c.name = "nan_padding";
  c.seqlens_q = {5, 7};
  c.seqlens_kv = {9, 3};
  c.hq = 2;
  c.hkv = 1;
  c.dqk = c.dv = 64;
  c.padded = true;
  c.nan_padding = true;
  const verify::PackLayout l = verify::make_layout(c, 3);
  const verify::HostInputs in = verify::make_inputs(c, l, 3);
  struct {
    const verify::HostTensor* t;
    const std::vector<uint8_t>* padding;
  } inputs[] = {{&in.q, &l.q_padding},
                {&in.k, &l.kv_padding},
                {&in.v, &l.kv_padding},
                {&in.d_o, &l.q_padding}};
  for (const auto& x : inputs) {
    int64_t nan_rows = 0, finite_rows = 0;
    for (int64_t row = 0; row < x.t->rows; ++row) {
      const bool pad = (*x.padding)[size_t(row)] != 0;
      const double v = x.t->view().at(row, x.t->heads - 1, x.t->dim - 1);
      EXPECT_EQ(std::isnan(v), pad) << "row " << row;
      (pad ? nan_rows : finite_rows) += 1;
    }
    EXPECT_GT(nan_rows, 0);
    EXPECT_GT(finite_rows, 0);
  }
  // The named suite's padded configuration is the NaN one, so every path's check runs it.
  bool found = false;
  for (const verify::CaseSpec& n : verify::named_suite(8, 2)) {
    if (n.padded) {
      EXPECT_TRUE(n.nan_padding) << n.name;
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

// Sinks and d_lse come from streams of their own: Q, K, V, dO are the same with or without them.
// Sinks lie in [kSinkLow, kSinkHigh]; d_lse's padding columns hold the padding value.
TEST(HostData, SinksAndLseCotangentLeaveTheOtherInputsAlone) {
  verify::CaseSpec c;
  c.name = "sink_inputs";
  c.seqlens_q = {7, 12};
  c.hq = 4;
  c.hkv = 2;
  c.dqk = c.dv = 64;
  c.dtype = RATTN_DTYPE_FP32;
  c.padded = true;
  c.nan_padding = true;
  const verify::PackLayout l = verify::make_layout(c, 9);
  const verify::HostInputs plain = verify::make_inputs(c, l, 9);
  EXPECT_EQ(plain.sink.bytes(), 0u);
  EXPECT_EQ(plain.d_lse.bytes(), 0u);
  c.sink = c.lse_grad = true;
  const verify::HostInputs in = verify::make_inputs(c, l, 9);
  for (auto [a, b] : {std::make_pair(&plain.q, &in.q), std::make_pair(&plain.k, &in.k),
                      std::make_pair(&plain.v, &in.v), std::make_pair(&plain.d_o, &in.d_o)}) {
    ASSERT_EQ(a->bytes(), b->bytes());
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->bytes()), 0);
  }
  ASSERT_EQ(in.sink.rows, 4);
  double lo = 1e9, hi = -1e9;
  for (int32_t h = 0; h < 4; ++h) {
    lo = std::min(lo, in.sink.view().at(h, 0, 0));
    hi = std::max(hi, in.sink.view().at(h, 0, 0));
  }
  EXPECT_GE(lo, verify::kSinkLow);
  EXPECT_LE(hi, verify::kSinkHigh);
  EXPECT_LT(lo, hi);
  ASSERT_EQ(in.d_lse.rows, l.total_q);
  for (int64_t r = 0; r < l.total_q; ++r) {
    for (int32_t h = 0; h < 4; ++h) {
      EXPECT_EQ(std::isnan(in.d_lse.view().at(r, h, 0)), l.q_padding[size_t(r)] != 0) << r;
    }
  }
}

TEST(MaskRules, AgreeWithTheCoreMaskOnRandomBands) {
  // Two derivations of raggedattn.h's mask: the kernels' (src/core) and the brute force's.
  verify::Rng r(42);
  for (int trial = 0; trial < 3000; ++trial) {
    verify::CaseSpec c;
    c.mask = r.chance(0.5) ? RATTN_MASK_CAUSAL : RATTN_MASK_NONE;
    c.alignment = r.chance(0.5) ? RATTN_ALIGN_BOTTOM_RIGHT : RATTN_ALIGN_TOP_LEFT;
    c.window_left = int32_t(r.range(-1, 20));
    c.window_right =
        c.mask == RATTN_MASK_CAUSAL ? int32_t(r.range(-1, 0)) : int32_t(r.range(-1, 20));
    const verify::MaskRule rule = verify::MaskRule::of(c);
    MaskSpec core;
    core.left = c.window_left;
    core.right = c.mask == RATTN_MASK_CAUSAL ? 0 : c.window_right;
    core.bottom_right = c.alignment == RATTN_ALIGN_BOTTOM_RIGHT;
    const int lq = int(r.range(0, 40)), lk = int(r.range(0, 40));
    for (int i = 0; i < lq; ++i) {
      int64_t seen = 0;
      for (int j = 0; j < lk; ++j) {
        ASSERT_EQ(rule.visible(i, j, lq, lk), core.visible(i, j, lq, lk))
            << "trial " << trial << " i=" << i << " j=" << j << " lq=" << lq << " lk=" << lk;
        seen += rule.visible(i, j, lq, lk);
      }
      ASSERT_EQ(rule.keys_seen(i, lq, lk), seen);
    }
  }
}

TEST(Flops, CountVisiblePairsOnly) {
  verify::CaseSpec c;
  c.seqlens_q = {4};
  c.hq = 1;
  c.dqk = c.dv = 128;
  EXPECT_EQ(verify::visible_pairs(c), 16);
  c.mask = RATTN_MASK_CAUSAL;
  EXPECT_EQ(verify::visible_pairs(c), 10);
  EXPECT_DOUBLE_EQ(verify::forward_flops(c), 2.0 * 256 * 10);
  EXPECT_DOUBLE_EQ(verify::backward_flops(c), 2.5 * 2.0 * 256 * 10);
  c.window_left = 1;
  EXPECT_EQ(verify::visible_pairs(c), 1 + 2 + 2 + 2);
  c.window_left = -1;
  c.seqlens_q = {2};
  c.seqlens_kv = {5};
  c.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
  EXPECT_EQ(verify::visible_pairs(c), 4 + 5);
  c.alignment = RATTN_ALIGN_TOP_LEFT;
  EXPECT_EQ(verify::visible_pairs(c), 1 + 2);
}

TEST(Runner, CpuPathReportsDenseModeTimingsAndPath) {
  verify::CaseSpec c = verify::named_suite(2, 1)[1];
  c.backend = RATTN_BACKEND_CPU;
  c.dtype = RATTN_DTYPE_FP32;
  verify::RunOptions opt;
  opt.timing_runs = 2;
  const verify::CaseReport r = verify::run_case(c, opt);
  ASSERT_EQ(r.status, RATTN_SUCCESS) << r.error;
  EXPECT_TRUE(r.pass);
  EXPECT_EQ(r.mode, verify::CheckMode::Dense);
  EXPECT_EQ(r.timed_runs, 2);
  EXPECT_GT(r.fwd_ms, 0.0);
  EXPECT_EQ(r.path.rfind("cpu fp32", 0), 0u) << r.path;
  EXPECT_EQ(r.nondeterministic, -1);
  ASSERT_EQ(r.fwd_call_ms.size(), 2u);
  ASSERT_EQ(r.bwd_call_ms.size(), 2u);
  EXPECT_EQ(r.fwd_ms, (r.fwd_call_ms[0] + r.fwd_call_ms[1]) / 2);  // median of the calls kept
}

// do_bench's regime with its cache flush: timed calls until they have run min_timed_ms (more than
// timing_runs), each after the flush buffer is zeroed; every call's time is kept.
TEST(Runner, TimedCallsRunUntilTheMinimumTimeWithTheFlushBetween) {
  verify::CaseSpec c = verify::named_suite(2, 1)[1];
  c.backend = RATTN_BACKEND_CPU;
  c.dtype = RATTN_DTYPE_FP32;
  verify::RunOptions opt;
  opt.check = false;
  opt.timing_runs = 1;
  opt.min_timed_ms = 20;
  opt.l2_flush_bytes = size_t(1) << 20;
  const verify::CaseReport r = verify::run_case(c, opt);
  ASSERT_EQ(r.status, RATTN_SUCCESS) << r.error;
  ASSERT_GE(r.fwd_call_ms.size(), 1u);
  double total = 0;
  for (double ms : r.fwd_call_ms) total += ms;
  EXPECT_GE(total, 20.0);
  EXPECT_LT(total - r.fwd_call_ms.back(), 20.0);  // no call past the minimum
}

// A kernel that never ends blocks every later CUDA call, so past its deadline the watchdog ends
// the process itself, naming the work; disarmed in time, it lets the process go on.
TEST(Watchdog, PastItsDeadlineItNamesTheWorkAndExits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        verify::Watchdog dog(0.2, "case spin (run seed 7): its forward, backward and downloads");
        std::this_thread::sleep_for(std::chrono::seconds(20));
      },
      testing::ExitedWithCode(verify::kExitHang),
      "case spin \\(run seed 7\\): its forward, backward and downloads: still running after "
      "0.2 s, so a kernel hangs");
}

TEST(Watchdog, DisarmedInTimeItLetsTheProcessGoOn) {
  const auto t0 = std::chrono::steady_clock::now();
  { verify::Watchdog dog(0.3, "work that ends"); }
  { verify::Watchdog none(0, "no deadline"); }
  { verify::Watchdog centuries(1e12, "a deadline past the clock's range"); }
  // Past the first one's deadline: a watchdog that had not disarmed would have ended the process.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));  // no wait for it
}

// The CPU path's calls are the host's own: no deadline, however short the option.
TEST(Runner, CpuPathRunsWithoutTheDeviceDeadline) {
  verify::CaseSpec c = verify::named_suite(2, 1)[1];
  c.backend = RATTN_BACKEND_CPU;
  verify::RunOptions opt;
  opt.hang_seconds = 1e-6;
  const verify::CaseReport r = verify::run_case(c, opt);
  EXPECT_EQ(r.status, RATTN_SUCCESS) << r.error;
  EXPECT_TRUE(r.pass);
}

TEST(Runner, DeterministicBackwardIsComparedBitwise) {
  verify::CaseSpec c = verify::named_suite(2, 1)[1];
  c.backend = RATTN_BACKEND_CPU;
  c.deterministic = true;
  const verify::CaseReport r = verify::run_case(c, {});
  EXPECT_TRUE(r.pass);
  EXPECT_EQ(r.nondeterministic, 0);
}

TEST(Runner, PlanErrorsAreReportedWithTheLibraryMessage) {
  verify::CaseSpec c = verify::named_suite(2, 1)[1];
  c.dqk = c.dv = 100;
  c.backend = RATTN_BACKEND_CPU;
  const verify::CaseReport r = verify::run_case(c, {});
  EXPECT_FALSE(r.pass);
  EXPECT_TRUE(r.plan_error());
  EXPECT_EQ(r.status, RATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(r.error.find("head_dim_qk=100"), std::string::npos) << r.error;
}

// With sinks: d_sink is compared (one value per head), the rows that see no key are counted and
// hold; without, neither is.
TEST(Runner, SinkCasesCheckDSinkAndTheRowsThatSeeNoKey) {
  verify::CaseSpec c;
  for (const verify::CaseSpec& n : verify::named_suite(2, 1)) {
    if (n.name == "sink_zero_len") c = n;
  }
  ASSERT_EQ(c.name, "sink_zero_len");
  c.backend = RATTN_BACKEND_CPU;
  verify::CaseReport r = verify::run_case(c, {});
  ASSERT_EQ(r.status, RATTN_SUCCESS) << r.error;
  EXPECT_TRUE(r.pass);
  EXPECT_EQ(r.d_sink.rows, c.hq);
  EXPECT_TRUE(r.d_sink.pass);
  EXPECT_GT(r.keyless_rows, 0);
  EXPECT_EQ(r.keyless_wrong, 0);
  std::ostringstream os;
  verify::print_case(os, r);
  EXPECT_NE(os.str().find("d_sink (2 heads, summed over the segments): cos"), std::string::npos)
      << os.str();
  EXPECT_NE(os.str().find("sinks, lse grad"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("rows that see no key ("), std::string::npos) << os.str();
  r.d_sink.pass = false;
  r.keyless_wrong = 3;
  r.pass = false;
  std::ostringstream failed;
  verify::print_case(failed, r);
  EXPECT_NE(failed.str().find("! d_sink: cos"), std::string::npos) << failed.str();
  EXPECT_NE(failed.str().find("! rows that see no key: 3 of"), std::string::npos) << failed.str();

  c.sink = c.lse_grad = false;
  const verify::CaseReport plain = verify::run_case(c, {});
  EXPECT_TRUE(plain.pass);
  EXPECT_TRUE(plain.d_sink.empty());
  EXPECT_EQ(plain.keyless_wrong, -1);
}

TEST(Report, TableHasARowPerSegmentAndMarksFailures) {
  verify::CaseSpec c = verify::named_suite(2, 1)[1];  // three segments
  c.backend = RATTN_BACKEND_CPU;
  verify::CaseReport r = verify::run_case(c, {});
  ASSERT_TRUE(r.pass);
  r.segments[2].t[size_t(verify::Tensor::Dq)].pass = false;
  r.pass = false;
  std::ostringstream os;
  verify::print_case(os, r);
  const std::string s = os.str();
  EXPECT_NE(s.find("    2    "), std::string::npos);
  EXPECT_NE(s.find("! segment 2 dQ"), std::string::npos) << s;
  EXPECT_NE(s.find("FAIL"), std::string::npos);
  std::ostringstream v;
  EXPECT_FALSE(verify::print_verdict(v, {r}));
  EXPECT_EQ(v.str().rfind("FAIL", 0), 0u);
}

}  // namespace
}  // namespace raggedattn

// NVML, where the driver has it, finds no GPU at a PCI bus id that none has; without the driver
// (CI) it does not open at all. Either way: no sensors, and no crash.
TEST(GpuSensors, NoSensorsAtABusIdWithoutAGpu) {
  EXPECT_EQ(raggedattn::verify::open_gpu_sensors("ffff:ff:1f.7"), nullptr);
}

// The reasons a busy GPU's clock is held down, named; idling is not one of them.
TEST(GpuSensors, SlowdownReasonsAreNamed) {
  using namespace raggedattn::verify;
  EXPECT_EQ(slowdown_names(0), "");
  EXPECT_EQ(slowdown_names(kSlowdownIdle), "");
  EXPECT_EQ(slowdown_names(kSlowdownPowerCap), "power cap");
  EXPECT_EQ(slowdown_names(kSlowdownPowerCap | kSlowdownHwPowerBrake | kSlowdownIdle),
            "power cap+hw power brake");
  EXPECT_EQ(kSlowdownThrottling & kSlowdownIdle, 0u);
}

// A direction's summary of its samples: medians, range, the share held down by power or
// temperature (idling is not), and the board's energy per FLOP from the median power and time.
TEST(GpuSensors, SummaryOfTheSamples) {
  using namespace raggedattn::verify;
  std::vector<GpuReading> rs(5);
  const int mhz[] = {1980, 1650, 1700, 1500, 1980};
  const double watts[] = {700, 860, 800, 900, 650};
  for (int i = 0; i < 5; ++i) {
    rs[i].sm_mhz = mhz[i];
    rs[i].watts = watts[i];
    rs[i].instant_watts = true;
  }
  rs[1].slowdown = kSlowdownPowerCap;
  rs[3].slowdown = kSlowdownPowerCap | kSlowdownHwThermal;
  rs[4].slowdown = kSlowdownIdle;
  const Sensed s = sensed(rs, 2.0e12, 4.0);  // 2 TFLOP in 4 ms
  EXPECT_EQ(s.mhz, 1700);
  EXPECT_EQ(s.mhz_min, 1500);
  EXPECT_EQ(s.mhz_max, 1980);
  EXPECT_EQ(s.watts, 800);
  EXPECT_TRUE(s.instant_watts);
  EXPECT_DOUBLE_EQ(s.throttled, 0.4);
  EXPECT_EQ(s.reasons, kSlowdownPowerCap | kSlowdownHwThermal);
  EXPECT_DOUBLE_EQ(s.pj_per_flop, 800 * 4e-3 / 2.0e12 * 1e12);  // 1.6 pJ
  rs[2].instant_watts = false;  // one averaged reading: the summary says so
  EXPECT_FALSE(sensed(rs, 2.0e12, 4.0).instant_watts);
  EXPECT_EQ(sensed({}, 2.0e12, 4.0).mhz, 0);
  // An even count: the mean of the two middle samples, as the timings' median (runner.cpp).
  rs.pop_back();  // 1980, 1650, 1700, 1500 MHz; 700, 860, 800, 900 W
  const Sensed e = sensed(rs, 2.0e12, 4.0);
  EXPECT_EQ(e.mhz, 1675);
  EXPECT_DOUBLE_EQ(e.watts, 830);
  EXPECT_DOUBLE_EQ(median({3.0, 1.0, 2.0, 10.0}), 2.5);
  EXPECT_DOUBLE_EQ(median({}), 0.0);
}

// The timing loop's sampler: reads on its own thread until stopped, keeps what it read, in order;
// with nothing to read it starts no thread and keeps nothing.
TEST(GpuSensors, SamplerReadsUntilStoppedAndKeepsTheReadings) {
  using raggedattn::verify::GpuReading;
  std::atomic<int> calls{0};
  std::vector<GpuReading> out;
  {
    raggedattn::verify::SensorSampler s(
        [&](GpuReading* g) {
          g->sm_mhz = ++calls;
          g->watts = 1.0;
          return true;
        },
        &out);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    s.stop();
    const int at_stop = calls.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(calls.load(), at_stop);  // no read after stop()
  }
  ASSERT_GE(out.size(), 3u);
  EXPECT_EQ(int(out.size()), calls.load());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i].sm_mhz, int(i) + 1);
  std::vector<GpuReading> none;
  int tries = 0;
  {
    raggedattn::verify::SensorSampler s(
        [&](GpuReading*) {
          ++tries;
          return false;
        },
        &none);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(tries, 1);
  EXPECT_TRUE(none.empty());
}

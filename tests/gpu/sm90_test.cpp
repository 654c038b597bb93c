// The Hopper path (wgmma forward and backward) against the CPU reference, per segment and per
// tensor: the named configurations it takes (head dims 64/64, 128/128, 256/256 and 192/128),
// bf16 and fp16, both dQ modes, the deterministic mode, both forward kernels, both of the D = 256
// backward's ways to add dQ, and random ragged problems drawn fresh every run. Skipped where
// there is no sm_90 device or the build lacks the Hopper kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <numeric>
#include <regex>
#include <string>
#include <vector>

#include "core/sm90_shapes.hpp"
#include "gpu_test_util.hpp"
#include "plan/policy.hpp"
#include "verify/case_spec.hpp"

namespace raggedattn {
namespace {

using verify::CaseSpec;

using gpu_test::SuiteParam;

std::vector<SuiteParam> suite_params() {
  return gpu_test::named_variants(
      RATTN_BACKEND_CUDA_SM90,
      {{"bf16_dq_fp32", RATTN_DTYPE_BF16, RATTN_DQ_ACCUM_FP32, false},
       {"bf16_dq_bf16", RATTN_DTYPE_BF16, RATTN_DQ_ACCUM_BF16, false},
       {"fp16_dq_fp32", RATTN_DTYPE_FP16, RATTN_DQ_ACCUM_FP32, false},
       {"fp16_dq_fp16", RATTN_DTYPE_FP16, RATTN_DQ_ACCUM_BF16, false},
       {"bf16_deterministic", RATTN_DTYPE_BF16, RATTN_DQ_ACCUM_FP32, true}},
      [](const CaseSpec& c) {  // the configurations with a Hopper kernel in some direction
        return sm90::path_supports(c.dqk, c.dv);
      });
}

// What the Plan must print for a configuration: the Hopper path, and per direction its wgmma
// kernel where one exists for the head dims, the portable kernel otherwise.
std::vector<std::string> expected_path(const CaseSpec& c) {
  return {"cuda_sm90", sm90::fwd_supports(c.dqk, c.dv) ? "fwd[wgmma" : "fwd[mma.sync",
          sm90::bwd_supports(c.dqk, c.dv) ? "bwd[wgmma" : "bwd[mma.sync"};
}

// A case forced onto the Hopper path: these query lengths (keys the same), heads, head dims and
// mask; CaseSpec's defaults otherwise.
CaseSpec sm90_case(const std::string& name, const std::vector<int32_t>& lens, int32_t hq,
                   int32_t hkv, int32_t dim, rattn_mask mask) {
  CaseSpec c;
  c.name = name;
  c.seqlens_q = lens;
  c.hq = hq;
  c.hkv = hkv;
  c.dqk = c.dv = dim;
  c.mask = mask;
  c.backend = RATTN_BACKEND_CUDA_SM90;
  return c;
}

class HopperSuite : public ::testing::TestWithParam<SuiteParam> {};

TEST_P(HopperSuite, EverySegmentMatchesTheReference) {
  RATTN_REQUIRE_SM90();
  gpu_test::expect_case_passes(GetParam().spec, expected_path(GetParam().spec));
}

INSTANTIATE_TEST_SUITE_P(Sm90, HopperSuite, ::testing::ValuesIn(suite_params()),
                         [](const ::testing::TestParamInfo<SuiteParam>& suite) {
                           return suite.param.label;
                         });

// The Hopper forward's two kernels (policy::fwd_persistent): the persistent one, one CTA per SM
// over all work items, where the items are short; the grid one, one CTA per item, where they are
// long (at D = 128 under a causal mask: a document of the mean length up to 6144 tokens, 24.5 key
// tiles per query tile on average, and the longest up to 7296, 29 (7198 among shorter ones
// below, with more work items than an H200 has SMs), the grid kernel from 7297, 29.5 (7553
// below); at D = 64 up to 4224 tokens, 17, and from 4225, 17.5; at Dqk 192 / Dv 128 and D = 256
// up to 16k tokens). Each must match the reference, and the Plan must have chosen it (the
// persistent kernel's description says "N CTAs over M items", the grid kernel's says nothing).
TEST(HopperForward, BothKernelsMatchTheReference) {
  RATTN_REQUIRE_SM90();
  const int sms = query_device().num_sms;
  struct Schedule {
    const char* name;
    std::vector<int32_t> lens;
    int32_t hq, hkv;
    bool persistent;
    int32_t dim = 128;
    int32_t dim_v = 0;  // 0: dim
  };
  const Schedule schedules[] = {
      {"persistent", {6144, 300, 1, 77}, 3, 1, true},
      {"persistent_mixed", {7198, 1000, 300, 77}, 2, 1, true},
      {"grid", {7553, 200, 33}, 1, 1, false},
      {"grid_mqa", {33, 7553}, 2, 1, false},
      {"grid_d64", {4300, 33, 0}, 2, 1, false, 64},
      {"persistent_d256", {3000, 100, 1}, 6, 2, true, 256},
      {"persistent_d64", {4096, 77, 1}, 5, 1, true, 64},
      {"persistent_d192_128", {6144, 50}, 3, 1, true, 192, 128},
  };
  const MaskSpec causal{-1, 0, 0};
  for (const Schedule& sc : schedules) {
    const int longest = *std::max_element(sc.lens.begin(), sc.lens.end());
    const int64_t total = std::accumulate(sc.lens.begin(), sc.lens.end(), int64_t{0});
    const int dim_v = sc.dim_v ? sc.dim_v : sc.dim;
    const policy::FwdDocs docs =
        policy::FwdDocs::of(total, total, int64_t(sc.lens.size()), longest, longest);
    ASSERT_EQ(policy::fwd_persistent(sc.dim, dim_v, causal, docs), sc.persistent) << sc.name;
  }
  for (const Schedule& sc : schedules) {
    SCOPED_TRACE(sc.name);
    CaseSpec c = sm90_case(sc.name, sc.lens, sc.hq, sc.hkv, sc.dim, RATTN_MASK_CAUSAL);
    if (sc.dim_v) c.dv = sc.dim_v;
    const verify::CaseReport r = gpu_test::expect_case_passes(c, {"fwd[wgmma"});
    std::smatch m;
    const bool said = std::regex_search(r.path, m, std::regex("(\\d+) CTAs over (\\d+) items"));
    if (sc.persistent) {
      ASSERT_TRUE(said) << r.path;
      const long ctas = std::stol(m[1].str()), items = std::stol(m[2].str());
      ASSERT_GT(items, sms) << "the case must have more work items than the device has SMs";
      EXPECT_EQ(ctas, sms) << r.path;
    } else {
      EXPECT_FALSE(said) << "the grid kernel was expected: " << r.path;
    }
  }
}

// The column split's (D = 256) two backward kernels (policy::bwd_dq_from_registers): with a 16-bit
// dQ scratch outside deterministic mode each step's dQ goes from the consumers' registers into
// the scratch by vector reductions, two Q/dO stages; with an fp32 scratch or in deterministic mode
// through the shared-memory tile (and warp 1's turns), one stage. Every segment against the
// reference, and the Plan must have chosen the kernel (its description says "dQ from
// registers" or "dQ staged"). Segments include 1, 0 and lengths that are not multiples of 16,
// more query tiles than one segment's key tiles, MQA and GQA, and keys that are not the queries
// (bottom-right alignment).
TEST(HopperBackward, ColumnSplitDqFromRegistersAndThroughTheTile) {
  RATTN_REQUIRE_SM90();
  struct Shape {
    const char* name;
    std::vector<int32_t> lens_q, lens_kv;
    int32_t hq, hkv;
    rattn_mask mask;
    rattn_alignment align;
    int32_t left, right;
    float softcap;
    rattn_dtype dtype;
  };
  const Shape shapes[] = {
      {"causal_mqa",
       {700, 1, 0, 129, 77},
       {},
       4,
       1,
       RATTN_MASK_CAUSAL,
       RATTN_ALIGN_TOP_LEFT,
       -1,
       -1,
       0.f,
       RATTN_DTYPE_BF16},
      {"full_gqa_softcap",
       {300, 65, 17},
       {},
       4,
       2,
       RATTN_MASK_NONE,
       RATTN_ALIGN_TOP_LEFT,
       -1,
       -1,
       2.f,
       RATTN_DTYPE_BF16},
      {"window_fp16",
       {530, 200},
       {},
       2,
       1,
       RATTN_MASK_NONE,
       RATTN_ALIGN_TOP_LEFT,
       90,
       20,
       0.f,
       RATTN_DTYPE_FP16},
      {"cross_bottom_right",
       {250, 1, 40},
       {400, 9, 0},
       4,
       1,
       RATTN_MASK_CAUSAL,
       RATTN_ALIGN_BOTTOM_RIGHT,
       -1,
       -1,
       0.f,
       RATTN_DTYPE_BF16},
  };
  for (const Shape& sh : shapes) {
    for (bool deterministic : {false, true}) {
      for (rattn_dq_accum accum : {RATTN_DQ_ACCUM_FP32, RATTN_DQ_ACCUM_BF16}) {
        const bool regs =
            policy::bwd_dq_from_registers(256, 256, deterministic, accum == RATTN_DQ_ACCUM_FP32);
        ASSERT_EQ(regs, !deterministic && accum != RATTN_DQ_ACCUM_FP32);
        CaseSpec c = sm90_case(std::string(sh.name) + (deterministic ? "_deterministic" : "") +
                                   (accum == RATTN_DQ_ACCUM_FP32 ? "_dq_fp32" : "_dq_16bit"),
                               sh.lens_q, sh.hq, sh.hkv, 256, sh.mask);
        SCOPED_TRACE(c.name);
        c.seqlens_kv = sh.lens_kv;
        c.dtype = sh.dtype;
        c.alignment = sh.align;
        c.window_left = sh.left;
        c.window_right = sh.right;
        c.softcap = sh.softcap;
        c.dq_accum = accum;
        c.deterministic = deterministic;
        const verify::CaseReport r = gpu_test::expect_case_passes(c, {"bwd[wgmma 64x64"});
        EXPECT_NE(r.path.find(regs ? "dQ from registers" : "dQ staged"), std::string::npos)
            << r.path;
      }
    }
  }
}

// The backward's schedule with both orders in one problem (BwdWorkspace::schedule): a segment
// longer than policy::bwd_interleave_rows runs its KV heads one after the other, the shorter ones
// (and a length-1 and a zero-length segment) their heads interleaved tile by tile. Either order
// covers every (key tile, KV head) once: a tile skipped leaves its dK and dV poisoned, one run
// twice doubles its dQ terms.
TEST(HopperBackward, ScheduleTakesBothOrdersInOneProblem) {
  RATTN_REQUIRE_SM90();
  const int64_t l2 = query_device(-1).l2_bytes;
  // 64 query heads: the longer segment past the rule's rows at half the tokens of 32 heads'.
  const int32_t hq = 64, hkv = 8, dim = 64;
  const int64_t rows = policy::bwd_interleave_rows(l2, hq, dim, dim, 4);  // fp32 dQ scratch
  ASSERT_GT(rows, 100) << "L2 " << l2;
  const int32_t longer = int32_t(rows + 77), shorter = int32_t(std::min<int64_t>(rows, 700));
  for (rattn_mask mask : {RATTN_MASK_CAUSAL, RATTN_MASK_NONE}) {
    CaseSpec c = sm90_case("schedule_both_orders", {shorter, 1, longer, 0, 41}, hq, hkv, dim, mask);
    SCOPED_TRACE(std::to_string(longer) + " rows against " + std::to_string(rows));
    gpu_test::expect_case_passes(c, {"bwd[wgmma"});
  }
}

// Random ragged problems at the Hopper kernels' head dims: every mask, window, softcap, GQA/MQA,
// padded THD, zero-length and length-1 segments, lengths that are not multiples of 16.
TEST(HopperRandom, FreshRaggedProblems) {
  RATTN_REQUIRE_SM90();
  const uint64_t base = gpu_test::run_seed() ^ 0x5eed90ull;
  std::cout << "random cases from seed " << base << "\n";
  constexpr int kCases = 120;
  int failures = 0;
  for (int i = 0; i < kCases; ++i) {
    verify::RandomLimits lim;
    // Eight query heads (groups 1, 2, 4, 8) or, in a third of the cases, six (groups 1, 2, 3, 6:
    // a group that is not a power of two).
    lim.heads_q = (i % 3 == 1) ? 6 : 8;
    lim.max_segments = 8;
    lim.max_total = 900;
    lim.dtype = (i % 4 == 3) ? RATTN_DTYPE_FP16 : RATTN_DTYPE_BF16;
    lim.backend = RATTN_BACKEND_CUDA_SM90;
    CaseSpec spec = verify::random_case(base + uint64_t(i), lim);
    // Head dims: 128 in three cases of five, 64 in one, and in the fifth 256/256 (the column-split
    // backward) or 192/128 (the key split with scores in turn) in turn.
    spec.dqk = spec.dv = (i % 5 == 4) ? 64 : 128;
    if (i % 5 == 2) {
      spec.dqk = (i / 5) % 2 ? 192 : 256;
      spec.dv = (i / 5) % 2 ? 128 : 256;
    }
    spec.dq_accum = (i % 2) ? RATTN_DQ_ACCUM_BF16 : RATTN_DQ_ACCUM_FP32;
    spec.deterministic = (i % 7 == 3);
    verify::RunOptions opt;
    opt.seed = base + uint64_t(i);
    const verify::CaseReport r = verify::run_case(spec, opt);
    bool on_path = !r.plan_error();
    for (const std::string& part : expected_path(spec)) {
      on_path = on_path && r.path.find(part) != std::string::npos;
    }
    if (!on_path) {
      ADD_FAILURE() << "case " << i << ": not run on the Hopper kernels: " << r.error << r.path;
      ++failures;
      continue;
    }
    if (!r.pass || (spec.deterministic && r.nondeterministic != 0)) {
      ++failures;
      ADD_FAILURE() << "case " << i << " seed " << opt.seed << "\n" << gpu_test::table(r);
    }
  }
  std::cout << kCases << " random cases, " << failures << " failing\n";
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace raggedattn

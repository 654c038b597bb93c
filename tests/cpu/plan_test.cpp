// The Plan: path choice from (fake) capabilities, and one object giving both the workspace size
// and the layouts the launches address (no decision made twice).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "core/portable_shapes.hpp"
#include "core/sm90_shapes.hpp"
#include "plan/plan_data.hpp"
#include "plan/policy.hpp"
#include "test_util.hpp"

namespace raggedattn {
namespace {

using ::testing::HasSubstr;
using testing_util::fake_hopper_caps;
using testing_util::kBuiltWithCuda;

Problem small_problem(rattn_backend backend) {
  Problem p = default_problem();
  p.batch = 3;
  p.total_q = p.total_kv = 256;
  p.max_seqlen_q = p.max_seqlen_kv = 100;
  p.num_heads_q = 8;
  p.num_heads_kv = 2;
  p.head_dim_qk = p.head_dim_v = 128;
  p.mask = RATTN_MASK_CAUSAL;
  p.backend = backend;
  return p;
}

TEST(PlanPath, CpuBackendIsTheReference) {
  for (const DeviceCaps& caps : {cpu_caps(), fake_hopper_caps()}) {
    Plan plan;
    ASSERT_TRUE(make_plan(small_problem(RATTN_BACKEND_CPU), caps, &plan).ok());
    EXPECT_EQ(plan.path(), Path::Cpu);
    EXPECT_EQ(plan.workspace_bytes(Direction::Forward), 0u);
    EXPECT_EQ(plan.workspace_bytes(Direction::Backward), 0u);
    EXPECT_THAT(plan.describe(), ::testing::StartsWith("cpu "));
  }
}

TEST(PlanPath, AutoWithoutCudaIsCpu) {
  Plan plan;
  ASSERT_TRUE(make_plan(small_problem(RATTN_BACKEND_AUTO), cpu_caps(), &plan).ok());
  EXPECT_EQ(plan.path(), Path::Cpu);
}

const bool kBuiltWithSm90 = path_in_build(Path::CudaSm90);

DeviceCaps fake_ampere_caps() {
  DeviceCaps c = fake_hopper_caps();
  c.cc_major = 8;
  c.cc_minor = 0;
  c.num_sms = 108;
  c.smem_per_block_optin = 166912;
  return c;
}

Problem long_problem(rattn_backend backend) {
  Problem p = small_problem(backend);
  p.batch = 2;
  p.total_q = p.total_kv = 20000;
  p.max_seqlen_q = p.max_seqlen_kv = 16384;
  return p;
}

// How describe() shows the Hopper backward's launch shape (core/sm90_shapes.hpp).
std::string sm90_bwd_shape() {
  return "bwd[wgmma " + std::to_string(sm90::kBwd.block_m) + "x" +
         std::to_string(sm90::kBwd.block_n) + " " + std::to_string(sm90::kBwdThreads) + "thr";
}

TEST(PlanPath, AutoWithCudaIsTheBestCudaPathWhereBuilt) {
  for (rattn_backend b : {RATTN_BACKEND_AUTO, RATTN_BACKEND_CUDA}) {
    Plan plan;
    const Status s = make_plan(long_problem(b), fake_hopper_caps(), &plan);
    if (!kBuiltWithCuda) {  // a CPU-only build has no CUDA path to choose, whatever the device
      EXPECT_EQ(b == RATTN_BACKEND_AUTO, s.ok());
      if (s.ok()) {
        EXPECT_EQ(plan.path(), Path::Cpu);
      }
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.message();
    // D = 128, segments of up to 16384 on an sm_90 device: the Hopper path where built (its
    // forward), else the portable.
    if (kBuiltWithSm90) {
      EXPECT_EQ(plan.path(), Path::CudaSm90);
      EXPECT_THAT(plan.describe(), ::testing::StartsWith("cuda_sm90 "));
      EXPECT_THAT(plan.describe(), HasSubstr("fwd[wgmma 128x128 384thr"));
      EXPECT_THAT(plan.describe(), HasSubstr(sm90_bwd_shape()));
      // A causal document of 16384 tokens: the Hopper forward's grid kernel, its forward
      // workspace the query tiles' order only.
      EXPECT_EQ(plan.data().fwd.item_ctas, 0);
      EXPECT_EQ(plan.data().bwd.item_ctas, 0);
      EXPECT_EQ(plan.data().fwd_ws.schedule.bytes,
                size_t(plan.data().fwd.tiles) * sizeof(TileCoord));
      EXPECT_EQ(plan.data().fwd_ws.work_counter.bytes, 0u);
      EXPECT_EQ(plan.workspace_bytes(Direction::Forward), plan.data().fwd_ws.total);
    } else {
      EXPECT_EQ(plan.path(), Path::CudaPortable);
    }
  }
}

TEST(PlanPath, HopperPathOnlyWhereItTakesTheProblem) {
  if (!kBuiltWithCuda) GTEST_SKIP() << "CPU-only build";
  // Head dims the Hopper kernels lack, an sm_80 device, or a forced portable backend: portable.
  Problem d96 = long_problem(RATTN_BACKEND_AUTO);
  d96.head_dim_qk = d96.head_dim_v = 96;
  struct Case {
    Problem p;
    DeviceCaps caps;
  };
  for (const Case& c :
       {Case{d96, fake_hopper_caps()}, Case{long_problem(RATTN_BACKEND_AUTO), fake_ampere_caps()},
        Case{long_problem(RATTN_BACKEND_CUDA_PORTABLE), fake_hopper_caps()}}) {
    Plan plan;
    ASSERT_TRUE(make_plan(c.p, c.caps, &plan).ok());
    EXPECT_EQ(plan.path(), Path::CudaPortable) << plan.describe();
    EXPECT_THAT(plan.describe(), HasSubstr("fwd[mma.sync "));
  }
}

TEST(PlanPath, PortableBackwardStagesDqOnSm90InAtomicFp32ModeWhereItFits) {
  if (!kBuiltWithCuda) GTEST_SKIP() << "CPU-only build";
  // The portable backward passes dQ through shared memory and a bulk reduce-add only where its
  // sm_90 build runs, the scratch is fp32 and the mode is atomic; never at the price of a stage.
  for (int dim : {64, 96, 128, 192, 256}) {
    for (const DeviceCaps& caps : {fake_hopper_caps(), fake_ampere_caps()}) {
      for (int det : {0, 1}) {
        for (rattn_dq_accum accum : {RATTN_DQ_ACCUM_FP32, RATTN_DQ_ACCUM_BF16}) {
          Problem p = long_problem(RATTN_BACKEND_CUDA_PORTABLE);
          p.head_dim_qk = p.head_dim_v = dim;
          p.deterministic = det;
          p.dq_accum = accum;
          Plan plan;
          ASSERT_TRUE(make_plan(p, caps, &plan).ok());
          const LaunchShape& bwd = plan.data().bwd;
          const size_t limit = size_t(caps.smem_per_block_optin);
          const bool fits = portable::bwd_smem(dim, dim, bwd.stages, true).bytes <= limit;
          const bool expected = caps.cc_major == 9 && !det && accum == RATTN_DQ_ACCUM_FP32 && fits;
          SCOPED_TRACE(plan.describe());
          EXPECT_EQ(bwd.dq_staged, expected);
          EXPECT_EQ(bwd.stages, portable::bwd_smem(dim, dim, 2).bytes <= limit ? 2 : 1);
          EXPECT_EQ(bwd.smem_bytes, portable::bwd_smem(dim, dim, bwd.stages, expected).bytes);
          EXPECT_LE(bwd.smem_bytes, limit);
          EXPECT_EQ(plan.describe().find("dQ staged") != std::string::npos, expected);
        }
      }
    }
  }
  // D = 128 on the H100/H200: staged, with both Q/dO stages.
  Plan plan;
  ASSERT_TRUE(make_plan(long_problem(RATTN_BACKEND_CUDA_PORTABLE), fake_hopper_caps(), &plan).ok());
  EXPECT_TRUE(plan.data().bwd.dq_staged);
  EXPECT_EQ(plan.data().bwd.stages, 2);
}

TEST(PlanPath, ShortDocumentsTakeThePortableForwardAndTheHopperBackward) {
  if (!kBuiltWithSm90) GTEST_SKIP() << "build without the Hopper kernels";
  // Segments shorter than policy::kAutoMinSeqlenKv: the portable forward measured faster there, the
  // Hopper backward faster everywhere. A forced cuda_sm90 runs both directions on wgmma.
  Problem short_docs = long_problem(RATTN_BACKEND_AUTO);
  short_docs.max_seqlen_q = short_docs.max_seqlen_kv = policy::kAutoMinSeqlenKv - 1;
  Plan plan;
  ASSERT_TRUE(make_plan(short_docs, fake_hopper_caps(), &plan).ok());
  EXPECT_EQ(plan.path(), Path::CudaSm90);
  EXPECT_EQ(plan.data().fwd.family, KernelFamily::MmaSync);
  EXPECT_EQ(plan.data().bwd.family, KernelFamily::Wgmma);
  EXPECT_THAT(plan.describe(), HasSubstr("fwd[mma.sync 128x64 128thr"));
  EXPECT_THAT(plan.describe(), HasSubstr(sm90_bwd_shape()));
  short_docs.backend = RATTN_BACKEND_CUDA_SM90;
  ASSERT_TRUE(make_plan(short_docs, fake_hopper_caps(), &plan).ok());
  EXPECT_EQ(plan.data().fwd.family, KernelFamily::Wgmma);
  EXPECT_EQ(plan.data().bwd.family, KernelFamily::Wgmma);
}

TEST(PlanPath, HopperForwardIsPersistentWhereItsItemsAreShort) {
  if (!kBuiltWithSm90) GTEST_SKIP() << "build without the Hopper kernels";
  // policy::fwd_persistent: the persistent kernel where a document of the problem's mean length
  // sees at most fwd_persistent_max_mean_key_tiles key tiles on average under the mask
  // (fwd_mean_key_tiles, in the kernel's key tiles) and its longest at most
  // fwd_persistent_max_longest_key_tiles. The persistent kernel runs one CTA per SM
  // over all work items (never more CTAs than
  // items), with its counter in the forward's workspace; the grid kernel otherwise. The Plan says
  // which.
  const MaskSpec causal{-1, 0, 0}, none{-1, -1, 0}, window{255, 0, 0}, bottom_right{-1, 0, 1};
  // Counted by hand: a causal document of 48 tiles sees (1 + 2 + ... + 48) / 48 on average, one
  // without a mask all 24 of 24; under a window of 256 keys back, tiles 0 and 1 see 1 and 2 key
  // tiles and every later one 3; 100 queries at the end of 6000 keys (bottom-right) see all 47.
  EXPECT_DOUBLE_EQ(policy::fwd_mean_key_tiles(causal, 6144, 6144, 128, 128), 24.5);
  EXPECT_DOUBLE_EQ(policy::fwd_mean_key_tiles(none, 3072, 3072, 128, 128), 24.0);
  EXPECT_DOUBLE_EQ(policy::fwd_mean_key_tiles(window, 32768, 32768, 128, 128), 765.0 / 256);
  EXPECT_DOUBLE_EQ(policy::fwd_mean_key_tiles(bottom_right, 100, 6000, 128, 128), 47.0);
  EXPECT_DOUBLE_EQ(policy::fwd_mean_key_tiles(causal, 100, 100, 128, 128), 1.0);
  EXPECT_DOUBLE_EQ(policy::fwd_mean_key_tiles(causal, 0, 0, 128, 128), 0.0);
  EXPECT_TRUE(policy::fwd_persistent(128, 128, causal, policy::FwdDocs::equal(6144)));
  EXPECT_FALSE(policy::fwd_persistent(128, 128, causal,
                                      policy::FwdDocs::equal(6401)));  // 51 tiles: 26 on average
  EXPECT_FALSE(policy::fwd_persistent(128, 128, causal, policy::FwdDocs::equal(16384)));
  EXPECT_TRUE(policy::fwd_persistent(128, 128, none, policy::FwdDocs::equal(3200)));
  EXPECT_FALSE(policy::fwd_persistent(128, 128, none, policy::FwdDocs::equal(3201)));
  EXPECT_TRUE(policy::fwd_persistent(128, 128, window, policy::FwdDocs::equal(32768)));
  EXPECT_FALSE(policy::fwd_persistent(128, 128, bottom_right, {100, 6000, 100, 6000}));
  // The other head dims' limits, on both sides: D = 64 up to 17 (a causal document of 33 tiles
  // sees 17 on average, one of 34 17.5), 192/128 up to 64.5 (128 tiles), 256 up to 129 in its
  // 64-key tiles (a causal document of 16384 tokens: query tile t sees 2 (t + 1)).
  EXPECT_DOUBLE_EQ(policy::fwd_mean_key_tiles(causal, 16384, 16384, 128, 64), 129.0);
  EXPECT_DOUBLE_EQ(policy::fwd_mean_key_tiles(causal, 33 * 128, 33 * 128, 128, 128), 17.0);
  EXPECT_TRUE(policy::fwd_persistent(64, 64, causal, policy::FwdDocs::equal(33 * 128)));
  EXPECT_FALSE(policy::fwd_persistent(64, 64, causal, policy::FwdDocs::equal(33 * 128 + 1)));
  EXPECT_TRUE(policy::fwd_persistent(192, 128, causal, policy::FwdDocs::equal(16384)));
  EXPECT_FALSE(policy::fwd_persistent(192, 128, causal, policy::FwdDocs::equal(16385)));
  EXPECT_TRUE(policy::fwd_persistent(256, 256, causal, policy::FwdDocs::equal(16384)));
  EXPECT_FALSE(policy::fwd_persistent(256, 256, causal, policy::FwdDocs::equal(16385)));
  EXPECT_TRUE(policy::fwd_persistent(256, 256, none,
                                     policy::FwdDocs::equal(129 * 64)));  // every key: 129 tiles
  EXPECT_FALSE(policy::fwd_persistent(256, 256, none, policy::FwdDocs::equal(129 * 64 + 1)));
  // A pack of documents of different lengths (D = 128): docs_mixed_32k's bounds (32768 tokens
  // in 9 documents, the longest 7198: 29 tiles on average; a document of the mean length, 3641
  // tokens, 14.7) persistent, up to a longest of 7296 (29); past 29 for the longest (7297: 29.5)
  // or 25 for the mean the grid.
  EXPECT_DOUBLE_EQ(policy::fwd_mean_key_tiles(causal, 7198, 7198, 128, 128), 29.0);
  EXPECT_DOUBLE_EQ(policy::fwd_mean_key_tiles(causal, 7553, 7553, 128, 128), 30.5);
  EXPECT_EQ(policy::FwdDocs::of(32768, 32768, 9, 7198, 7198).mean_q, 3641);
  EXPECT_EQ(policy::FwdDocs::of(20000, 20000, 2, 300, 300).mean_q, 300);  // at most the bound
  EXPECT_TRUE(
      policy::fwd_persistent(128, 128, causal, policy::FwdDocs::of(32768, 32768, 9, 7198, 7198)));
  EXPECT_TRUE(
      policy::fwd_persistent(128, 128, causal, policy::FwdDocs::of(32768, 32768, 9, 7296, 7296)));
  EXPECT_FALSE(
      policy::fwd_persistent(128, 128, causal, policy::FwdDocs::of(32768, 32768, 9, 7297, 7297)));
  EXPECT_FALSE(
      policy::fwd_persistent(128, 128, causal, policy::FwdDocs::of(32768, 32768, 9, 7553, 7553)));
  EXPECT_FALSE(policy::fwd_persistent(128, 128, causal, policy::FwdDocs::equal(7168)));  // 28.5
  EXPECT_FALSE(policy::fwd_persistent(128, 128, causal,
                                      policy::FwdDocs::of(2 * 6401, 2 * 6401, 2, 6401, 6401)));
  // One long document among empty segments: the longest decides.
  EXPECT_FALSE(policy::fwd_persistent(128, 128, causal,
                                      policy::FwdDocs::of(16384, 16384, 64, 16384, 16384)));
  // The other head dims: the mean's limit for the longest too, so equal documents' rule.
  EXPECT_TRUE(policy::fwd_persistent(64, 64, causal,
                                     policy::FwdDocs::of(8192, 8192, 4, 33 * 128, 33 * 128)));
  EXPECT_FALSE(policy::fwd_persistent(64, 64, causal,
                                      policy::FwdDocs::of(8192, 8192, 4, 34 * 128, 34 * 128)));
  for (const auto& dims : {std::pair<int, int>{64, 64}, std::pair<int, int>{192, 128},
                           std::pair<int, int>{256, 256}}) {
    EXPECT_TRUE(
        policy::fwd_persistent(dims.first, dims.second, window, policy::FwdDocs::equal(32768)));
  }

  const int sms = fake_hopper_caps().num_sms;
  Problem p = long_problem(RATTN_BACKEND_CUDA_SM90);
  p.batch = 8;  // 20000 tokens in causal documents of at most 6144
  p.max_seqlen_q = p.max_seqlen_kv = 6144;
  Plan plan;
  ASSERT_TRUE(make_plan(p, fake_hopper_caps(), &plan).ok());
  const int64_t items = plan.data().fwd.tiles * p.num_heads_q;
  ASSERT_GT(items, sms);
  EXPECT_EQ(plan.data().fwd.item_ctas, sms);
  EXPECT_THAT(plan.describe(),
              HasSubstr(std::to_string(sms) + " CTAs over " + std::to_string(items) + " items]"));
  EXPECT_EQ(plan.workspace_bytes(Direction::Forward), plan.data().fwd_ws.total);
  EXPECT_GE(plan.data().fwd_ws.work_counter.bytes, sizeof(unsigned long long));
  // Both forward kernels take the query tiles' order from the workspace, apart from the counter.
  EXPECT_EQ(plan.data().fwd_ws.schedule.bytes, size_t(plan.data().fwd.tiles) * sizeof(TileCoord));
  EXPECT_GE(plan.data().fwd_ws.work_counter.offset,
            plan.data().fwd_ws.schedule.offset + plan.data().fwd_ws.schedule.bytes);
  // The persistent kernel's own buffers (two Q tiles, two K/V stages at D = 128).
  EXPECT_EQ(plan.data().fwd.stages, sm90::fwd_config(p.head_dim_qk, p.head_dim_v, true).stages);
  EXPECT_EQ(plan.data().fwd.smem_bytes, sm90::fwd_smem(p.head_dim_qk, p.head_dim_v, true).bytes);
  EXPECT_EQ(sm90::fwd_smem(p.head_dim_qk, p.head_dim_v, true).q_buffers,
            p.head_dim_qk <= 128 ? 2 : 1);

  p.max_seqlen_q = p.max_seqlen_kv = 7553;  // the longest past 29 key tiles (30.5)
  ASSERT_TRUE(make_plan(p, fake_hopper_caps(), &plan).ok());
  EXPECT_EQ(plan.data().fwd.item_ctas, 0);
  EXPECT_EQ(plan.data().fwd.smem_bytes, sm90::fwd_smem(p.head_dim_qk, p.head_dim_v).bytes);
  EXPECT_THAT(plan.describe(), ::testing::Not(HasSubstr("CTAs over")));
  EXPECT_EQ(plan.data().fwd_ws.work_counter.bytes, 0u);  // the grid kernel: the order only
  EXPECT_EQ(plan.workspace_bytes(Direction::Forward), plan.data().fwd_ws.total);
  // The same documents under a window of 256 keys back: short items again.
  p.mask = RATTN_MASK_NONE;
  p.window_left = 255;
  p.window_right = 0;
  ASSERT_TRUE(make_plan(p, fake_hopper_caps(), &plan).ok());
  EXPECT_EQ(plan.data().fwd.item_ctas, sms);
  p.mask = RATTN_MASK_CAUSAL;
  p.window_left = p.window_right = -1;

  // Fewer items than SMs: one CTA each, none idle.
  Problem tiny = p;
  tiny.batch = 1;
  tiny.total_q = tiny.total_kv = tiny.max_seqlen_q = tiny.max_seqlen_kv = 100;
  tiny.num_heads_q = 4;
  tiny.num_heads_kv = 2;
  ASSERT_TRUE(make_plan(tiny, fake_hopper_caps(), &plan).ok());
  EXPECT_EQ(plan.data().fwd.item_ctas, plan.data().fwd.tiles * 4);
  EXPECT_LT(plan.data().fwd.item_ctas, sms);
}

TEST(PlanPath, HeadDim64TakesTheHopperKernels) {
  if (!kBuiltWithSm90) GTEST_SKIP() << "build without the Hopper kernels";
  // The Hopper path runs its wgmma kernel in each direction it has one for the head dims (the
  // portable kernel in the other, which no head dim needs today), and says so.
  for (rattn_backend b : {RATTN_BACKEND_AUTO, RATTN_BACKEND_CUDA, RATTN_BACKEND_CUDA_SM90}) {
    Problem d64 = long_problem(b);
    d64.head_dim_qk = d64.head_dim_v = 64;
    Plan plan;
    ASSERT_TRUE(make_plan(d64, fake_hopper_caps(), &plan).ok());
    EXPECT_EQ(plan.path(), Path::CudaSm90);
    EXPECT_EQ(plan.data().fwd.family, KernelFamily::Wgmma);
    EXPECT_EQ(plan.data().bwd.family, KernelFamily::Wgmma);
    EXPECT_THAT(plan.describe(), HasSubstr("fwd[wgmma "));
    EXPECT_THAT(plan.describe(), HasSubstr(sm90_bwd_shape()));
  }
}

void expect_consistent_workspace(const Plan& plan);  // below, with the workspace tests

TEST(PlanPath, HeadDims256And192TakeBothHopperKernels) {
  if (!kBuiltWithSm90) GTEST_SKIP() << "build without the Hopper kernels";
  // D = 256 and Dqk 192 / Dv 128: the Hopper forward and backward, whose shared memory fits the
  // device: the column-split backward at 256 (64 keys per CTA; with a 16-bit dQ scratch outside
  // deterministic mode dQ from registers and two Q/dO stages, otherwise dQ through the
  // shared-memory tile and one stage), the key split at 192/128 (128 keys, 64 per consumer; two
  // Q/dO stages beside one dS^T buffer, dQ through the tile always).
  for (rattn_backend b : {RATTN_BACKEND_AUTO, RATTN_BACKEND_CUDA, RATTN_BACKEND_CUDA_SM90}) {
    for (const auto& dims : {std::pair<int, int>{256, 256}, std::pair<int, int>{192, 128}}) {
      for (int mode = 0; mode < 4; ++mode) {
        const bool deterministic = mode & 1, fp32_dq = mode & 2;
        const bool d256 = dims.first == 256;
        Problem p = long_problem(b);
        p.head_dim_qk = dims.first;
        p.head_dim_v = dims.second;
        p.deterministic = deterministic;
        p.dq_accum = fp32_dq ? RATTN_DQ_ACCUM_FP32 : RATTN_DQ_ACCUM_BF16;
        Plan plan;
        ASSERT_TRUE(make_plan(p, fake_hopper_caps(), &plan).ok());
        SCOPED_TRACE(plan.describe());
        const bool dq_regs = d256 && !deterministic && !fp32_dq;
        EXPECT_EQ(policy::bwd_dq_from_registers(dims.first, dims.second, deterministic, fp32_dq),
                  dq_regs);
        const sm90::BwdConfig c = sm90::bwd_config(dims.first, dims.second, dq_regs);
        EXPECT_EQ(plan.path(), Path::CudaSm90);
        EXPECT_EQ(plan.data().fwd.family, KernelFamily::Wgmma);
        EXPECT_EQ(plan.data().bwd.family, KernelFamily::Wgmma);
        EXPECT_EQ(sm90::bwd_column_split(dims.first, dims.second), d256);
        EXPECT_EQ(sm90::bwd_scores_in_turn(dims.first, dims.second), !d256);
        EXPECT_EQ(plan.data().bwd.block_n, d256 ? 64 : 128);
        EXPECT_EQ(plan.data().bwd.dq_staged, !dq_regs);
        EXPECT_EQ(plan.data().bwd.stages, c.stages);
        EXPECT_EQ(c.stages, d256 && !dq_regs ? 1 : 2);
        EXPECT_EQ(plan.data().bwd.smem_bytes,
                  sm90::bwd_smem(dims.first, dims.second, dq_regs).bytes);
        EXPECT_EQ(sm90::bwd_smem(dims.first, dims.second, dq_regs).ds_buffers, d256 ? 2 : 1);
        EXPECT_LE(plan.data().bwd.smem_bytes, size_t(fake_hopper_caps().smem_per_block_optin));
        EXPECT_THAT(plan.describe(),
                    HasSubstr(d256 ? "fwd[wgmma 128x64 384thr" : "fwd[wgmma 128x128 384thr"));
        EXPECT_THAT(plan.describe(),
                    HasSubstr(d256 ? "bwd[wgmma 64x64 384thr" : "bwd[wgmma 64x128 384thr"));
        EXPECT_EQ(plan.describe().find("dQ staged") != std::string::npos, !dq_regs);
        EXPECT_EQ(plan.describe().find("dQ from registers") != std::string::npos, dq_regs);
        // Claimed dQ tiles wherever warp 1 adds them outside deterministic mode.
        EXPECT_EQ(plan.data().bwd_ws.dq_claims.bytes != 0, !dq_regs && !deterministic);
        expect_consistent_workspace(plan);
      }
    }
  }
}

TEST(PlanPath, HopperBackwardColumnsCoverEachTensorOnce) {
  // bwd_columns: per consumer, the columns of dK, dV and dQ it owns. Under the key split both own
  // all of dK and dV (their own keys); under the column split (D = 256) the two cover each tensor
  // once.
  for (const auto& dims : {std::pair<int, int>{64, 64}, std::pair<int, int>{128, 128},
                           std::pair<int, int>{256, 256}, std::pair<int, int>{192, 128}}) {
    const int dqk = dims.first, dv = dims.second;
    const sm90::BwdColumns a = sm90::bwd_columns(dqk, dv, 0), b = sm90::bwd_columns(dqk, dv, 1);
    EXPECT_EQ(a.dq0, 0);
    EXPECT_EQ(b.dq0, a.dqn);
    EXPECT_EQ(a.dqn + b.dqn, dqk);
    if (sm90::bwd_column_split(dqk, dv)) {
      EXPECT_EQ(a.dkn + b.dkn, dqk);
      EXPECT_EQ(b.dk0, a.dkn);
      EXPECT_EQ(a.dvn + b.dvn, dv);
      EXPECT_EQ(b.dv0, a.dvn);
    } else {
      EXPECT_EQ(a.dkn, dqk);
      EXPECT_EQ(b.dkn, dqk);
      EXPECT_EQ(a.dvn, dv);
      EXPECT_EQ(b.dvn, dv);
    }
    // Scores in turn only where the key split's accumulators exceed D = 128's (192/128).
    EXPECT_EQ(sm90::bwd_scores_in_turn(dqk, dv), dqk == 192);
    // The same widths per consumer: the kernel instantiates one consumer loop.
    EXPECT_EQ(a.dkn, b.dkn);
    EXPECT_EQ(a.dvn, b.dvn);
    EXPECT_EQ(a.dqn, b.dqn);
  }
}

// The grids' inner heads (LaunchShape::inner_heads): the Hopper forward's grid kernel launches a
// query tile's GQA group as consecutive CTAs, the Hopper backward outside deterministic mode one
// CTA per entry of its schedule (every KV head of every key tile), the portable kernels and the
// persistent forward none. The forward's grid covers every (tile, head) once through the slots
// the kernel reads.
void expect_slots_cover_once(const LaunchShape& shape, int heads) {
  const LaunchShape::Grid g = shape.grid(heads);
  const int n = shape.inner_heads;
  ASSERT_GT(n, 0);
  EXPECT_EQ(g.x, shape.tiles * n);
  EXPECT_EQ(g.y, heads / n);
  std::vector<int> seen(size_t(shape.tiles * heads), 0);
  for (int64_t y = 0; y < g.y; ++y) {
    for (int64_t x = 0; x < g.x; ++x) {
      const GridSlot s = grid_slot(uint32_t(x), uint32_t(y), uint32_t(n));
      ASSERT_GE(s.tile, 0);
      ASSERT_LT(s.tile, shape.tiles);
      ASSERT_GE(s.head, 0);
      ASSERT_LT(s.head, heads);
      EXPECT_EQ(s.tile, x / n);  // a tile's n heads are consecutive CTAs
      EXPECT_EQ(s.head / n, y);
      ++seen[size_t(s.tile * heads + s.head)];
    }
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
}

TEST(PlanPath, GridsLaunchTheirInnerHeadsTogether) {
  if (!kBuiltWithSm90) GTEST_SKIP() << "build without the Hopper kernels";
  Problem p = long_problem(RATTN_BACKEND_CUDA_SM90);
  p.num_heads_q = 12;
  p.num_heads_kv = 3;
  Plan plan;
  ASSERT_TRUE(make_plan(p, fake_hopper_caps(), &plan).ok());
  ASSERT_EQ(plan.data().fwd.item_ctas, 0);  // 16k-token documents: the grid forward
  EXPECT_EQ(plan.data().fwd.inner_heads, p.num_heads_q / p.num_heads_kv);
  expect_slots_cover_once(plan.data().fwd, p.num_heads_q);
  // The backward: its grid is its schedule's entries, one HeadTile per (key tile, KV head).
  const LaunchShape& bwd = plan.data().bwd;
  EXPECT_EQ(bwd.inner_heads, p.num_heads_kv);
  EXPECT_EQ(bwd.grid(p.num_heads_kv).x, bwd.tiles * p.num_heads_kv);
  EXPECT_EQ(bwd.grid(p.num_heads_kv).y, 1);
  EXPECT_EQ(plan.data().bwd_ws.schedule.bytes,
            size_t(bwd.tiles * p.num_heads_kv) * sizeof(HeadTile));
  EXPECT_GT(plan.data().bwd_ws.interleave_rows, 0);
  EXPECT_NE(plan.describe().find(
                str_cat(", heads interleaved to ", plan.data().bwd_ws.interleave_rows, " rows]")),
            std::string::npos)
      << plan.describe();
  Problem det = p;  // deterministic: no schedule, grid (tiles, KV heads) in tile-map order
  det.deterministic = 1;
  Plan det_plan;
  ASSERT_TRUE(make_plan(det, fake_hopper_caps(), &det_plan).ok());
  EXPECT_EQ(det_plan.data().bwd.inner_heads, 0);
  EXPECT_EQ(det_plan.data().bwd_ws.schedule.bytes, 0u);
  EXPECT_EQ(det_plan.data().bwd.grid(p.num_heads_kv).y, p.num_heads_kv);
  EXPECT_EQ(det_plan.describe().find("interleaved"), std::string::npos);
  Plan portable;
  ASSERT_TRUE(
      make_plan(long_problem(RATTN_BACKEND_CUDA_PORTABLE), fake_hopper_caps(), &portable).ok());
  for (const LaunchShape* s : {&portable.data().fwd, &portable.data().bwd}) {
    EXPECT_EQ(s->inner_heads, 0);
    EXPECT_EQ(s->grid(2).x, s->tiles);
    EXPECT_EQ(s->grid(2).y, 2);
  }
  Problem short_docs = p;  // the persistent forward: one CTA per SM
  short_docs.max_seqlen_q = short_docs.max_seqlen_kv = 300;
  ASSERT_TRUE(make_plan(short_docs, fake_hopper_caps(), &plan).ok());
  ASSERT_GT(plan.data().fwd.item_ctas, 0);
  EXPECT_EQ(plan.data().fwd.inner_heads, 0);
  EXPECT_EQ(plan.data().fwd.grid(p.num_heads_q).y, 1);
}

// The backward schedule's positions (schedule_slot): a segment's K key tiles at sorted positions
// [first, first + K) give its CTAs [first * heads, (first + K) * heads), each once, interleaved
// (a tile's heads consecutive) or head by head (a head's tiles consecutive, in tile order).
TEST(PlanPath, ScheduleSlots) {
  for (bool interleaved : {true, false}) {
    for (int heads : {1, 3, 8}) {
      for (int K : {1, 2, 7}) {
        const int64_t first = 5;
        std::vector<int> seen(size_t(K * heads), 0);
        for (int k = 0; k < K; ++k) {
          for (int h = 0; h < heads; ++h) {
            const int64_t s = schedule_slot(first, k, K, h, heads, interleaved);
            ASSERT_GE(s, first * heads);
            ASSERT_LT(s, (first + K) * heads);
            ++seen[size_t(s - first * heads)];
            EXPECT_EQ(s - first * heads, interleaved ? k * heads + h : h * K + k);
          }
        }
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
      }
    }
  }
}

// The longest segment the backward's schedule interleaves: its rows of every query head (Q, dO,
// the dQ scratch's, LSE and dot) within the L2's share; twice the heads, half the rows.
TEST(PlanPath, ScheduleInterleavesSegmentsWhoseRowsFitTheL2) {
  const int64_t l2 = 60 << 20;
  const int64_t rows = policy::bwd_interleave_rows(l2, 32, 128, 128, 4);
  EXPECT_EQ(rows, l2 / policy::kBwdInterleaveL2Share / (32 * (256 + 256 + 512 + 8)));
  EXPECT_EQ(policy::bwd_interleave_rows(l2, 64, 128, 128, 4), rows / 2);
  EXPECT_GT(policy::bwd_interleave_rows(l2, 32, 128, 128, 2), rows);  // the 16-bit scratch
  EXPECT_EQ(policy::bwd_interleave_rows(0, 32, 128, 128, 4), 0);      // L2 unknown: head by head
}

// More heads than a grid's y dimension takes (65535): an error naming the grid, not a launch
// that fails.
TEST(PlanPath, GridBeyondCudaLimitsIsAnError) {
  if (!kBuiltWithCuda) GTEST_SKIP() << "CPU-only build";
  Problem p = small_problem(RATTN_BACKEND_CUDA_PORTABLE);
  p.num_heads_q = p.num_heads_kv = 70000;
  Plan plan;
  const Status s = make_plan(p, fake_hopper_caps(), &plan);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("kernel's grid would be ("));
  EXPECT_THAT(s.message(), HasSubstr("num_heads_q=70000"));
  EXPECT_THAT(s.message(), HasSubstr("at most (2147483647, 65535)"));
  p.num_heads_q = p.num_heads_kv = 60000;  // within the limits
  EXPECT_TRUE(make_plan(p, fake_hopper_caps(), &plan).ok());
}

TEST(PlanPath, ForcedHopperPathSaysWhyNot) {
  if (!kBuiltWithCuda) GTEST_SKIP() << "CPU-only build";
  Problem d96 = small_problem(RATTN_BACKEND_CUDA_SM90);
  d96.head_dim_qk = d96.head_dim_v = 96;
  Plan plan;
  Status s = make_plan(d96, fake_hopper_caps(), &plan);
  EXPECT_EQ(s.code(), RATTN_ERROR_NOT_SUPPORTED);
  EXPECT_THAT(s.message(), HasSubstr("cuda_sm90"));
  EXPECT_THAT(s.message(), HasSubstr("available: cuda_portable, cpu"));
  if (kBuiltWithSm90) {
    EXPECT_THAT(s.message(), HasSubstr("given head_dim_qk=96, head_dim_v=96"));
    s = make_plan(small_problem(RATTN_BACKEND_CUDA_SM90), fake_ampere_caps(), &plan);
    EXPECT_EQ(s.code(), RATTN_ERROR_NOT_SUPPORTED);
    EXPECT_THAT(s.message(), HasSubstr("compute capability 8.0"));
    Problem fp32 = small_problem(RATTN_BACKEND_CUDA_SM90);
    fp32.dtype = RATTN_DTYPE_FP32;
    s = make_plan(fp32, fake_hopper_caps(), &plan);
    EXPECT_EQ(s.code(), RATTN_ERROR_NOT_SUPPORTED);
    EXPECT_THAT(s.message(), HasSubstr("bf16 or fp16"));
  } else {
    EXPECT_THAT(s.message(), HasSubstr("not part of this build"));
  }
}

TEST(PlanPath, ComputeCapability75IsRejected) {
  DeviceCaps turing = fake_hopper_caps();
  turing.cc_major = 7;
  turing.cc_minor = 5;
  for (rattn_backend b : {RATTN_BACKEND_CUDA, RATTN_BACKEND_CUDA_PORTABLE, RATTN_BACKEND_AUTO}) {
    Plan plan;
    const Status s = make_plan(small_problem(b), turing, &plan);
    if (!kBuiltWithCuda) {
      if (b == RATTN_BACKEND_AUTO) {
        EXPECT_TRUE(s.ok());  // auto in a CPU-only build means cpu
        continue;
      }
      EXPECT_EQ(s.code(), RATTN_ERROR_NOT_SUPPORTED);
      EXPECT_THAT(s.message(), HasSubstr("no CUDA backend"));
      continue;
    }
    // auto too: falling back to cpu would hand device pointers to a host backend.
    EXPECT_EQ(s.code(), RATTN_ERROR_NOT_SUPPORTED) << "backend " << int(b);
    EXPECT_THAT(s.message(), HasSubstr("compute capability 7.5"));
    EXPECT_THAT(s.message(), HasSubstr("8.0 or newer"));
  }
}

TEST(PlanPath, CudaSm90IsChosenWhenAskedForOrSaysWhatIs) {
  Plan plan;
  const Status s = make_plan(small_problem(RATTN_BACKEND_CUDA_SM90), fake_hopper_caps(), &plan);
  if (kBuiltWithSm90) {
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(plan.path(), Path::CudaSm90);
    return;
  }
  EXPECT_EQ(s.code(), RATTN_ERROR_NOT_SUPPORTED);
  EXPECT_THAT(s.message(), HasSubstr("cuda_sm90"));
  EXPECT_THAT(s.message(), HasSubstr("available:"));
  EXPECT_THAT(s.message(), HasSubstr("cpu"));
}

TEST(PlanPath, InvalidBackendValue) {
  Plan plan;
  const Status s = make_plan(small_problem(static_cast<rattn_backend>(9)), cpu_caps(), &plan);
  EXPECT_EQ(s.code(), RATTN_ERROR_INVALID_VALUE);
  EXPECT_THAT(s.message(), HasSubstr("backend=9"));
}

// Sizing and addressing come from one PlanData.
void expect_consistent_workspace(const Plan& plan) {
  const PlanData& d = plan.data();
  const BwdWorkspace& ws = d.bwd_ws;
  EXPECT_EQ(plan.workspace_bytes(Direction::Backward), ws.total);
  EXPECT_EQ(plan.workspace_bytes(Direction::Forward), d.fwd_ws.total);
  EXPECT_EQ(ws.dq_accum_region.bytes, size_t(ws.dq_accum.bytes()));
  if (d.path == Path::Cpu) {
    EXPECT_EQ(ws.total, 0u) << "the reference backend needs no scratch";
  } else {
    EXPECT_EQ(ws.dpsum.bytes, size_t(d.problem.num_heads_q) * size_t(d.problem.total_q) * 4);
  }
  std::vector<Region> regions = {ws.dq_accum_region, ws.dpsum};
  if (d.problem.deterministic) {
    // One lock per (query tile of the path's backward kernel, query head).
    EXPECT_EQ(ws.locks.bytes,
              size_t(RaggedTiles::bound(d.problem.total_q, d.problem.batch, d.bwd.block_m)) *
                  size_t(d.problem.num_heads_q) * sizeof(int32_t));
    regions.push_back(ws.locks);
  }
  // The Hopper backward's order: one HeadTile per (key tile, KV head), the CTAs of its grid,
  // outside deterministic mode only (its turns need each segment's tiles in order); no other path
  // has one.
  const bool schedule = d.bwd.family == KernelFamily::Wgmma && !d.problem.deterministic;
  EXPECT_EQ(ws.schedule.bytes,
            schedule ? size_t(d.bwd.tiles * d.problem.num_heads_kv) * sizeof(HeadTile) : 0u);
  if (schedule) {
    const LaunchShape::Grid g = d.bwd.grid(d.problem.num_heads_kv);
    EXPECT_EQ(size_t(g.x * g.y) * sizeof(HeadTile), ws.schedule.bytes);
  }
  if (schedule) regions.push_back(ws.schedule);
  // The Hopper backward's claims on the scratch's dQ tiles: one int32 per 64-row tile of the
  // scratch (DqAccumLayout::tiles), in 16-byte words, wherever producer warp 1 adds the tiles
  // outside deterministic mode (policy::bwd_dq_claimed); the scratch is then never zeroed. No other
  // path has claims.
  const bool claimed =
      d.bwd.family == KernelFamily::Wgmma &&
      policy::bwd_dq_claimed(d.problem.head_dim_qk, !d.bwd.dq_staged, d.problem.deterministic != 0);
  EXPECT_EQ(ws.dq_claims.bytes,
            claimed ? size_t((ws.dq_accum.tiles() * 4 + 15) / 16 * 16) : size_t(0));
  EXPECT_EQ(plan.describe().find("claimed") != std::string::npos, claimed);
  // What dot(dO, O) zeroes: the claims, or the scratch where there are none.
  EXPECT_EQ(&ws.cleared(), claimed ? &ws.dq_claims : &ws.dq_accum_region);
  if (claimed) {
    EXPECT_EQ(ws.dq_accum.order, DqTileOrder::Wgmma64);
    EXPECT_EQ(ws.dq_accum.nsplits, 1);
    EXPECT_EQ(ws.dq_accum.elements() % ws.dq_accum.tile_elems(), 0);
    regions.push_back(ws.dq_claims);
  }
  std::sort(regions.begin(), regions.end(),
            [](const Region& a, const Region& b) { return a.offset < b.offset; });
  for (size_t i = 0; i < regions.size(); ++i) {
    EXPECT_EQ(regions[i].offset % 16, 0u) << "region " << i << " misaligned";
    EXPECT_LE(regions[i].offset + regions[i].bytes, ws.total) << "region " << i << " past total";
    if (i + 1 < regions.size()) {
      EXPECT_LE(regions[i].offset + regions[i].bytes, regions[i + 1].offset)
          << "regions " << i << " and " << i + 1 << " overlap";
    }
  }
  // The C API reports the same number.
  rattn_plan* cplan = nullptr;
  ASSERT_EQ(rattn_plan_create(&d.problem, &d.caps, &cplan), RATTN_SUCCESS) << rattn_last_error();
  size_t bytes = 0;
  EXPECT_EQ(rattn_plan_workspace_size(cplan, RATTN_BACKWARD, &bytes), RATTN_SUCCESS);
  EXPECT_EQ(bytes, ws.total);
  rattn_plan_destroy(cplan);
}

TEST(PlanWorkspace, OnePlanGivesSizeAndLayout) {
  if (!kBuiltWithCuda) {
    // The CPU path has no scratch; its numbers still come from the one PlanData.
    Plan plan;
    ASSERT_TRUE(make_plan(small_problem(RATTN_BACKEND_CPU), cpu_caps(), &plan).ok());
    expect_consistent_workspace(plan);
    GTEST_SKIP() << "CPU-only build: no CUDA plan, so no dQ scratch to size";
  }
  // Every CUDA path of the build: each sizes the one scratch layout from its own backward shape.
  std::vector<rattn_backend> backends{RATTN_BACKEND_CUDA_PORTABLE};
  if (path_in_build(Path::CudaSm90)) backends.push_back(RATTN_BACKEND_CUDA_SM90);
  for (rattn_backend backend : backends) {
    for (bool det : {false, true}) {
      for (rattn_dq_accum accum : {RATTN_DQ_ACCUM_FP32, RATTN_DQ_ACCUM_BF16}) {
        Problem p = small_problem(backend);
        p.deterministic = det;
        p.dq_accum = accum;
        Plan plan;
        const Status s = make_plan(p, fake_hopper_caps(), &plan);
        ASSERT_TRUE(s.ok()) << s.message();
        SCOPED_TRACE(plan.describe());
        expect_consistent_workspace(plan);
      }
    }
  }
}

TEST(PlanWorkspace, DqAccumModeChangesTheLayoutInTheObjectTheSizeCameFrom) {
  if (!kBuiltWithCuda) GTEST_SKIP() << "CPU-only build: no CUDA plan, so no dQ scratch";
  Problem p = small_problem(RATTN_BACKEND_CUDA_PORTABLE);
  Plan f32, b16;
  ASSERT_TRUE(make_plan(p, fake_hopper_caps(), &f32).ok());
  p.dq_accum = RATTN_DQ_ACCUM_BF16;
  ASSERT_TRUE(make_plan(p, fake_hopper_caps(), &b16).ok());
  const BwdWorkspace& a = f32.data().bwd_ws;
  const BwdWorkspace& b = b16.data().bwd_ws;
  EXPECT_EQ(a.dq_accum.type, AccumType::F32);
  EXPECT_EQ(b.dq_accum.type, AccumType::BF16);
  // Same slots, half the bytes; and each plan's size is its own layout's.
  EXPECT_EQ(a.dq_accum.rows, b.dq_accum.rows);
  EXPECT_EQ(a.dq_accum.bytes(), 2 * b.dq_accum.bytes());
  EXPECT_EQ(f32.workspace_bytes(Direction::Backward), a.total);
  EXPECT_EQ(b16.workspace_bytes(Direction::Backward), b.total);
  EXPECT_LT(b.total, a.total);
  EXPECT_THAT(b16.describe(), HasSubstr("dq_accum=bf16"));
  // fp16 data accumulates in fp16: bf16's shorter mantissa would lose to a plain fp16 computation.
  p.dtype = RATTN_DTYPE_FP16;
  Plan h16;
  ASSERT_TRUE(make_plan(p, fake_hopper_caps(), &h16).ok());
  EXPECT_EQ(h16.data().bwd_ws.dq_accum.type, AccumType::F16);
  EXPECT_EQ(h16.data().bwd_ws.dq_accum.bytes(), b.dq_accum.bytes());
  // The library's answer, for code outside it (the verification), agrees with the layout.
  EXPECT_EQ(f32.dq_accum_dtype(), RATTN_DTYPE_FP32);
  EXPECT_EQ(b16.dq_accum_dtype(), RATTN_DTYPE_BF16);
  EXPECT_EQ(h16.dq_accum_dtype(), RATTN_DTYPE_FP16);
}

TEST(PlanWorkspace, CompactScratchIsNotBatchTimesMaxSeqlen) {
  // DESIGN.md: one 100k-token document beside a thousand short ones must not cost B x max_seqlen
  // rows of scratch.
  if (!kBuiltWithCuda) GTEST_SKIP() << "CPU-only build: no CUDA plan, so no dQ scratch";
  Problem p = small_problem(RATTN_BACKEND_CUDA_PORTABLE);
  p.batch = 1001;
  p.total_q = p.total_kv = 100000 + 1000 * 37;
  p.max_seqlen_q = p.max_seqlen_kv = 100000;
  p.num_heads_q = 4;
  p.num_heads_kv = 4;
  Plan plan;
  ASSERT_TRUE(make_plan(p, fake_hopper_caps(), &plan).ok());
  const DqAccumLayout& l = plan.data().bwd_ws.dq_accum;
  EXPECT_LE(l.rows, p.total_q + 16 * int64_t(p.batch) + 16);
  EXPECT_LT(l.elements(), int64_t(p.batch) * p.max_seqlen_q * p.num_heads_q * p.head_dim_qk / 100);
}

}  // namespace
}  // namespace raggedattn

namespace raggedattn {
namespace {

// LSE is read and written one fp32 at a time: a view into a larger LSE buffer (4-byte aligned)
// is accepted, a pointer that is not fp32-aligned is not; the tensors keep their 16-byte rule.
TEST(CallChecks, LseNeedsFloatAlignmentOnly) {
  Problem p = default_problem();
  p.batch = 1;
  p.total_q = p.total_kv = 4;
  p.max_seqlen_q = p.max_seqlen_kv = 4;
  p.num_heads_q = p.num_heads_kv = 1;
  p.head_dim_qk = p.head_dim_v = 64;
  p.backend = RATTN_BACKEND_CPU;
  Plan plan;
  ASSERT_TRUE(make_plan(p, cpu_caps(), &plan).ok());
  alignas(16) static uint16_t q[4 * 64], k[4 * 64], v[4 * 64], o[4 * 64];
  alignas(16) static float lse[8];
  const int32_t cu[2] = {0, 4};
  FwdTensors t{q, k, v, o, lse + 1, cu, cu, nullptr, nullptr, nullptr};
  for (int i = 0; i < 4 * 64; ++i) q[i] = k[i] = v[i] = 0x3f80;  // bf16 1.0
  Status s = forward(plan, t, nullptr, 0);
  EXPECT_TRUE(s.ok()) << s.message();
  t.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(lse) + 2);
  s = forward(plan, t, nullptr, 0);
  EXPECT_EQ(s.code(), RATTN_ERROR_INVALID_VALUE);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("lse="));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("is not 4-byte aligned"));
  t.lse = lse;
  t.o = reinterpret_cast<uint16_t*>(o) + 4;  // 8 bytes off: tensors still need 16
  s = forward(plan, t, nullptr, 0);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("is not 16-byte aligned"));
}

}  // namespace
}  // namespace raggedattn

namespace raggedattn {
namespace {

// The library answers whether it has CUDA backends the way it was configured (RATTN_WITH_CUDA is
// a public definition of the target), in both APIs.
TEST(BuildInfo, BuiltWithCudaMatchesTheConfiguration) {
#ifdef RATTN_WITH_CUDA
  EXPECT_TRUE(built_with_cuda());
  EXPECT_EQ(rattn_built_with_cuda(), 1);
#else
  EXPECT_FALSE(built_with_cuda());
  EXPECT_EQ(rattn_built_with_cuda(), 0);
#endif
  EXPECT_TRUE(path_in_build(Path::Cpu));
  EXPECT_EQ(path_in_build(Path::CudaPortable), built_with_cuda());
#ifdef RATTN_WITH_SM90
  EXPECT_TRUE(path_in_build(Path::CudaSm90));
#else
  EXPECT_FALSE(path_in_build(Path::CudaSm90));
#endif
}

}  // namespace
}  // namespace raggedattn

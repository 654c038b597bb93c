// Bad inputs through the C API and the C++ API: each is rejected with a non-zero status and a
// message naming what was wrong, nothing crashes, and no output is written.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "plan/policy.hpp"
#include "raggedattn/raggedattn.h"
#include "raggedattn/raggedattn.hpp"
#include "test_util.hpp"
#include "verify/verify.hpp"

namespace raggedattn {
namespace {

using ::testing::HasSubstr;
using testing_util::kBuiltWithCuda;

constexpr uint8_t kSentinel = 0xA7;

struct Result {
  rattn_status code;
  std::string message;
};

// A small valid problem (bf16, two segments, GQA) on the CPU path, with its tensors.
struct Call {
  std::vector<int32_t> lens = {10, 7};
  verify::CaseSpec spec;
  verify::PackLayout layout;
  verify::HostInputs in;
  verify::HostOutputs out;
  std::vector<int32_t> cu_q, cu_kv;
  // For the calls of a problem given sinks: one per query head, and d_sink (an output).
  std::vector<float> sink = {0.5f, -0.25f}, d_sink = std::vector<float>(2);

  Call() {
    spec.name = "bad_inputs";
    spec.seqlens_q = lens;
    spec.hq = 2;
    spec.hkv = 1;
    spec.dqk = spec.dv = 64;
    spec.mask = RATTN_MASK_CAUSAL;
    spec.backend = RATTN_BACKEND_CPU;
    layout = verify::make_layout(spec, 5);
    in = verify::make_inputs(spec, layout, 5);
    out = verify::make_outputs(spec, layout, spec.dtype);
    for (verify::HostTensor* t : {&out.o, &out.lse, &out.dq, &out.dk, &out.dv}) {
      t->fill_bytes(kSentinel);
    }
    cu_q = layout.cu_q;
    cu_kv = layout.cu_kv;
    std::memset(d_sink.data(), kSentinel, d_sink.size() * sizeof(float));
  }
  Problem problem() const { return verify::make_problem(spec, layout); }

  FwdTensors fwd() {
    FwdTensors f{};
    f.q = in.q.data();
    f.k = in.k.data();
    f.v = in.v.data();
    f.o = out.o.data();
    f.lse = static_cast<float*>(out.lse.data());
    f.cu_seqlens_q = cu_q.data();
    f.cu_seqlens_kv = cu_kv.data();
    return f;
  }
  BwdTensors bwd() {
    BwdTensors b{};
    b.q = in.q.data();
    b.k = in.k.data();
    b.v = in.v.data();
    b.o = in.q.data();  // any valid data: the call must be rejected before reading it
    b.d_o = in.d_o.data();
    b.lse = static_cast<const float*>(out.lse.data());
    b.dq = out.dq.data();
    b.dk = out.dk.data();
    b.dv = out.dv.data();
    b.cu_seqlens_q = cu_q.data();
    b.cu_seqlens_kv = cu_kv.data();
    return b;
  }
  // Every output still holds the sentinel.
  void expect_outputs_untouched() const {
    for (const verify::HostTensor* t : {&out.o, &out.lse, &out.dq, &out.dk, &out.dv}) {
      const auto* p = static_cast<const uint8_t*>(t->data());
      size_t changed = 0;
      for (size_t i = 0; i < t->bytes(); ++i) changed += p[i] != kSentinel;
      EXPECT_EQ(changed, 0u) << "a rejected call wrote " << changed << " output bytes";
    }
    const auto* p = reinterpret_cast<const uint8_t*>(d_sink.data());
    size_t changed = 0;
    for (size_t i = 0; i < d_sink.size() * sizeof(float); ++i) changed += p[i] != kSentinel;
    EXPECT_EQ(changed, 0u) << "a rejected call wrote " << changed << " bytes of d_sink";
  }
};

// make_plan through both APIs; both must fail the same way, leaving their plan outputs alone.
std::vector<Result> plan_both(const Problem& p, const DeviceCaps& caps) {
  std::vector<Result> r;
  rattn_plan* cplan = reinterpret_cast<rattn_plan*>(uintptr_t(0x1));
  const rattn_status s = rattn_plan_create(&p, &caps, &cplan);
  EXPECT_EQ(cplan, s == RATTN_SUCCESS ? cplan : nullptr)
      << "a failed create must not hand out a plan";
  if (s == RATTN_SUCCESS) rattn_plan_destroy(cplan);
  r.push_back({s, rattn_last_error()});

  // C++: a failed make_plan leaves the caller's Plan as it was.
  Plan before;
  Call ok;
  EXPECT_TRUE(make_plan(ok.problem(), cpu_caps(), &before).ok());
  Plan plan = before;
  const Status st = make_plan(p, caps, &plan);
  if (!st.ok()) {
    EXPECT_EQ(&plan.data(), &before.data());
  }
  r.push_back({st.code(), st.message()});
  return r;
}

void expect_rejected(const std::vector<Result>& results, rattn_status code,
                     const std::vector<std::string>& keywords) {
  for (size_t i = 0; i < results.size(); ++i) {
    const char* api = i == 0 ? "C API" : "C++ API";
    EXPECT_EQ(results[i].code, code) << api << ": " << results[i].message;
    for (const std::string& k : keywords) EXPECT_THAT(results[i].message, HasSubstr(k)) << api;
  }
}

using Mutate = std::function<void(Problem*)>;

std::vector<Result> plan_with(const Mutate& m, const DeviceCaps& caps = cpu_caps()) {
  Call s;
  Problem p = s.problem();
  m(&p);
  return plan_both(p, caps);
}

TEST(BadInputs, UnsupportedHeadDim) {
  expect_rejected(plan_with([](Problem* p) { p->head_dim_qk = p->head_dim_v = 80; }),
                  RATTN_ERROR_NOT_SUPPORTED, {"head_dim_qk=80", "supported", "{64, 96, 128"});
  expect_rejected(plan_with([](Problem* p) { p->head_dim_v = 96; }), RATTN_ERROR_NOT_SUPPORTED,
                  {"head_dim_v=96", "192 with head_dim_v = 128"});
}

TEST(BadInputs, HeadsNotAMultiple) {
  expect_rejected(plan_with([](Problem* p) {
                    p->num_heads_q = 6;
                    p->num_heads_kv = 4;
                  }),
                  RATTN_ERROR_INVALID_VALUE, {"num_heads_q=6", "num_heads_kv=4", "multiple"});
}

TEST(BadInputs, BatchZero) {
  expect_rejected(plan_with([](Problem* p) { p->batch = 0; }), RATTN_ERROR_INVALID_VALUE,
                  {"batch=0", "at least one segment"});
}

TEST(BadInputs, MisalignedStrides) {
  // 36 bf16 elements = 72 bytes: not a multiple of 16.
  expect_rejected(plan_with([](Problem* p) {
                    p->q.token = 36 * 4;
                    p->q.head = 36;
                  }),
                  RATTN_ERROR_INVALID_VALUE, {"q strides", "multiples of 16 bytes"});
}

TEST(BadInputs, NegativeWindow) {
  expect_rejected(plan_with([](Problem* p) { p->window_left = -2; }), RATTN_ERROR_INVALID_VALUE,
                  {"window=(-2", "-1 (unbounded) or >= 0"});
}

TEST(BadInputs, NegativeOrNonFiniteSoftmaxScale) {
  // A negative scale was once read as "the default": now it is an error that says so.
  expect_rejected(plan_with([](Problem* p) { p->softmax_scale = -0.125f; }),
                  RATTN_ERROR_INVALID_VALUE, {"softmax_scale=-0.125", "0 for 1/sqrt(head_dim_qk)"});
  expect_rejected(plan_with([](Problem* p) { p->softmax_scale = INFINITY; }),
                  RATTN_ERROR_INVALID_VALUE, {"softmax_scale=inf", "finite positive"});
  // 0 means the default, a positive value is taken as given.
  Plan plan;
  Call s;
  Problem p = s.problem();
  p.softmax_scale = 0.f;
  ASSERT_TRUE(make_plan(p, cpu_caps(), &plan).ok());
  EXPECT_FLOAT_EQ(plan.problem().softmax_scale, 1.0f / std::sqrt(float(p.head_dim_qk)));
  p.softmax_scale = 0.3f;
  ASSERT_TRUE(make_plan(p, cpu_caps(), &plan).ok());
  EXPECT_FLOAT_EQ(plan.problem().softmax_scale, 0.3f);
}

TEST(BadInputs, ZeroPaddingNotABoolean) {
  expect_rejected(plan_with([](Problem* p) { p->zero_padding = 2; }), RATTN_ERROR_INVALID_VALUE,
                  {"zero_padding=2", "0 (padding rows untouched), 1 (padding rows zeroed)"});
}

TEST(BadInputs, HasSinkNotABoolean) {
  expect_rejected(plan_with([](Problem* p) { p->has_sink = 2; }), RATTN_ERROR_INVALID_VALUE,
                  {"has_sink=2", "supported: 0 (no sinks), 1 (one per query head)"});
}

TEST(BadInputs, CausalWithWindowRight) {
  expect_rejected(plan_with([](Problem* p) { p->window_right = 3; }), RATTN_ERROR_INVALID_VALUE,
                  {"causal", "window_right=3"});
}

TEST(BadInputs, Fp32OnTheCudaPath) {
  const auto r = plan_with(
      [](Problem* p) {
        p->dtype = RATTN_DTYPE_FP32;
        p->backend = RATTN_BACKEND_CUDA_PORTABLE;
      },
      testing_util::fake_hopper_caps());
  if (kBuiltWithCuda) {
    expect_rejected(r, RATTN_ERROR_NOT_SUPPORTED, {"fp32", "bf16 or fp16", "backend cpu"});
  } else {
    expect_rejected(r, RATTN_ERROR_NOT_SUPPORTED, {"no CUDA backend", "available: cpu"});
  }
}

TEST(BadInputs, BackendCudaWithoutDevice) {
  const auto r = plan_with([](Problem* p) { p->backend = RATTN_BACKEND_CUDA; });
  if (kBuiltWithCuda) {
    expect_rejected(r, RATTN_ERROR_NOT_SUPPORTED, {"backend cuda", "no CUDA device", "cpu"});
  } else {
    expect_rejected(r, RATTN_ERROR_NOT_SUPPORTED, {"backend cuda", "no CUDA backend", "cpu"});
  }
}

TEST(BadInputs, NullProblemOrPlanPointer) {
  Call s;
  const Problem p = s.problem();
  rattn_plan* plan = nullptr;
  EXPECT_EQ(rattn_plan_create(nullptr, nullptr, &plan), RATTN_ERROR_INVALID_VALUE);
  EXPECT_THAT(rattn_last_error(), HasSubstr("must not be null"));
  EXPECT_EQ(rattn_plan_create(&p, nullptr, nullptr), RATTN_ERROR_INVALID_VALUE);
  EXPECT_THAT(rattn_last_error(), HasSubstr("must not be null"));
  const Status st = make_plan(p, cpu_caps(), nullptr);
  EXPECT_EQ(st.code(), RATTN_ERROR_INVALID_VALUE);
  EXPECT_THAT(st.message(), HasSubstr("null"));
  size_t bytes = 0;
  EXPECT_EQ(rattn_plan_workspace_size(nullptr, RATTN_FORWARD, &bytes), RATTN_ERROR_INVALID_VALUE);
  EXPECT_EQ(rattn_forward(nullptr, nullptr, nullptr, 0, nullptr), RATTN_ERROR_INVALID_VALUE);
  EXPECT_THAT(rattn_last_error(), HasSubstr("must not be null"));
  // No plan has no path (it used to answer "cpu").
  EXPECT_EQ(rattn_plan_path(nullptr), RATTN_PATH_NONE);
  EXPECT_STREQ(rattn_path_name(RATTN_PATH_NONE), "none");
  // The C names are the C++ ones.
  for (Path path : {Path::Cpu, Path::CudaPortable, Path::CudaSm90}) {
    EXPECT_STREQ(rattn_path_name(static_cast<rattn_path>(path)), path_name(path));
  }
  EXPECT_STREQ(rattn_path_name(RATTN_PATH_CUDA_SM90), "cuda_sm90");
}

// Run-time rejections: a valid plan, a bad call, through both APIs; outputs keep the sentinel.
// Both directions' calls are rejected, or (Directions::Backward, for the backward's own tensors)
// the backward's alone.
using CallMutate = std::function<void(Call*, FwdTensors*, BwdTensors*)>;
enum class Directions { Both, Backward };

void expect_call_rejected(const CallMutate& m, rattn_status code,
                          const std::vector<std::string>& keywords, const Mutate& problem = {},
                          Directions dirs = Directions::Both) {
  Call s;
  Problem p = s.problem();
  if (problem) problem(&p);
  rattn_plan* cplan = nullptr;
  ASSERT_EQ(rattn_plan_create(&p, nullptr, &cplan), RATTN_SUCCESS) << rattn_last_error();
  Plan plan;
  ASSERT_TRUE(make_plan(p, cpu_caps(), &plan).ok());
  for (int api = 0; api < 2; ++api) {
    for (int dir = dirs == Directions::Both ? 0 : 1; dir < 2; ++dir) {
      FwdTensors f = s.fwd();
      BwdTensors b = s.bwd();
      m(&s, &f, &b);
      Result r;
      if (api == 0) {
        const rattn_status st = dir == 0 ? rattn_forward(cplan, &f, nullptr, 0, nullptr)
                                         : rattn_backward(cplan, &b, nullptr, 0, nullptr);
        r = {st, rattn_last_error()};
      } else {
        const Status st = dir == 0 ? forward(plan, f, nullptr, 0) : backward(plan, b, nullptr, 0);
        r = {st.code(), st.message()};
      }
      SCOPED_TRACE(std::string(api == 0 ? "C API " : "C++ API ") +
                   (dir == 0 ? "forward" : "backward"));
      EXPECT_EQ(r.code, code) << r.message;
      for (const std::string& k : keywords) EXPECT_THAT(r.message, HasSubstr(k));
      s.expect_outputs_untouched();
    }
  }
  rattn_plan_destroy(cplan);
}

TEST(BadInputs, NullTensorPointers) {
  expect_call_rejected(
      [](Call*, FwdTensors* f, BwdTensors* b) {
        f->q = nullptr;
        b->q = nullptr;
      },
      RATTN_ERROR_INVALID_VALUE, {"q is null"});
  expect_call_rejected(
      [](Call*, FwdTensors* f, BwdTensors* b) {
        f->cu_seqlens_kv = nullptr;
        b->cu_seqlens_kv = nullptr;
      },
      RATTN_ERROR_INVALID_VALUE, {"cu_seqlens_q and cu_seqlens_kv must be given"});
  expect_call_rejected(
      [](Call*, FwdTensors* f, BwdTensors* b) {
        f->lse = nullptr;
        b->lse = nullptr;
      },
      RATTN_ERROR_INVALID_VALUE, {"lse is null"});
}

TEST(BadInputs, MisalignedPointer) {
  expect_call_rejected(
      [](Call* s, FwdTensors* f, BwdTensors* b) {
        f->k = static_cast<const char*>(s->in.k.data()) + 2;
        b->k = f->k;
      },
      RATTN_ERROR_INVALID_VALUE, {"k=", "not 16-byte aligned"});
}

TEST(BadInputs, NonMonotoneCuSeqlens) {
  expect_call_rejected(
      [](Call* s, FwdTensors* f, BwdTensors* b) {
        s->cu_q = {0, 10, 5};
        f->cu_seqlens_q = b->cu_seqlens_q = s->cu_q.data();
      },
      RATTN_ERROR_INVALID_VALUE, {"cu_seqlens_q decreases at segment 1"});
}

// Sinks: the call's sink pointers must agree with the problem's has_sink, each named.
TEST(BadInputs, SinkGivenWithoutHasSink) {
  expect_call_rejected(
      [](Call* s, FwdTensors* f, BwdTensors* b) { f->sink = b->sink = s->sink.data(); },
      RATTN_ERROR_INVALID_VALUE,
      {": sink is given but the problem has no sinks (has_sink=0)", "set has_sink=1"});
  expect_call_rejected([](Call* s, FwdTensors*, BwdTensors* b) { b->d_sink = s->d_sink.data(); },
                       RATTN_ERROR_INVALID_VALUE,
                       {"backward: d_sink is given but the problem has no sinks"}, {},
                       Directions::Backward);
}

TEST(BadInputs, HasSinkWithoutSink) {
  const Mutate has_sink = [](Problem* p) { p->has_sink = 1; };
  // The backward's d_sink is given: its sink is what is missing.
  expect_call_rejected([](Call* s, FwdTensors*, BwdTensors* b) { b->d_sink = s->d_sink.data(); },
                       RATTN_ERROR_INVALID_VALUE, {"ward: sink is null"}, has_sink);
  expect_call_rejected([](Call* s, FwdTensors*, BwdTensors* b) { b->sink = s->sink.data(); },
                       RATTN_ERROR_INVALID_VALUE, {"backward: d_sink is null"}, has_sink,
                       Directions::Backward);
}

TEST(BadInputs, MisalignedSinkOrLseCotangent) {
  const Mutate has_sink = [](Problem* p) { p->has_sink = 1; };
  expect_call_rejected(
      [](Call* s, FwdTensors* f, BwdTensors* b) {
        f->sink = b->sink =
            reinterpret_cast<const float*>(reinterpret_cast<const char*>(s->sink.data()) + 2);
        b->d_sink = s->d_sink.data();
      },
      RATTN_ERROR_INVALID_VALUE, {"sink=", "is not 4-byte aligned"}, has_sink);
  expect_call_rejected(
      [](Call* s, FwdTensors*, BwdTensors* b) {
        b->d_lse = reinterpret_cast<const float*>(static_cast<const char*>(s->out.lse.data()) + 2);
      },
      RATTN_ERROR_INVALID_VALUE, {"backward: d_lse=", "is not 4-byte aligned"}, {},
      Directions::Backward);
}

TEST(BadInputs, CuSeqlensPastTheTensor) {
  // Lengths within max_seqlen, but the last entry points past the 17 rows of K and V.
  expect_call_rejected(
      [](Call* s, FwdTensors* f, BwdTensors* b) {
        s->cu_kv = {0, 10, 18};
        f->cu_seqlens_kv = b->cu_seqlens_kv = s->cu_kv.data();
      },
      RATTN_ERROR_INVALID_VALUE, {"cu_seqlens_kv[2]=18", "total_kv=17"});
}

TEST(BadInputs, SegmentLongerThanMaxSeqlen) {
  expect_call_rejected(
      [](Call* s, FwdTensors* f, BwdTensors* b) {
        s->cu_q = {0, 3, 17};
        f->cu_seqlens_q = b->cu_seqlens_q = s->cu_q.data();
      },
      RATTN_ERROR_INVALID_VALUE, {"segment 1 has q length 14 > max_seqlen_q=10"});
}

TEST(BadInputs, SeqOffsetsWithoutTheFlag) {
  static const int32_t offsets[3] = {0, 10, 17};
  expect_call_rejected(
      [](Call*, FwdTensors* f, BwdTensors* b) {
        f->seq_offsets_q = f->seq_offsets_kv = offsets;
        b->seq_offsets_q = b->seq_offsets_kv = offsets;
      },
      RATTN_ERROR_INVALID_VALUE, {"has_seq_offsets"});
}

TEST(BadInputs, WorkspaceTooSmall) {
  // The portable path's backward needs scratch; its plan is made from fake capabilities, which
  // works without a GPU in a CUDA build. The call is rejected before anything is launched, so
  // host pointers are fine. A CPU-only build cannot make that plan: say so.
  Call s;
  Problem p = s.problem();
  p.backend = RATTN_BACKEND_CUDA_PORTABLE;
  const DeviceCaps caps = testing_util::fake_hopper_caps();
  Plan plan;
  const Status made = make_plan(p, caps, &plan);
  if (!kBuiltWithCuda) {
    EXPECT_EQ(made.code(), RATTN_ERROR_NOT_SUPPORTED);
    EXPECT_THAT(made.message(), HasSubstr("no CUDA backend"));
    return;
  }
  ASSERT_TRUE(made.ok()) << made.message();
  const size_t need = plan.workspace_bytes(Direction::Backward);
  ASSERT_GT(need, 0u);
  std::vector<uint64_t> ws(need / 8 + 2);
  rattn_plan* cplan = nullptr;
  ASSERT_EQ(rattn_plan_create(&p, &caps, &cplan), RATTN_SUCCESS) << rattn_last_error();
  const BwdTensors b = s.bwd();
  const Status st = backward(plan, b, ws.data(), need - 1);
  EXPECT_EQ(st.code(), RATTN_ERROR_WORKSPACE);
  EXPECT_THAT(st.message(), HasSubstr(std::to_string(need - 1) + " bytes given"));
  EXPECT_THAT(st.message(), HasSubstr("needs " + std::to_string(need)));
  EXPECT_EQ(rattn_backward(cplan, &b, ws.data(), need - 1, nullptr), RATTN_ERROR_WORKSPACE);
  EXPECT_THAT(rattn_last_error(), HasSubstr("needs " + std::to_string(need)));
  EXPECT_EQ(backward(plan, b, nullptr, need).code(), RATTN_ERROR_WORKSPACE);
  s.expect_outputs_untouched();
  rattn_plan_destroy(cplan);
}

TEST(BadInputs, ForwardWorkspaceMissing) {
  // The persistent Hopper forward (short items: policy::fwd_persistent) keeps
  // its work counter in the forward's workspace: a forward call without it is refused before
  // anything is launched, naming what the plan needs.
  Call s;
  Problem p = s.problem();
  p.backend = RATTN_BACKEND_CUDA_SM90;
#ifndef RATTN_WITH_SM90
  GTEST_SKIP() << "this build has no Hopper path";
#endif
  Plan plan;
  const Status made = make_plan(p, testing_util::fake_hopper_caps(), &plan);
  ASSERT_TRUE(made.ok()) << made.message();
  const size_t need = plan.workspace_bytes(Direction::Forward);
  ASSERT_GT(need, 0u);
  const Status st = forward(plan, s.fwd(), nullptr, 0);
  EXPECT_EQ(st.code(), RATTN_ERROR_WORKSPACE);
  EXPECT_THAT(st.message(), HasSubstr("0 bytes given; the plan needs " + std::to_string(need)));
  EXPECT_EQ(forward(plan, s.fwd(), nullptr, need).code(), RATTN_ERROR_WORKSPACE);
  s.expect_outputs_untouched();
}

TEST(BadInputs, EmptyPlan) {
  Call s;
  const FwdTensors f = s.fwd();
  const Status st = forward(Plan(), f, nullptr, 0);
  EXPECT_EQ(st.code(), RATTN_ERROR_INVALID_VALUE);
  EXPECT_THAT(st.message(), HasSubstr("plan is empty"));
  s.expect_outputs_untouched();
}

}  // namespace
}  // namespace raggedattn

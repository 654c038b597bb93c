// The reference backward against central finite differences of the reference forward (fp32 data):
// the gradients are the derivative of the function the forward computes, for every mask, window,
// softcap, GQA, Dqk != Dv and padded THD.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "plan/plan_data.hpp"
#include "reference/reference.hpp"
#include "verify/rng.hpp"
#include "verify/verify.hpp"

namespace raggedattn {
namespace {

using verify::CaseSpec;
using verify::HostTensor;

// Large enough that fp32 rounding of O (~6e-8 relative) stays far below the difference, small
// enough that the O(eps^2) truncation error of central differences is ~1e-5 of the gradient.
constexpr float kEps = 2e-2f;
constexpr int kSamplesPerTensor = 120;

struct Problem1 {
  CaseSpec spec;
  verify::PackLayout layout;
  verify::HostInputs in;
  Plan plan;
};

Problem1 setup(const CaseSpec& spec) {
  Problem1 p;
  p.spec = spec;
  p.spec.dtype = RATTN_DTYPE_FP32;
  p.spec.backend = RATTN_BACKEND_CPU;
  p.layout = verify::make_layout(p.spec, 11);
  p.in = verify::make_inputs(p.spec, p.layout, 11);
  EXPECT_TRUE(make_plan(verify::make_problem(p.spec, p.layout), cpu_caps(), &p.plan).ok());
  return p;
}

FwdTensors fwd_tensors(const Problem1& p, verify::HostOutputs* out) {
  FwdTensors f{};
  f.q = p.in.q.data();
  f.k = p.in.k.data();
  f.v = p.in.v.data();
  f.o = out->o.data();
  f.lse = static_cast<float*>(out->lse.data());
  f.cu_seqlens_q = p.layout.cu_q.data();
  f.cu_seqlens_kv = p.layout.cu_kv.data();
  f.seq_offsets_q = p.layout.padded() ? p.layout.off_q.data() : nullptr;
  f.seq_offsets_kv = p.layout.padded() ? p.layout.off_kv.data() : nullptr;
  return f;
}

// sum over valid rows of dO . (O_plus - O_minus), in double: elements the perturbation does not
// reach cancel exactly, so only the affected rows contribute rounding noise.
double loss_difference(const Problem1& p, const HostTensor& o_plus, const HostTensor& o_minus) {
  double s = 0;
  for (int64_t r = 0; r < p.layout.total_q; ++r) {
    if (p.layout.q_padding[size_t(r)]) continue;
    for (int32_t h = 0; h < p.spec.hq; ++h) {
      for (int32_t d = 0; d < p.spec.dv; ++d) {
        s += p.in.d_o.view().at(r, h, d) * (o_plus.view().at(r, h, d) - o_minus.view().at(r, h, d));
      }
    }
  }
  return s;
}

void check_gradients(const CaseSpec& spec) {
  Problem1 p = setup(spec);
  const PlanData& d = p.plan.data();
  reference::Options one_thread;
  one_thread.threads = 1;

  verify::HostOutputs out = verify::make_outputs(p.spec, p.layout, RATTN_DTYPE_FP32);
  const FwdTensors f = fwd_tensors(p, &out);
  reference::forward(d, f, one_thread);
  BwdTensors b{};
  b.q = f.q;
  b.k = f.k;
  b.v = f.v;
  b.o = out.o.data();
  b.d_o = p.in.d_o.data();
  b.lse = f.lse;
  b.dq = out.dq.data();
  b.dk = out.dk.data();
  b.dv = out.dv.data();
  b.cu_seqlens_q = f.cu_seqlens_q;
  b.cu_seqlens_kv = f.cu_seqlens_kv;
  b.seq_offsets_q = f.seq_offsets_q;
  b.seq_offsets_kv = f.seq_offsets_kv;
  reference::backward(d, b, one_thread);

  struct Target {
    const char* name;
    HostTensor* x;
    const HostTensor* grad;
    const std::vector<uint8_t>* padding;
  } targets[] = {{"dQ", &p.in.q, &out.dq, &p.layout.q_padding},
                 {"dK", &p.in.k, &out.dk, &p.layout.kv_padding},
                 {"dV", &p.in.v, &out.dv, &p.layout.kv_padding}};
  verify::Rng rng(99);
  verify::HostOutputs plus = verify::make_outputs(p.spec, p.layout, RATTN_DTYPE_FP32);
  verify::HostOutputs minus = verify::make_outputs(p.spec, p.layout, RATTN_DTYPE_FP32);
  for (const Target& t : targets) {
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < t.x->rows; ++r) {
      if (!(*t.padding)[size_t(r)]) rows.push_back(r);
    }
    if (rows.empty()) continue;
    std::vector<double> numeric, analytic;
    for (int s = 0; s < kSamplesPerTensor; ++s) {
      const int64_t r = rows[size_t(rng.range(0, int64_t(rows.size()) - 1))];
      const int32_t h = int32_t(rng.range(0, t.x->heads - 1));
      const int32_t c = int32_t(rng.range(0, t.x->dim - 1));
      const float x0 = float(t.x->view().at(r, h, c));
      const float xp = x0 + kEps, xm = x0 - kEps;
      t.x->set(r, h, c, xp);
      reference::forward(d, fwd_tensors(p, &plus), one_thread);
      t.x->set(r, h, c, xm);
      reference::forward(d, fwd_tensors(p, &minus), one_thread);
      t.x->set(r, h, c, x0);
      numeric.push_back(loss_difference(p, plus.o, minus.o) / (double(xp) - double(xm)));
      analytic.push_back(t.grad->view().at(r, h, c));
    }
    const verify::Metrics m =
        verify::compare(numeric.data(), analytic.data(), nullptr, int64_t(numeric.size()),
                        verify::Tolerance{0.999999, 0.0, 5e-4});
    EXPECT_TRUE(m.pass) << spec.name << " " << t.name << ": finite differences vs backward: cos "
                        << m.cos << " rel " << m.rel << " max abs " << m.max_abs
                        << (m.zero_ref ? " (zero gradient)" : "");
  }
}

CaseSpec small(const char* name, std::vector<int32_t> q, std::vector<int32_t> kv) {
  CaseSpec c;
  c.name = name;
  c.seqlens_q = std::move(q);
  c.seqlens_kv = std::move(kv);
  c.hq = 2;
  c.hkv = 1;
  c.dqk = c.dv = 64;
  return c;
}

TEST(FiniteDifferences, CausalGqa) {
  CaseSpec c = small("causal_gqa", {7, 1, 12}, {});
  c.hq = 4;
  c.hkv = 2;
  c.mask = RATTN_MASK_CAUSAL;
  check_gradients(c);
}

TEST(FiniteDifferences, NonCausalCross) {
  check_gradients(small("cross", {9, 5}, {13, 3}));
}

TEST(FiniteDifferences, CausalBottomRightWithRowsThatSeeNothing) {
  CaseSpec c = small("causal_br", {9, 6}, {4, 11});
  c.mask = RATTN_MASK_CAUSAL;
  c.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
  check_gradients(c);
}

TEST(FiniteDifferences, SlidingWindow) {
  CaseSpec c = small("window", {14, 9}, {});
  c.mask = RATTN_MASK_CAUSAL;
  c.window_left = 3;
  c.window_right = 0;
  check_gradients(c);
}

TEST(FiniteDifferences, BidirectionalWindowBottomRight) {
  CaseSpec c = small("window_br", {8, 10}, {12, 10});
  c.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
  c.window_left = 2;
  c.window_right = 3;
  check_gradients(c);
}

TEST(FiniteDifferences, Softcap) {
  CaseSpec c = small("softcap", {10, 6}, {});
  c.mask = RATTN_MASK_CAUSAL;
  c.softcap = 1.5f;  // scores are ~N(0, 1): tanh is far from linear here
  check_gradients(c);
}

TEST(FiniteDifferences, Mqa) {
  CaseSpec c = small("mqa", {8, 5}, {});
  c.hq = 3;
  c.hkv = 1;
  c.mask = RATTN_MASK_CAUSAL;
  check_gradients(c);
}

TEST(FiniteDifferences, Dqk192Dv128) {
  CaseSpec c = small("d192_dv128", {6, 9}, {});
  c.dqk = 192;
  c.dv = 128;
  c.mask = RATTN_MASK_CAUSAL;
  check_gradients(c);
}

TEST(FiniteDifferences, PaddedThd) {
  CaseSpec c = small("padded", {5, 8}, {});
  c.mask = RATTN_MASK_CAUSAL;
  c.padded = true;
  check_gradients(c);
}

TEST(FiniteDifferences, ZeroLengthSegments) {
  CaseSpec c = small("zero_length", {4, 0, 6}, {0, 3, 6});
  c.mask = RATTN_MASK_CAUSAL;
  check_gradients(c);
}

}  // namespace
}  // namespace raggedattn

// Attention sinks and the LSE's cotangent through the public C++ API on the cpu backend (fp32):
// d_sink, and dQ, dK, dV given d_lse, are the derivatives of L = sum(O * G) + sum(LSE * H) (G the
// backward's dO, H its d_lse) by central finite differences of the forward; rows that see no key
// come out as raggedattn.h defines them; d_lse = NULL is d_lse = 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "raggedattn/raggedattn.hpp"
#include "verify/mask_rules.hpp"
#include "verify/rng.hpp"
#include "verify/verify.hpp"

namespace raggedattn {
namespace {

using verify::CaseSpec;
using verify::HostTensor;

// As in gradient_test.cpp: far above fp32 rounding of O and LSE, with an O(eps^2) truncation
// error of ~1e-5 of the gradient.
constexpr float kEps = 2e-2f;
constexpr int kSamplesPerTensor = 40;
const verify::Tolerance kFiniteDifferenceTol{0.999999, 0.0, 5e-4};

// A case with sinks and an LSE cotangent, its data, and a plan for it.
struct SinkProblem {
  CaseSpec spec;
  verify::PackLayout layout;
  verify::HostInputs in;
  Plan plan;
  verify::HostBuffer ws_fwd, ws_bwd;

  explicit SinkProblem(CaseSpec c) : spec(std::move(c)) {
    spec.dtype = RATTN_DTYPE_FP32;
    spec.backend = RATTN_BACKEND_CPU;
    spec.sink = true;
    spec.lse_grad = true;
    layout = verify::make_layout(spec, 23);
    in = verify::make_inputs(spec, layout, 23);
    const Status s = make_plan(verify::make_problem(spec, layout), cpu_caps(), &plan);
    EXPECT_TRUE(s.ok()) << s.message();
    ws_fwd = verify::HostBuffer(plan.workspace_bytes(Direction::Forward));
    ws_bwd = verify::HostBuffer(plan.workspace_bytes(Direction::Backward));
  }

  void run_forward(verify::HostOutputs* out) {
    FwdTensors f{};
    f.q = in.q.data();
    f.k = in.k.data();
    f.v = in.v.data();
    f.o = out->o.data();
    f.lse = static_cast<float*>(out->lse.data());
    f.cu_seqlens_q = layout.cu_q.data();
    f.cu_seqlens_kv = layout.cu_kv.data();
    f.seq_offsets_q = layout.padded() ? layout.off_q.data() : nullptr;
    f.seq_offsets_kv = layout.padded() ? layout.off_kv.data() : nullptr;
    f.sink = static_cast<const float*>(in.sink.data());
    const Status s = forward(plan, f, ws_fwd.data(), ws_fwd.bytes());
    ASSERT_TRUE(s.ok()) << s.message();
  }

  // The backward of `out`'s forward, into out's dQ, dK, dV, d_sink; d_lse as given (may be null).
  void run_backward(const float* d_lse, verify::HostOutputs* out) {
    BwdTensors b{};
    b.q = in.q.data();
    b.k = in.k.data();
    b.v = in.v.data();
    b.o = out->o.data();
    b.d_o = in.d_o.data();
    b.lse = static_cast<const float*>(out->lse.data());
    b.dq = out->dq.data();
    b.dk = out->dk.data();
    b.dv = out->dv.data();
    b.cu_seqlens_q = layout.cu_q.data();
    b.cu_seqlens_kv = layout.cu_kv.data();
    b.seq_offsets_q = layout.padded() ? layout.off_q.data() : nullptr;
    b.seq_offsets_kv = layout.padded() ? layout.off_kv.data() : nullptr;
    b.sink = static_cast<const float*>(in.sink.data());
    b.d_sink = static_cast<float*>(out->d_sink.data());
    b.d_lse = d_lse;
    const Status s = backward(plan, b, ws_bwd.data(), ws_bwd.bytes());
    ASSERT_TRUE(s.ok()) << s.message();
  }

  const float* d_lse() const { return static_cast<const float*>(in.d_lse.data()); }
  verify::HostOutputs outputs() const {
    return verify::make_outputs(spec, layout, RATTN_DTYPE_FP32);
  }

  // L(plus) - L(minus) over the rows inside segments, in double: terms the perturbation does not
  // reach cancel exactly.
  double loss_difference(const verify::HostOutputs& plus, const verify::HostOutputs& minus) const {
    double s = 0;
    for (int64_t r = 0; r < layout.total_q; ++r) {
      if (layout.q_padding[size_t(r)]) continue;
      for (int32_t h = 0; h < spec.hq; ++h) {
        for (int32_t d = 0; d < spec.dv; ++d) {
          s += in.d_o.view().at(r, h, d) * (plus.o.view().at(r, h, d) - minus.o.view().at(r, h, d));
        }
        s += in.d_lse.view().at(r, h, 0) *
             (plus.lse.view().at(r, h, 0) - minus.lse.view().at(r, h, 0));
      }
    }
    return s;
  }

  // dL/dx at element (r, h, c) of `x` (an input of the forward) by central differences.
  double numeric(HostTensor* x, int64_t r, int32_t h, int32_t c) {
    verify::HostOutputs plus = outputs(), minus = outputs();
    const float x0 = float(x->view().at(r, h, c));
    const float xp = x0 + kEps, xm = x0 - kEps;
    x->set(r, h, c, xp);
    run_forward(&plus);
    x->set(r, h, c, xm);
    run_forward(&minus);
    x->set(r, h, c, x0);
    return loss_difference(plus, minus) / (double(xp) - double(xm));
  }
};

void expect_close(const std::vector<double>& numeric, const std::vector<double>& analytic,
                  const std::string& what) {
  ASSERT_FALSE(analytic.empty()) << what;
  const verify::Metrics m = verify::compare(numeric.data(), analytic.data(), nullptr,
                                            int64_t(numeric.size()), kFiniteDifferenceTol);
  EXPECT_TRUE(m.pass) << what << ": finite differences vs backward: cos " << m.cos << " rel "
                      << m.rel << " max abs " << m.max_abs
                      << (m.zero_ref ? " (zero gradient)" : "");
}

// (a) d_sink, every head, against the differences of L in that head's sink.
void check_sink_gradient(const CaseSpec& spec) {
  SinkProblem p(spec);
  verify::HostOutputs out = p.outputs();
  p.run_forward(&out);
  p.run_backward(p.d_lse(), &out);
  std::vector<double> numeric, analytic;
  for (int32_t h = 0; h < p.spec.hq; ++h) {
    numeric.push_back(p.numeric(&p.in.sink, h, 0, 0));
    analytic.push_back(out.d_sink.view().at(h, 0, 0));
  }
  expect_close(numeric, analytic, p.spec.name + " d_sink");
}

// (b) dQ, dK, dV given d_lse, at random elements inside segments.
void check_input_gradients(const CaseSpec& spec) {
  SinkProblem p(spec);
  verify::HostOutputs out = p.outputs();
  p.run_forward(&out);
  p.run_backward(p.d_lse(), &out);
  struct Target {
    const char* name;
    HostTensor* x;
    const HostTensor* grad;
    const std::vector<uint8_t>* padding;
  } targets[] = {{"dQ", &p.in.q, &out.dq, &p.layout.q_padding},
                 {"dK", &p.in.k, &out.dk, &p.layout.kv_padding},
                 {"dV", &p.in.v, &out.dv, &p.layout.kv_padding}};
  verify::Rng rng(7);
  for (const Target& t : targets) {
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < t.x->rows; ++r) {
      if (!(*t.padding)[size_t(r)]) rows.push_back(r);
    }
    std::vector<double> numeric, analytic;
    for (int s = 0; s < kSamplesPerTensor; ++s) {
      const int64_t r = rows[size_t(rng.range(0, int64_t(rows.size()) - 1))];
      const int32_t h = int32_t(rng.range(0, t.x->heads - 1));
      const int32_t c = int32_t(rng.range(0, t.x->dim - 1));
      numeric.push_back(p.numeric(t.x, r, h, c));
      analytic.push_back(t.grad->view().at(r, h, c));
    }
    expect_close(numeric, analytic, p.spec.name + " " + t.name);
  }
}

// GQA, bottom-right causal with more queries than keys (rows that see nothing), a segment of
// queries without keys and one of keys without queries.
CaseSpec causal_with_empty_rows() {
  CaseSpec c;
  c.name = "causal_empty_rows";
  c.seqlens_q = {9, 6, 4, 0};
  c.seqlens_kv = {5, 11, 0, 3};
  c.hq = 4;
  c.hkv = 2;
  c.dqk = c.dv = 64;
  c.mask = RATTN_MASK_CAUSAL;
  c.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
  return c;
}

// The sink in the soft-capped scores' units, a band on both sides, padded THD with NaN padding.
CaseSpec window_softcap_padded() {
  CaseSpec c;
  c.name = "window_softcap_padded";
  c.seqlens_q = {8, 10};
  c.seqlens_kv = {12, 10};
  c.hq = 2;
  c.hkv = 1;
  c.dqk = c.dv = 64;
  c.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
  c.window_left = 2;
  c.window_right = 3;
  c.softcap = 1.5f;
  c.padded = true;
  c.nan_padding = true;
  return c;
}

TEST(SinkFiniteDifferences, SinkGradientCausalWithEmptyRows) {
  check_sink_gradient(causal_with_empty_rows());
}

TEST(SinkFiniteDifferences, SinkGradientWindowSoftcapPadded) {
  check_sink_gradient(window_softcap_padded());
}

TEST(SinkFiniteDifferences, InputGradientsWithLseCotangentCausalWithEmptyRows) {
  check_input_gradients(causal_with_empty_rows());
}

TEST(SinkFiniteDifferences, InputGradientsWithLseCotangentWindowSoftcapPadded) {
  check_input_gradients(window_softcap_padded());
}

// (c) A row that sees no key: O = 0 and LSE = the sink's logit, exactly; its whole d_sink share is
// its d_lse (d LSE / d sink = 1 there).
TEST(SinkRows, RowsThatSeeNoKeyGiveZeroAndTheSink) {
  SinkProblem p(causal_with_empty_rows());
  verify::HostOutputs out = p.outputs();
  p.run_forward(&out);
  const verify::MaskRule mask = verify::MaskRule::of(p.spec);
  int keyless = 0;
  for (const verify::SegmentRows& s : p.layout.segments) {
    for (int32_t i = 0; i < s.len_q; ++i) {
      if (mask.keys_seen(i, s.len_q, s.len_kv) > 0) continue;
      ++keyless;
      for (int32_t h = 0; h < p.spec.hq; ++h) {
        EXPECT_EQ(out.lse.view().at(s.q_row0 + i, h, 0), p.in.sink.view().at(h, 0, 0))
            << "row " << s.q_row0 + i << " head " << h;
        for (int32_t d = 0; d < p.spec.dv; ++d) {
          ASSERT_EQ(out.o.view().at(s.q_row0 + i, h, d), 0.0) << "row " << s.q_row0 + i;
        }
      }
    }
  }
  EXPECT_EQ(keyless, 4 + 4);  // rows 0..3 of segment 0 (9 queries, 5 keys) and all of segment 2
}

// NULL d_lse is the same as zeros, bit for bit; a cotangent changes dQ, dK and d_sink, not dV.
TEST(SinkRows, NullLseCotangentIsZeros) {
  SinkProblem p(causal_with_empty_rows());
  verify::HostOutputs none = p.outputs(), zeros = p.outputs(), given = p.outputs();
  p.run_forward(&none);
  for (verify::HostOutputs* o : {&zeros, &given}) {
    std::memcpy(o->o.data(), none.o.data(), none.o.bytes());
    std::memcpy(o->lse.data(), none.lse.data(), none.lse.bytes());
  }
  const std::vector<float> zero(size_t(p.in.d_lse.elements()), 0.f);
  p.run_backward(nullptr, &none);
  p.run_backward(zero.data(), &zeros);
  p.run_backward(p.d_lse(), &given);
  auto same = [](const HostTensor& a, const HostTensor& b) {
    return std::memcmp(a.data(), b.data(), a.bytes()) == 0;
  };
  EXPECT_TRUE(same(none.dq, zeros.dq) && same(none.dk, zeros.dk) && same(none.dv, zeros.dv) &&
              same(none.d_sink, zeros.d_sink));
  EXPECT_FALSE(same(none.dq, given.dq));
  EXPECT_FALSE(same(none.dk, given.dk));
  EXPECT_FALSE(same(none.d_sink, given.d_sink));
  EXPECT_TRUE(same(none.dv, given.dv)) << "d_lse does not reach dV (dV = P^T dO)";
}

}  // namespace
}  // namespace raggedattn

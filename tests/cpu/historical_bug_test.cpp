// The failure this project exists to prevent, rebuilt on the host: the dQ scratch written in one
// layout (packed tokens, no per-segment slots) and read back in another (per-segment slots). The
// result is right for segment 0 and wrong for every other segment; the per-segment checker must
// say exactly that.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <tuple>
#include <vector>

#include "core/dq_accum_layout.hpp"
#include "test_util.hpp"
#include "verify/verify.hpp"

namespace raggedattn {

namespace {

using verify::CaseSpec;
using verify::HostOutputs;
using verify::HostTensor;
using verify::Metrics;
using verify::PackLayout;

struct CorrectDq {
  CaseSpec spec;
  PackLayout layout;
  HostOutputs out;
};

// dQ of a small causal problem from the reference backend, through the public API.
CorrectDq reference_dq() {
  CorrectDq c;
  c.spec.name = "historical";
  c.spec.seqlens_q = {100, 80, 76, 33};  // no length a multiple of 16: slots cannot line up
  c.spec.hq = c.spec.hkv = 1;            // one plane: only the segment slots differ
  c.spec.dqk = c.spec.dv = 64;
  c.spec.dtype = RATTN_DTYPE_FP32;
  c.spec.mask = RATTN_MASK_CAUSAL;
  c.spec.backend = RATTN_BACKEND_CPU;
  c.layout = verify::make_layout(c.spec, 7);
  const verify::HostInputs in = verify::make_inputs(c.spec, c.layout, 7);
  c.out = verify::make_outputs(c.spec, c.layout, RATTN_DTYPE_FP32);
  Plan plan;
  EXPECT_TRUE(make_plan(verify::make_problem(c.spec, c.layout), cpu_caps(), &plan).ok());
  FwdTensors f{};
  f.q = in.q.data();
  f.k = in.k.data();
  f.v = in.v.data();
  f.o = c.out.o.data();
  f.lse = static_cast<float*>(c.out.lse.data());
  f.cu_seqlens_q = c.layout.cu_q.data();
  f.cu_seqlens_kv = c.layout.cu_kv.data();
  EXPECT_TRUE(forward(plan, f, nullptr, 0).ok());
  BwdTensors b{};
  b.q = in.q.data();
  b.k = in.k.data();
  b.v = in.v.data();
  b.o = c.out.o.data();
  b.d_o = in.d_o.data();
  b.lse = f.lse;
  b.dq = c.out.dq.data();
  b.dk = c.out.dk.data();
  b.dv = c.out.dv.data();
  b.cu_seqlens_q = f.cu_seqlens_q;
  b.cu_seqlens_kv = f.cu_seqlens_kv;
  EXPECT_TRUE(backward(plan, b, nullptr, 0).ok());
  return c;
}

DqAccumLayout layout_for(const CorrectDq& c, DqSlotScheme s, DqTileOrder order = DqTileOrder::Rows,
                         int32_t align = 16) {
  return make_dq_accum_layout(s, AccumType::F32, 1, c.spec.batch(), c.spec.hq, c.spec.dqk,
                              c.layout.total_q, c.layout.max_q, align, order);
}

// What a main kernel writing through `w` and a post kernel reading through `r` produce.
HostTensor through_scratch(const CorrectDq& c, const DqAccumLayout& w, const DqAccumLayout& r) {
  const PackLayout& l = c.layout;
  const int32_t batch = c.spec.batch(), heads = c.spec.hq, dim = c.spec.dqk;
  std::vector<float> scratch(size_t(std::max(w.elements(), r.elements())), 0.f);
  HostTensor dq(RATTN_DTYPE_FP32, l.total_q, heads, dim);
  for (int b = 0; b < batch; ++b) {
    const verify::SegmentRows& s = l.segments[size_t(b)];
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < s.len_q; ++i) {
        for (int d = 0; d < dim; ++d) {
          scratch[size_t(w.at(0, b, l.cu_q[size_t(b)], h, i, d))] =
              float(c.out.dq.view().at(s.q_row0 + i, h, d));
        }
      }
    }
  }
  for (int b = 0; b < batch; ++b) {
    const verify::SegmentRows& s = l.segments[size_t(b)];
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < s.len_q; ++i) {
        for (int d = 0; d < dim; ++d) {
          dq.set(s.q_row0 + i, h, d, scratch[size_t(r.at(0, b, l.cu_q[size_t(b)], h, i, d))]);
        }
      }
    }
  }
  return dq;
}

class WrongLayoutPairing : public ::testing::TestWithParam<DqSlotScheme> {};

TEST_P(WrongLayoutPairing, EverySegmentPastTheFirstFails) {
  const CorrectDq c = reference_dq();
  const HostTensor wrong =
      through_scratch(c, layout_for(c, DqSlotScheme::PackedTokens), layout_for(c, GetParam()));
  const std::vector<Metrics> m = verify::check_tensor(verify::Tensor::Dq, c.layout.segments,
                                                      wrong.view(), c.out.dq.view(), nullptr, {});
  ASSERT_EQ(m.size(), 4u);
  EXPECT_TRUE(m[0].pass) << "segment 0 sits at row 0 in every layout: cos " << m[0].cos << " rel "
                         << m[0].rel;
  EXPECT_EQ(m[0].rel, 0.0);
  for (size_t b = 1; b < m.size(); ++b) {
    EXPECT_FALSE(m[b].pass) << "segment " << b << " read through the wrong layout passed: cos "
                            << m[b].cos << " rel " << m[b].rel;
    EXPECT_GT(m[b].rel, 0.1) << "segment " << b;
  }
}

TEST_P(WrongLayoutPairing, TheMatchingPairingPassesEverySegment) {
  // The control: the same data through one layout on both sides is exact for every segment.
  const CorrectDq c = reference_dq();
  const HostTensor same = through_scratch(c, layout_for(c, GetParam()), layout_for(c, GetParam()));
  for (const Metrics& m : verify::check_tensor(verify::Tensor::Dq, c.layout.segments, same.view(),
                                               c.out.dq.view(), nullptr, {})) {
    EXPECT_TRUE(m.pass);
    EXPECT_EQ(m.max_abs, 0.0);
  }
}

// The same class of bug one level down: the Hopper backward's tile order (DqTileOrder::Wgmma64)
// read back in row order, in the same slots. Only a segment's first row's first columns line up,
// so every segment fails; the matching pairing is exact.
TEST(WrongTileOrder, EverySegmentFailsAndTheMatchingOrderIsExact) {
  const CorrectDq c = reference_dq();
  const DqAccumLayout tiles = layout_for(c, DqSlotScheme::Compact, DqTileOrder::Wgmma64);
  ASSERT_EQ(tiles.order, DqTileOrder::Wgmma64);
  ASSERT_EQ(tiles.align, 64);
  const DqAccumLayout rows = layout_for(c, DqSlotScheme::Compact, DqTileOrder::Rows, 64);
  const std::vector<Metrics> wrong =
      verify::check_tensor(verify::Tensor::Dq, c.layout.segments,
                           through_scratch(c, tiles, rows).view(), c.out.dq.view(), nullptr, {});
  ASSERT_EQ(wrong.size(), 4u);
  for (size_t b = 0; b < wrong.size(); ++b) {
    EXPECT_FALSE(wrong[b].pass) << "segment " << b << " read in the wrong tile order passed: cos "
                                << wrong[b].cos << " rel " << wrong[b].rel;
    EXPECT_GT(wrong[b].rel, 0.1) << "segment " << b;
  }
  for (const Metrics& m : verify::check_tensor(verify::Tensor::Dq, c.layout.segments,
                                               through_scratch(c, tiles, tiles).view(),
                                               c.out.dq.view(), nullptr, {})) {
    EXPECT_TRUE(m.pass);
    EXPECT_EQ(m.max_abs, 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(ReadSide, WrongLayoutPairing,
                         ::testing::Values(DqSlotScheme::PaddedBatch, DqSlotScheme::Compact),
                         [](const ::testing::TestParamInfo<DqSlotScheme>& scheme) {
                           return scheme.param == DqSlotScheme::Compact ? std::string("Compact")
                                                                      : std::string("PaddedBatch");
                         });

TEST(HistoricalBug, AWholeBatchNormWouldHaveHiddenIt) {
  // Why the checks are per segment: over the whole batch the same wrong dQ still has most of its
  // norm right (segment 0 is the longest), so a batch-wide cosine is far closer to 1 than any
  // wrong segment's.
  const CorrectDq c = reference_dq();
  const HostTensor wrong = through_scratch(c, layout_for(c, DqSlotScheme::PackedTokens),
                                           layout_for(c, DqSlotScheme::Compact));
  const verify::SegmentRows all{0, 0, int32_t(c.layout.total_q), 0};
  const Metrics whole = verify::check_tensor(verify::Tensor::Dq, {all}, wrong.view(),
                                             c.out.dq.view(), nullptr, {})[0];
  const std::vector<Metrics> per = verify::check_tensor(verify::Tensor::Dq, c.layout.segments,
                                                        wrong.view(), c.out.dq.view(), nullptr, {});
  double worst_cos = 1.0;
  for (const Metrics& m : per) worst_cos = std::min(worst_cos, m.cos);
  EXPECT_GT(whole.cos, worst_cos + 0.2);
}

}  // namespace
}  // namespace raggedattn

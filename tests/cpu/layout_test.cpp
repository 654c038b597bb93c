// Properties of the dQ accumulation layouts and the ragged tile map, over random segment lists:
// the addressing every backward kernel relies on, checked without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/dq_accum_layout.hpp"
#include "core/tile_map.hpp"
#include "plan/plan_data.hpp"
#include "test_util.hpp"

namespace raggedattn {

namespace {

using testing_util::prefix_sums;
using testing_util::random_lengths;

constexpr int kAlign = 16;
constexpr int kLists = 150;

struct Interval {
  int64_t begin, end;  // elements
  int split, segment, head;
};

// The element intervals every (split, segment, head) slot occupies.
std::vector<Interval> slots(const DqAccumLayout& l, const std::vector<int32_t>& lens,
                            const std::vector<int32_t>& cu) {
  std::vector<Interval> out;
  for (int s = 0; s < l.nsplits; ++s) {
    for (int b = 0; b < int(lens.size()); ++b) {
      if (lens[size_t(b)] == 0) continue;
      for (int h = 0; h < l.heads; ++h) {
        const int64_t begin = l.offset(s, b, cu[size_t(b)], h, 0);
        // Rows are contiguous within a slot: row i is at offset(.., 0) + i * dim.
        EXPECT_EQ(l.offset(s, b, cu[size_t(b)], h, lens[size_t(b)] - 1),
                  begin + int64_t(lens[size_t(b)] - 1) * l.dim);
        out.push_back({begin, begin + int64_t(lens[size_t(b)]) * l.dim, s, b, h});
      }
    }
  }
  return out;
}

class DqAccumLayoutProperties
    : public ::testing::TestWithParam<std::tuple<DqSlotScheme, AccumType>> {};

TEST_P(DqAccumLayoutProperties, SlotsAreDisjointInsideAndAligned) {
  const auto [scheme, type] = GetParam();
  for (int trial = 0; trial < kLists; ++trial) {
    const std::vector<int32_t> lens = random_lengths(1000 + trial);
    const std::vector<int32_t> cu = prefix_sums(lens);
    const int32_t batch = int32_t(lens.size());
    const int32_t max_len = *std::max_element(lens.begin(), lens.end());
    for (int32_t nsplits : {1, 3}) {
      for (int32_t heads : {1, 5}) {
        const int32_t dim = trial % 2 ? 64 : 192;
        const DqAccumLayout l = make_dq_accum_layout(scheme, type, nsplits, batch, heads, dim,
                                                     cu.back(), max_len, kAlign);
        SCOPED_TRACE(::testing::Message() << "trial " << trial << " B=" << batch
                                          << " splits=" << nsplits << " heads=" << heads);
        ASSERT_EQ(l.bytes(), l.elements() * (type == AccumType::F32 ? 4 : 2));
        std::vector<Interval> iv = slots(l, lens, cu);
        std::sort(iv.begin(), iv.end(),
                  [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
        for (size_t i = 0; i < iv.size(); ++i) {
          ASSERT_GE(iv[i].begin, 0);
          ASSERT_LE(iv[i].end, l.elements())
              << "segment " << iv[i].segment << " head " << iv[i].head << " runs past the scratch";
          if (i + 1 < iv.size()) {
            ASSERT_LE(iv[i].end, iv[i + 1].begin)
                << "segment " << iv[i].segment << " (split " << iv[i].split << ", head "
                << iv[i].head << ") overlaps segment " << iv[i + 1].segment << " (split "
                << iv[i + 1].split << ", head " << iv[i + 1].head << ")";
          }
          if (scheme != DqSlotScheme::PackedTokens) {
            ASSERT_EQ((iv[i].begin / dim) % kAlign, 0)
                << "segment " << iv[i].segment << " slot is not " << kAlign << "-row aligned";
          }
        }
      }
    }
  }
}

TEST_P(DqAccumLayoutProperties, AlignedSlotsShareNoTile) {
  // A kernel stores whole 16-row tiles of its segment's slot; they must not reach another slot.
  const auto [scheme, type] = GetParam();
  if (scheme == DqSlotScheme::PackedTokens) GTEST_SKIP() << "PackedTokens promises no alignment";
  for (int trial = 0; trial < kLists; ++trial) {
    const std::vector<int32_t> lens = random_lengths(2000 + trial);
    const std::vector<int32_t> cu = prefix_sums(lens);
    const int32_t max_len = *std::max_element(lens.begin(), lens.end());
    const DqAccumLayout l = make_dq_accum_layout(scheme, type, 2, int32_t(lens.size()), 3, 64,
                                                 cu.back(), max_len, kAlign);
    std::vector<std::pair<int64_t, int64_t>> tiles;  // [first row, end row) rounded to tiles
    for (int s = 0; s < 2; ++s) {
      for (int b = 0; b < int(lens.size()); ++b) {
        for (int h = 0; h < 3; ++h) {
          if (!lens[size_t(b)]) continue;
          const int64_t row0 = l.offset(s, b, cu[size_t(b)], h, 0) / l.dim;
          tiles.emplace_back(row0, row0 + round_up(lens[size_t(b)], kAlign));
        }
      }
    }
    std::sort(tiles.begin(), tiles.end());
    for (size_t i = 0; i + 1 < tiles.size(); ++i) {
      ASSERT_LE(tiles[i].second, tiles[i + 1].first) << "trial " << trial;
    }
    ASSERT_LE(tiles.empty() ? 0 : tiles.back().second, l.elements() / l.dim);
  }
}

TEST_P(DqAccumLayoutProperties, OffsetsPast2To31ElementsDoNotWrap) {
  const auto [scheme, type] = GetParam();
  const std::vector<int32_t> lens = {7, 1 << 28, 33, 1 << 27};
  const std::vector<int32_t> cu = prefix_sums(lens);
  const DqAccumLayout l =
      make_dq_accum_layout(scheme, type, 2, 4, 8, 256, cu.back(), 1 << 28, kAlign);
  int64_t prev = -1;
  for (int s = 0; s < 2; ++s) {
    for (int h = 0; h < 8; ++h) {
      for (int b = 0; b < 4; ++b) {
        const int64_t last = l.offset(s, b, cu[size_t(b)], h, lens[size_t(b)] - 1);
        ASSERT_GT(last, 0);
        ASSERT_LT(last + l.dim, l.elements() + 1);
        if (scheme != DqSlotScheme::PaddedBatch) {
          ASSERT_GT(last, prev);
        }
        prev = last;
      }
    }
  }
  EXPECT_GT(l.elements(), int64_t(1) << 31);
}

std::string scheme_name(const ::testing::TestParamInfo<std::tuple<DqSlotScheme, AccumType>>& info) {
  static const char* const kNames[] = {"Compact", "PaddedBatch", "PackedTokens"};
  return std::string(kNames[int(std::get<0>(info.param))]) +
         (std::get<1>(info.param) == AccumType::F32    ? "_fp32"
          : std::get<1>(info.param) == AccumType::BF16 ? "_bf16"
                                                       : "_fp16");
}

INSTANTIATE_TEST_SUITE_P(
    AllSchemes, DqAccumLayoutProperties,
    ::testing::Combine(::testing::Values(DqSlotScheme::Compact, DqSlotScheme::PaddedBatch,
                                         DqSlotScheme::PackedTokens),
                       ::testing::Values(AccumType::F32, AccumType::BF16, AccumType::F16)),
    scheme_name);

TEST(DqAccumLayout, CompactRowsStayWithinTotalPlus16PerSegment) {
  for (int trial = 0; trial < kLists; ++trial) {
    const std::vector<int32_t> lens = random_lengths(3000 + trial);
    const std::vector<int32_t> cu = prefix_sums(lens);
    const int64_t b = int64_t(lens.size());
    const DqAccumLayout l = make_dq_accum_layout(DqSlotScheme::Compact, AccumType::BF16, 1,
                                                 int32_t(b), 1, 64, cu.back(), 0, kAlign);
    // DESIGN.md: at most total_q + 16 * B rows (plus the rounding of the last tile).
    EXPECT_LE(l.rows, cu.back() + kAlign * b + kAlign) << "trial " << trial;
  }
}

// The ragged tile map: locate() inverts first()/count(), gaps are segment -1, and every tile
// lies below bound().
TEST(RaggedTiles, LocateInvertsFirstAndCount) {
  for (int trial = 0; trial < kLists; ++trial) {
    const std::vector<int32_t> lens = random_lengths(4000 + trial);
    const std::vector<int32_t> cu = prefix_sums(lens);
    const int32_t batch = int32_t(lens.size());
    for (int32_t tile : {16, 64, 128}) {
      const RaggedTiles map{tile, batch};
      const int64_t bound = RaggedTiles::bound(cu.back(), batch, tile);
      std::vector<int32_t> owner(size_t(bound), -1);
      for (int b = 0; b < batch; ++b) {
        const int64_t first = map.first(b, cu[size_t(b)]);
        const int64_t count = map.count(lens[size_t(b)]);
        ASSERT_LE(first + count, bound) << "segment " << b << " tiles past the bound";
        if (b + 1 < batch) {
          ASSERT_LE(first + count, map.first(b + 1, cu[size_t(b) + 1]));
        }
        for (int64_t t = first; t < first + count; ++t) {
          ASSERT_EQ(owner[size_t(t)], -1) << "tile " << t << " claimed twice";
          owner[size_t(t)] = b;
        }
      }
      for (int64_t t = 0; t < bound; ++t) {
        const TileCoord c = map.locate(t, cu.data());
        ASSERT_EQ(c.segment, owner[size_t(t)]) << "trial " << trial << " tile " << t;
        if (c.segment >= 0) {
          ASSERT_EQ(c.tile, t - map.first(c.segment, cu[size_t(c.segment)]));
          ASSERT_LT(c.tile, map.count(lens[size_t(c.segment)]));
        }
      }
    }
  }
}

// The plan's dQ scratch: a simulated main kernel writes every (split, segment, head, row, column)
// through the layout the Plan stores, a simulated post kernel reads through the same object; every
// write must land inside the region the workspace reserves, hit no other element, and be found
// by the read. Run for the scheme the plan picks and for PaddedBatch placed in the same region.
void simulate_write_read(const DqAccumLayout& l, const Region& region, size_t ws_total,
                         const std::vector<int32_t>& lens, const std::vector<int32_t>& cu) {
  const int eb = l.elem_bytes();
  ASSERT_EQ(size_t(l.bytes()), region.bytes);
  ASSERT_LE(region.offset + region.bytes, ws_total);
  std::unordered_map<int64_t, int64_t> owner;  // byte offset in the workspace -> writer id
  int64_t id = 0;
  for (int s = 0; s < l.nsplits; ++s) {
    for (int b = 0; b < int(lens.size()); ++b) {
      for (int h = 0; h < l.heads; ++h) {
        for (int i = 0; i < lens[size_t(b)]; ++i) {
          for (int d : {0, l.dim - 1}) {  // both ends of the row
            const int64_t byte =
                int64_t(region.offset) + (l.offset(s, b, cu[size_t(b)], h, i) + d) * eb;
            ASSERT_GE(byte, int64_t(region.offset));
            ASSERT_LE(byte + eb, int64_t(region.offset + region.bytes));
            ASSERT_TRUE(owner.emplace(byte, id++).second)
                << "split " << s << " segment " << b << " head " << h << " row " << i
                << " writes an element another writer owns";
          }
        }
      }
    }
  }
  id = 0;
  for (int s = 0; s < l.nsplits; ++s) {
    for (int b = 0; b < int(lens.size()); ++b) {
      for (int h = 0; h < l.heads; ++h) {
        for (int i = 0; i < lens[size_t(b)]; ++i) {
          for (int d : {0, l.dim - 1}) {  // both ends of the row
            const int64_t byte =
                int64_t(region.offset) + (l.offset(s, b, cu[size_t(b)], h, i) + d) * eb;
            ASSERT_EQ(owner.at(byte), id++);
          }
        }
      }
    }
  }
}

Problem problem_for(const std::vector<int32_t>& lens, rattn_dq_accum accum, bool deterministic) {
  const std::vector<int32_t> cu = prefix_sums(lens);
  Problem p = default_problem();
  p.batch = int32_t(lens.size());
  p.total_q = p.total_kv = cu.back();
  p.max_seqlen_q = p.max_seqlen_kv = *std::max_element(lens.begin(), lens.end());
  p.num_heads_q = 4;
  p.num_heads_kv = 2;
  p.head_dim_qk = p.head_dim_v = 64;
  p.dq_accum = accum;
  p.deterministic = deterministic;
  p.backend = RATTN_BACKEND_CUDA_PORTABLE;
  return p;
}

TEST(PlanDqAccum, WriteAddressEqualsReadAddressInsideTheWorkspace) {
  if (!testing_util::kBuiltWithCuda) {
    GTEST_SKIP() << "CPU-only build: make_plan builds no CUDA plan, so no plan has dQ scratch "
                    "(the layout properties above still run)";
  }
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int32_t> lens = random_lengths(5000 + trial);
    for (int32_t& l : lens) l = std::min(l, 300);  // the simulation touches every row
    lens.push_back(5);                             // at least one row
    const std::vector<int32_t> cu = prefix_sums(lens);
    for (rattn_dq_accum accum : {RATTN_DQ_ACCUM_FP32, RATTN_DQ_ACCUM_BF16}) {
      SCOPED_TRACE(::testing::Message() << "trial " << trial << " dq_accum " << int(accum));
      Plan plan;
      const Status s =
          make_plan(problem_for(lens, accum, trial % 2), testing_util::fake_hopper_caps(), &plan);
      ASSERT_TRUE(s.ok()) << s.message();
      const BwdWorkspace& ws = plan.data().bwd_ws;
      ASSERT_EQ(plan.workspace_bytes(Direction::Backward), ws.total);
      simulate_write_read(ws.dq_accum, ws.dq_accum_region, ws.total, lens, cu);
      // PaddedBatch with the plan's parameters, placed where the plan's region is.
      const DqAccumLayout& c = ws.dq_accum;
      const DqAccumLayout padded =
          make_dq_accum_layout(DqSlotScheme::PaddedBatch, c.type, c.nsplits, c.batch, c.heads,
                               c.dim, plan.problem().total_q, plan.problem().max_seqlen_q, c.align);
      Region r{ws.dq_accum_region.offset, size_t(padded.bytes())};
      simulate_write_read(padded, r, r.offset + r.bytes, lens, cu);
    }
  }
}

}  // namespace
}  // namespace raggedattn

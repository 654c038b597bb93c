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
#include "core/segments.hpp"
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

// The portable backward makes a segment's base offset once and steps through heads and rows with
// head_stride() and dim: that must be offset() itself, in every scheme.
TEST_P(DqAccumLayoutProperties, OffsetIsAffineInHeadAndRow) {
  const auto [scheme, type] = GetParam();
  for (int trial = 0; trial < kLists; ++trial) {
    const std::vector<int32_t> lens = random_lengths(2000 + trial);
    const std::vector<int32_t> cu = prefix_sums(lens);
    const int32_t max_len = *std::max_element(lens.begin(), lens.end());
    const DqAccumLayout l = make_dq_accum_layout(scheme, type, 2, int32_t(lens.size()), 5, 96,
                                                 cu.back(), max_len, kAlign);
    for (int s = 0; s < l.nsplits; ++s) {
      for (int b = 0; b < int(lens.size()); ++b) {
        const int32_t len = lens[size_t(b)];
        if (len == 0) continue;
        const int64_t base = l.offset(s, b, cu[size_t(b)], 0, 0);
        for (int h = 0; h < l.heads; ++h) {
          for (int64_t i : {int64_t(0), int64_t(1) % len, int64_t(len / 2), int64_t(len - 1)}) {
            ASSERT_EQ(l.offset(s, b, cu[size_t(b)], h, i), base + h * l.head_stride() + i * l.dim)
                << "trial " << trial << " split " << s << " segment " << b << " head " << h
                << " row " << i;
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
// DqTileOrder::Wgmma64, element by element: within each segment's slot the whole 64-row tiles
// (rows past the segment's end included, as the Hopper backward writes them) are a permutation of
// the slot's rows, no two (segment, head, row, column) share an element, and nothing leaves the
// scratch.
// Where the writers put an element and where dq_convert reads it are the same: the portable
// backward writes row i at offset(.., i) + c (Rows), the Hopper backward a 64-row tile at
// offset(.., i0) in fragment order (Wgmma64); at() and at_from() (dq_convert) must agree with both.
TEST(DqAccumLayout, ReaderAgreesWithTheWritersAddresses) {
  for (int trial = 0; trial < 8; ++trial) {
    const std::vector<int32_t> lens = random_lengths(9000 + trial);
    const std::vector<int32_t> cu = prefix_sums(lens);
    const int32_t max_len = *std::max_element(lens.begin(), lens.end());
    for (DqTileOrder order : {DqTileOrder::Rows, DqTileOrder::Wgmma64}) {
      const DqAccumLayout l =
          make_dq_accum_layout(DqSlotScheme::Compact, AccumType::F32, 2, int32_t(lens.size()), 3,
                               128, cu.back(), max_len, 64, order);
      ASSERT_EQ(l.order, order);
      for (int s = 0; s < 2; ++s) {
        for (int b = 0; b < int(lens.size()); ++b) {
          for (int h = 0; h < 3; ++h) {
            const int64_t base = l.offset(s, b, cu[size_t(b)], h, 0);
            for (int64_t i : {int64_t(0), int64_t(63), int64_t(64), int64_t(lens[size_t(b)] / 2)}) {
              for (int32_t c : {0, 1, 7, 8, 63, 127}) {
                const int64_t i0 = i - i % DqAccumLayout::kTileRows;
                const int64_t writer = order == DqTileOrder::Rows
                                           ? l.offset(s, b, cu[size_t(b)], h, i) + c
                                           : l.offset(s, b, cu[size_t(b)], h, i0) +
                                                 DqAccumLayout::fragment_index(int32_t(i - i0), c);
                ASSERT_EQ(l.at(s, b, cu[size_t(b)], h, i, c), writer)
                    << "row " << i << " col " << c;
                ASSERT_EQ(l.at_from(base, i, c), writer) << "row " << i << " col " << c;
              }
            }
          }
        }
      }
    }
  }
}

TEST(DqAccumLayout, Wgmma64TilesPermuteTheirSlotRows) {
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<int32_t> lens = random_lengths(7000 + trial);
    for (int32_t& l : lens) l = std::min(l, 200);
    const std::vector<int32_t> cu = prefix_sums(lens);
    const int32_t max_len = *std::max_element(lens.begin(), lens.end());
    const int32_t dim = 64 * (1 + trial % 4);  // 64, 128, 192, 256
    for (DqSlotScheme scheme : {DqSlotScheme::Compact, DqSlotScheme::PaddedBatch}) {
      SCOPED_TRACE(::testing::Message()
                   << "trial " << trial << " dim " << dim << " scheme " << int(scheme));
      const DqAccumLayout l =
          make_dq_accum_layout(scheme, AccumType::F32, 2, int32_t(lens.size()), 2, dim, cu.back(),
                               max_len, kAlign, DqTileOrder::Wgmma64);
      ASSERT_EQ(l.order, DqTileOrder::Wgmma64);
      ASSERT_EQ(l.align % DqAccumLayout::kTileRows, 0);
      std::vector<char> seen(size_t(l.elements()), 0);
      for (int s = 0; s < 2; ++s) {
        for (int b = 0; b < int(lens.size()); ++b) {
          const int rows = int(round_up(lens[size_t(b)], DqAccumLayout::kTileRows));
          for (int h = 0; h < 2; ++h) {
            const int64_t base = l.offset(s, b, cu[size_t(b)], h, 0);
            for (int i = 0; i < rows; ++i) {
              for (int c = 0; c < dim; ++c) {
                const int64_t e = l.at(s, b, cu[size_t(b)], h, i, c);
                ASSERT_GE(e, base);
                ASSERT_LT(e, base + int64_t(rows) * dim)
                    << "row " << i << " column " << c << " of segment " << b << " leaves its slot";
                ASSERT_EQ(seen[size_t(e)]++, 0) << "segment " << b << " head " << h << " row " << i
                                                << " column " << c << " shares an element";
              }
            }
          }
        }
      }
    }
  }
}

// The Hopper backward's claims (BwdWorkspace::dq_claims): warp 1 claims the tile at tile_of of the
// offset it writes the tile at (offset(0, b, cu_q, head, m0), m0 a multiple of 64), and dq_convert
// looks up the claim of the tile it reads the same way. Every element of a 64-row tile of a slot
// must map to that tile's claim, no two tiles (of any segments or heads) to the same claim, and
// every claim must lie inside [0, tiles()): otherwise one key tile's claim would hide another
// tile's writer, and a tile could be converted as unwritten.
TEST(DqAccumLayout, Wgmma64TilesHaveOneClaimEach) {
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<int32_t> lens = random_lengths(9000 + trial);
    for (int32_t& l : lens) l = std::min(l, 700);
    const std::vector<int32_t> cu = prefix_sums(lens);
    const int32_t max_len = *std::max_element(lens.begin(), lens.end());
    const int32_t dim = 64 * (1 + trial % 4);
    const int heads = 1 + trial % 3;
    const DqAccumLayout l = make_dq_accum_layout(
        DqSlotScheme::Compact, trial % 2 ? AccumType::BF16 : AccumType::F32, 1,
        int32_t(lens.size()), heads, dim, cu.back(), max_len, kAlign, DqTileOrder::Wgmma64);
    ASSERT_EQ(l.order, DqTileOrder::Wgmma64);
    ASSERT_EQ(l.elements() % l.tile_elems(), 0) << "the scratch is whole tiles";
    std::vector<int> claimed(size_t(l.tiles()), 0);
    for (int b = 0; b < int(lens.size()); ++b) {
      for (int h = 0; h < heads; ++h) {
        for (int m0 = 0; m0 < lens[size_t(b)]; m0 += DqAccumLayout::kTileRows) {
          const int64_t tile = l.tile_of(l.offset(0, b, cu[size_t(b)], h, m0));
          ASSERT_GE(tile, 0);
          ASSERT_LT(tile, l.tiles()) << "segment " << b << " head " << h << " rows from " << m0;
          ASSERT_EQ(claimed[size_t(tile)]++, 0)
              << "segment " << b << " head " << h << " rows from " << m0 << " share a claim";
          // Every element the tile holds (its 64 rows, past the segment's end too) is the tile's.
          for (int r : {0, 1, 8, 17, 63}) {
            for (int c : {0, 1, dim - 1}) {
              ASSERT_EQ(l.tile_of(l.at(0, b, cu[size_t(b)], h, m0 + r, c)), tile);
            }
          }
        }
      }
    }
  }
}

// The kernel's side of Wgmma64: warpgroup thread u's fp32 accumulator of an m64nN wgmma holds,
// for each 8-column fragment f, elements e = 0..3 at row 16 (u / 32) + (u % 32) / 4 + 8 (e / 2),
// column 8 f + 2 (u % 4) + e % 2 (the PTX ISA's accumulator layout), and the Hopper backward stores
// them as one vector at fragment_index(first row, first column) + f * kPanelElems.
TEST(DqAccumLayout, Wgmma64IsTheAccumulatorFragmentOrder) {
  for (int dim : {64, 128, 192, 256}) {
    for (int u = 0; u < 128; ++u) {
      const int row = 16 * (u / 32) + (u % 32) / 4, col = 2 * (u % 4);
      // The reader's inverse (dq_convert reads a tile vector by vector).
      ASSERT_EQ(DqAccumLayout::vector_row(u), row) << "thread " << u;
      ASSERT_EQ(DqAccumLayout::vector_col(u), col) << "thread " << u;
      const int32_t at0 = DqAccumLayout::fragment_index(row, col);
      EXPECT_EQ(at0, 4 * u);
      for (int f = 0; f < dim / 8; ++f) {
        for (int e = 0; e < 4; ++e) {
          EXPECT_EQ(DqAccumLayout::fragment_index(row + 8 * (e / 2), 8 * f + col + e % 2),
                    at0 + f * DqAccumLayout::kPanelElems + e)
              << "thread " << u << " fragment " << f << " element " << e;
        }
      }
    }
  }
}

// Tile order needs whole tiles in every slot: PackedTokens keeps row order, and the alignment is
// raised to whole tiles.
TEST(DqAccumLayout, Wgmma64OnlyWhereSlotsHoldWholeTiles) {
  const DqAccumLayout packed = make_dq_accum_layout(DqSlotScheme::PackedTokens, AccumType::F32, 1,
                                                    3, 2, 64, 300, 200, 16, DqTileOrder::Wgmma64);
  EXPECT_EQ(packed.order, DqTileOrder::Rows);
  const DqAccumLayout compact = make_dq_accum_layout(DqSlotScheme::Compact, AccumType::BF16, 1, 3,
                                                     2, 64, 300, 200, 16, DqTileOrder::Wgmma64);
  EXPECT_EQ(compact.order, DqTileOrder::Wgmma64);
  EXPECT_EQ(compact.align, 64);
  const DqAccumLayout rows = make_dq_accum_layout(DqSlotScheme::Compact, AccumType::BF16, 1, 3, 2,
                                                  64, 300, 200, 16, DqTileOrder::Rows);
  EXPECT_EQ(rows.align, 16);
  for (int i = 0; i < 300; ++i) {
    for (int c = 0; c < 64; ++c)
      EXPECT_EQ(rows.at(0, 0, 0, 1, i, c), rows.offset(0, 0, 0, 1, i) + c);
  }
}

// first() is the documented closed form floor((cu[b] + b * tile) / tile), computed in 64 bits,
// up to the largest cu_seqlens value an int32 holds (its 32-bit division must not wrap).
TEST(RaggedTiles, FirstIsTheClosedForm) {
  for (int32_t tile : {16, 64, 96, 128}) {
    const RaggedTiles map{tile, 1 << 20};
    for (int32_t cu : {0, 1, 63, 64, 65, 127, 128, 1000003, 1 << 30, 2147483520, 2147483647}) {
      for (int b : {0, 1, 7, 77, 4095, (1 << 20) - 1}) {
        const int64_t expect = (int64_t(cu) + int64_t(b) * tile) / tile;
        ASSERT_EQ(map.first(b, cu), expect) << "tile " << tile << " cu " << cu << " b " << b;
      }
    }
  }
}

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

// Rows a main kernel writes per segment: the Hopper backward (tile order Wgmma64) adds whole
// 64-row tiles, rows past the segment's end included.
int written_rows(const DqAccumLayout& l, int len) {
  return l.order == DqTileOrder::Wgmma64 ? int(round_up(len, DqAccumLayout::kTileRows)) : len;
}
// Columns probed per row: both ends, and both sides of the first panel boundaries.
std::vector<int> probe_columns(const DqAccumLayout& l) {
  std::vector<int> c = {0, 1, 2, 7, 8, 9, l.dim - 1};
  c.erase(std::remove_if(c.begin(), c.end(), [&](int x) { return x >= l.dim; }), c.end());
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  return c;
}

// The plan's dQ scratch: a simulated main kernel writes (split, segment, head, row, column)
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
        for (int i = 0; i < written_rows(l, lens[size_t(b)]); ++i) {
          for (int d : probe_columns(l)) {
            const int64_t byte = int64_t(region.offset) + l.at(s, b, cu[size_t(b)], h, i, d) * eb;
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
        for (int i = 0; i < written_rows(l, lens[size_t(b)]); ++i) {
          for (int d : probe_columns(l)) {
            const int64_t byte = int64_t(region.offset) + l.at(s, b, cu[size_t(b)], h, i, d) * eb;
            ASSERT_EQ(owner.at(byte), id++);
          }
        }
      }
    }
  }
}

Problem problem_for(const std::vector<int32_t>& lens, rattn_dq_accum accum, bool deterministic,
                    rattn_backend backend) {
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
  p.backend = backend;
  return p;
}

// The dQ scratch's zeroing split over the dot(dO, O) kernel's CTAs: every word in exactly one
// CTA's range, ranges in order, also with more CTAs than words.
TEST(EvenShare, RangesCoverEveryItemOnceInOrder) {
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(64), size_t(1000), size_t(33554432)}) {
    for (size_t parts : {size_t(1), size_t(3), size_t(64), size_t(999), size_t(18944)}) {
      SCOPED_TRACE(::testing::Message() << n << " items, " << parts << " parts");
      size_t next = 0;
      for (size_t part = 0; part < parts; ++part) {
        const EvenShare r = even_share(n, part, parts);
        ASSERT_EQ(r.begin, next);
        ASSERT_LE(r.begin, r.end);
        next = r.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

// row_in_segment (the zero_padding mode's one membership test, on the host and in padding.cu)
// against rows marked segment by segment, packed and padded, with empty segments, gaps of zero
// rows and rows before the first and past the last segment.
TEST(RowInSegment, AgreesWithTheMarkedRows) {
  for (int list = 0; list < kLists; ++list) {
    const std::vector<int32_t> lens = random_lengths(9000 + list);
    const std::vector<int32_t> cu = prefix_sums(lens);
    const int32_t batch = int32_t(lens.size());
    verify::Rng r(77 + list);
    for (const bool padded : {false, true}) {
      std::vector<int32_t> off(lens.size() + 1, 0);
      int64_t row = padded ? r.range(0, 3) : 0;
      std::vector<uint8_t> inside;
      inside.assign(size_t(row), 0);
      for (int32_t b = 0; b < batch; ++b) {
        off[size_t(b)] = int32_t(row);
        inside.insert(inside.end(), size_t(lens[size_t(b)]), 1);
        row += lens[size_t(b)];
        if (padded) {
          const int64_t gap = r.chance(0.4) ? 0 : r.range(1, 5);
          inside.insert(inside.end(), size_t(gap), 0);
          row += gap;
        }
      }
      const int64_t tail = r.range(0, 6);
      inside.insert(inside.end(), size_t(tail), 0);
      SCOPED_TRACE(::testing::Message() << "list " << list << (padded ? " padded" : " packed"));
      for (int64_t t = 0; t < int64_t(inside.size()); ++t) {
        ASSERT_EQ(row_in_segment(cu.data(), padded ? off.data() : nullptr, batch, t),
                  inside[size_t(t)] != 0)
            << "row " << t;
      }
    }
  }
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
    for (rattn_backend backend : {RATTN_BACKEND_CUDA_PORTABLE, RATTN_BACKEND_CUDA_SM90}) {
      if (backend == RATTN_BACKEND_CUDA_SM90 && !path_in_build(Path::CudaSm90)) continue;
      for (rattn_dq_accum accum : {RATTN_DQ_ACCUM_FP32, RATTN_DQ_ACCUM_BF16}) {
        SCOPED_TRACE(::testing::Message() << "trial " << trial << " backend " << int(backend)
                                          << " dq_accum " << int(accum));
        Plan plan;
        const Status s = make_plan(problem_for(lens, accum, trial % 2, backend),
                                   testing_util::fake_hopper_caps(), &plan);
        ASSERT_TRUE(s.ok()) << s.message();
        const BwdWorkspace& ws = plan.data().bwd_ws;
        ASSERT_EQ(plan.workspace_bytes(Direction::Backward), ws.total);
        // The Hopper backward's tiles in its accumulators' order, whole 64-row tiles per slot;
        // the portable backward's rows in order.
        const bool hopper = backend == RATTN_BACKEND_CUDA_SM90;
        ASSERT_EQ(ws.dq_accum.order, hopper ? DqTileOrder::Wgmma64 : DqTileOrder::Rows);
        ASSERT_EQ(ws.dq_accum.align % (hopper ? DqAccumLayout::kTileRows : 16), 0);
        simulate_write_read(ws.dq_accum, ws.dq_accum_region, ws.total, lens, cu);
        // The dot(dO, O) kernel zeroes the region in aligned 16-byte words (bwd_post.cuh).
        EXPECT_EQ(ws.dq_accum_region.offset % 16, 0u);
        EXPECT_EQ(ws.dq_accum_region.bytes % 16, 0u);
        // PaddedBatch with the plan's parameters, placed where the plan's region is.
        const DqAccumLayout& c = ws.dq_accum;
        const DqAccumLayout padded = make_dq_accum_layout(
            DqSlotScheme::PaddedBatch, c.type, c.nsplits, c.batch, c.heads, c.dim,
            plan.problem().total_q, plan.problem().max_seqlen_q, c.align, c.order);
        Region r{ws.dq_accum_region.offset, size_t(padded.bytes())};
        simulate_write_read(padded, r, r.offset + r.bytes, lens, cu);
      }
    }
  }
}

}  // namespace
}  // namespace raggedattn

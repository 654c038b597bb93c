// The backward's traversal of a mask, checked without a GPU: every CTA owns one key tile and
// steps through MaskSpec::query_tiles; the deterministic mode orders the key tiles adding into a
// query tile by MaskSpec::key_tile_turn and waits for each turn in turn. So, for every mask, head
// dims' tile shapes and lengths (0, 1, not multiples of 16, shorter and longer than a tile):
//   - every visible (query, key) pair is in a step of its key tile (no dQ, dK, dV term lost);
//   - a key tile's query tiles lie inside the segment;
//   - the key tiles that step through a query tile take turns 0, 1, 2, ... with no gap and no
//     repeat (a missing turn would leave the later key tiles waiting forever).
#include "core/mask.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/portable_shapes.hpp"
#include "core/sm90_shapes.hpp"
#include "cuda/portable/instantiations.hpp"
#include "plan/policy.hpp"

namespace raggedattn {
namespace {

// The (block_m, block_n) of every backward kernel: both paths, every head-dim pair.
std::set<std::pair<int, int>> backward_tiles() {
  std::set<std::pair<int, int>> tiles;
#define RATTN_ADD_PORTABLE(DQK, DV) \
  tiles.insert({portable::bwd_config(DQK, DV).block_m, portable::bwd_config(DQK, DV).block_n});
  RATTN_PORTABLE_HEAD_DIMS(RATTN_ADD_PORTABLE)
#undef RATTN_ADD_PORTABLE
#define RATTN_ADD_SM90(DQK, DV) \
  tiles.insert(                 \
      {sm90::bwd_config(DQK, DV, false).block_m, sm90::bwd_config(DQK, DV, false).block_n});
  RATTN_SM90_BWD_HEAD_DIMS(RATTN_ADD_SM90)
#undef RATTN_ADD_SM90
  return tiles;
}

// One of a's entries, drawn from rng.
template <class T, size_t N>
T pick(std::mt19937& rng, const T (&a)[N]) {
  return a[rng() % N];
}

// A mask drawn from rng: the window's left and right reach from `lefts` and `rights` (-1: none),
// aligned at either diagonal.
template <size_t L, size_t R>
MaskSpec random_mask(std::mt19937& rng, const int (&lefts)[L], const int (&rights)[R]) {
  MaskSpec m;
  m.left = pick(rng, lefts);
  m.right = pick(rng, rights);
  m.bottom_right = int(rng() % 2);
  return m;
}

// The segment lengths and window reaches the random traversal tests draw from.
constexpr int kLengths[] = {0, 1, 2, 15, 17, 63, 64, 65, 127, 128, 129, 200, 255, 300};
constexpr int kLefts[] = {-1, 0, 1, 7, 40, 64, 129, 500};
constexpr int kRights[] = {-1, 0, 1, 8, 50, 130};

std::string describe(const MaskSpec& m, int len_q, int len_kv, int bm, int bn) {
  std::ostringstream s;
  s << "mask (left " << m.left << ", right " << m.right << ", bottom_right " << m.bottom_right
    << "), len_q " << len_q << ", len_kv " << len_kv << ", tiles " << bm << " x " << bn;
  return s.str();
}

TEST(MaskTraversal, EveryVisiblePairIsSteppedAndTurnsRunWithoutGaps) {
  const std::set<std::pair<int, int>> tiles = backward_tiles();
  ASSERT_FALSE(tiles.empty());
  std::mt19937 rng(20261130);
  int checked = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const MaskSpec m = random_mask(rng, kLefts, kRights);
    const int len_q = pick(rng, kLengths), len_kv = pick(rng, kLengths);
    for (const auto& [bm, bn] : tiles) {
      const std::string what = describe(m, len_q, len_kv, bm, bn);
      const int q_tiles = (len_q + bm - 1) / bm, k_tiles = (len_kv + bn - 1) / bn;
      // stepped[q][k]: key tile k steps through query tile q.
      const std::vector<char> no_steps(static_cast<size_t>(k_tiles), 0);
      std::vector<std::vector<char>> stepped(static_cast<size_t>(q_tiles), no_steps);
      for (int k = 0; k < k_tiles; ++k) {
        const int n0 = k * bn, keys = std::min(bn, len_kv - n0);
        const TileSpan t = m.query_tiles(n0, keys, bm, len_q, len_kv);
        ASSERT_GE(t.count, 0) << what;
        if (t.count == 0) continue;
        ASSERT_GE(t.first, 0) << what << ", key tile " << k;
        ASSERT_LE(t.first + t.count, q_tiles) << what << ", key tile " << k;
        for (int q = t.first; q < t.first + t.count; ++q) stepped[size_t(q)][size_t(k)] = 1;
      }
      for (int i = 0; i < len_q; ++i) {
        for (int j = 0; j < len_kv; ++j) {
          if (m.visible(i, j, len_q, len_kv)) {
            ASSERT_TRUE(stepped[size_t(i / bm)][size_t(j / bn)])
                << what << ": query " << i << " sees key " << j << " but no step covers it";
          }
        }
      }
      for (int q = 0; q < q_tiles; ++q) {
        int turn = 0;
        for (int k = 0; k < k_tiles; ++k) {
          if (!stepped[size_t(q)][size_t(k)]) continue;
          ASSERT_EQ(m.key_tile_turn(k, int64_t(q) * bm, bn, len_q, len_kv), turn)
              << what << ": query tile " << q << ", key tile " << k;
          ++turn;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 1000);  // the loops ran over real tiles, not only empty segments
}

// The backward's step order over a key tile's query tiles (MaskSpec::query_rotation and
// rotated_tile, what both backward kernels' loops step by): every query tile of the span once per
// query head; where the additions take turns, or a key tile's span is not the whole segment, in
// tile order (rot 0); and the key tiles that step through the whole segment start apart, so at
// any step at most ceil(key tiles / query tiles) of them are on one query tile.
TEST(MaskTraversal, RotatedStepsCoverTheSpanAndSpreadTheKeyTiles) {
  const std::set<std::pair<int, int>> tiles = backward_tiles();
  std::mt19937 rng(20261203);
  int rotated = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const MaskSpec m = random_mask(rng, kLefts, kRights);
    const int len_q = pick(rng, kLengths), len_kv = pick(rng, kLengths);
    for (const auto& [bm, bn] : tiles) {
      const int q_tiles = (len_q + bm - 1) / bm, k_tiles = (len_kv + bn - 1) / bn;
      for (const bool ordered : {false, true}) {
        const std::string what =
            describe(m, len_q, len_kv, bm, bn) + (ordered ? ", ordered" : ", unordered");
        // on[qt][q]: the whole-span key tiles on query tile q at step qt.
        std::vector<std::vector<int>> on(size_t(q_tiles), std::vector<int>(size_t(q_tiles), 0));
        int whole = 0;
        for (int k = 0; k < k_tiles; ++k) {
          const int n0 = k * bn, keys = std::min(bn, len_kv - n0);
          const TileSpan t = m.query_tiles(n0, keys, bm, len_q, len_kv);
          if (t.count == 0) continue;
          const int rot = MaskSpec::query_rotation(t, k, bm, len_q, ordered);
          const bool is_whole = t.first == 0 && t.count == q_tiles;
          ASSERT_TRUE(rot >= 0 && rot < t.count) << what << ", key tile " << k;
          if (ordered || !is_whole) {
            ASSERT_EQ(rot, 0) << what << ", key tile " << k;
          }
          std::vector<int> hits(size_t(q_tiles), 0);
          for (int qt = 0; qt < t.count; ++qt) {
            const int q = MaskSpec::rotated_tile(t, rot, qt);
            ASSERT_TRUE(q >= t.first && q < t.first + t.count) << what << ", key tile " << k;
            ++hits[size_t(q)];
            if (is_whole) ++on[size_t(qt)][size_t(q)];
          }
          for (int q = t.first; q < t.first + t.count; ++q) {
            ASSERT_EQ(hits[size_t(q)], 1) << what << ", key tile " << k << ", query tile " << q;
          }
          whole += is_whole ? 1 : 0;
          rotated += rot > 0 ? 1 : 0;
        }
        if (ordered || whole == 0) continue;
        const int most = (whole + q_tiles - 1) / q_tiles;
        for (int qt = 0; qt < q_tiles; ++qt) {
          for (int q = 0; q < q_tiles; ++q) {
            ASSERT_LE(on[size_t(qt)][size_t(q)], most)
                << what << ": " << whole << " whole-span key tiles, step " << qt;
          }
        }
      }
    }
  }
  EXPECT_GT(rotated, 100);  // the rotation ran, not only rot 0
}

// The forward's side (MaskSpec::key_tiles, what the Plan's policy::fwd_mean_key_tiles counts): the
// key tiles of a query tile cover every key its rows see, and its first and last hold one.
TEST(MaskTraversal, KeyTilesOfAQueryTileHoldEveryKeyItSees) {
  std::mt19937 rng(20261202);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const MaskSpec m = random_mask(rng, kLefts, kRights);
    const int len_q = pick(rng, kLengths), len_kv = pick(rng, kLengths);
    for (const int bm : {64, 128}) {
      for (const int bn : {64, 128}) {
        const std::string what = describe(m, len_q, len_kv, bm, bn);
        for (int m0 = 0; m0 < len_q; m0 += bm) {
          const int rows = std::min(bm, len_q - m0);
          const TileSpan t = m.key_tiles(m0, rows, bn, len_q, len_kv);
          ASSERT_GE(t.count, 0) << what;
          std::vector<char> seen(size_t((len_kv + bn - 1) / bn), 0);
          for (int i = m0; i < m0 + rows; ++i) {
            for (int j = 0; j < len_kv; ++j) {
              if (m.visible(i, j, len_q, len_kv)) seen[size_t(j / bn)] = 1;
            }
          }
          for (int k = 0; k < int(seen.size()); ++k) {
            if (seen[size_t(k)]) {
              ASSERT_TRUE(k >= t.first && k < t.first + t.count)
                  << what << ": query rows from " << m0 << " see key tile " << k;
            }
          }
          if (t.count > 0) {
            EXPECT_TRUE(seen[size_t(t.first)] && seen[size_t(t.first + t.count - 1)])
                << what << ": query rows from " << m0;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

// One causal case by hand, so that the general checks above rest on known values: 200 tokens,
// 64-query steps, 128-key tiles.
TEST(MaskTraversal, CausalTilesByHand) {
  MaskSpec causal;
  causal.right = 0;
  const int len = 200, bm = 64, bn = 128;
  const TileSpan first = causal.query_tiles(0, bn, bm, len, len);
  EXPECT_EQ(first.first, 0);  // rows 0..199 all see some key of 0..127: query tiles 0..3
  EXPECT_EQ(first.count, 4);
  const TileSpan last = causal.query_tiles(128, len - 128, bm, len, len);
  EXPECT_EQ(last.first, 2);  // row 128 is the first to see key 128: query tiles 2..3
  EXPECT_EQ(last.count, 2);
  EXPECT_EQ(causal.key_tile_turn(0, 128, bn, len, len), 0);  // query tile 2: key tile 0 first,
  EXPECT_EQ(causal.key_tile_turn(1, 128, bn, len, len), 1);  // then key tile 1
}

// The bounds the Hopper kernels narrow their products by, checked by brute force over masks and
// lengths: for a block of consecutive rows, no row sees a key before key_begin(first row) or from
// key_end(last row) on (the forward's keys per consumer, item 59 of PERFORMANCE.md); for a block
// of consecutive keys, no row before query_begin(first key) or from query_end(last key) on sees
// one of them (the rows a backward consumer's keys are seen by). Either failing would let a
// kernel skip a product some row needs.
TEST(MaskRanges, BlocksOfRowsAndKeysBoundWhatTheySee) {
  std::mt19937 rng(20261201);
  const int lengths[] = {1, 2, 15, 17, 63, 64, 65, 127, 128, 129, 200};
  const int lefts[] = {-1, 0, 1, 7, 40, 64, 129};
  const int rights[] = {-1, 0, 1, 8, 50, 130};
  const int blocks[] = {1, 3, 16, 64, 128};
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const MaskSpec m = random_mask(rng, lefts, rights);
    const int len_q = pick(rng, lengths), len_kv = pick(rng, lengths), b = pick(rng, blocks);
    const std::string what = describe(m, len_q, len_kv, b, b);
    for (int r0 = 0; r0 < len_q; r0 += b) {
      const int r1 = std::min(len_q, r0 + b);
      const int lo = m.key_begin(r0, len_q, len_kv), hi = m.key_end(r1 - 1, len_q, len_kv);
      for (int i = r0; i < r1; ++i)
        for (int j = 0; j < len_kv; ++j)
          if (m.visible(i, j, len_q, len_kv)) {
            ASSERT_TRUE(j >= lo && j < hi)
                << what << ": rows from " << r0 << ", row " << i << " sees key " << j
                << " outside [" << lo << ", " << hi << ")";
          }
      ++checked;
    }
    for (int k0 = 0; k0 < len_kv; k0 += b) {
      const int k1 = std::min(len_kv, k0 + b);
      const int lo = m.query_begin(k0, len_q, len_kv), hi = m.query_end(k1 - 1, len_q, len_kv);
      for (int i = 0; i < len_q; ++i)
        for (int j = k0; j < k1; ++j)
          if (m.visible(i, j, len_q, len_kv)) {
            ASSERT_TRUE(i >= lo && i < hi)
                << what << ": keys from " << k0 << ", row " << i << " sees key " << j
                << " outside rows [" << lo << ", " << hi << ")";
          }
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000);
}

}  // namespace
}  // namespace raggedattn

// The kernels' shared-memory layouts, which the Plan sizes launches from and the kernels address
// by (src/core/portable_shapes.hpp, src/core/sm90_shapes.hpp): for every instantiated head-dim
// pair (and, on the portable path, every stage count, with or without the staged dQ tile), the
// regions are disjoint, inside the allocation and aligned for their accesses (cp.async, ldmatrix
// and bulk copies: 16 bytes; the Hopper path's 128-byte-swizzled tiles: 1024; mbarriers: 8), and
// the portable path's padded row pitches keep ldmatrix's eight 16-byte rows on distinct banks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "core/portable_shapes.hpp"
#include "cuda/portable/instantiations.hpp"
#include "core/sm90_shapes.hpp"

namespace raggedattn {
namespace {

struct Region {
  std::string name;
  size_t begin, end;
  size_t align = 16;  // what its accesses need
};

struct Dims {
  int dqk, dv;
};
#define RATTN_LIST_DIMS(DQK, DV) Dims{DQK, DV},
const std::vector<Dims> kDims = {RATTN_PORTABLE_HEAD_DIMS(RATTN_LIST_DIMS)};
#undef RATTN_LIST_DIMS

void expect_disjoint_inside(std::vector<Region> regions, size_t bytes, const std::string& what) {
  std::sort(regions.begin(), regions.end(),
            [](const Region& a, const Region& b) { return a.begin < b.begin; });
  for (size_t i = 0; i < regions.size(); ++i) {
    EXPECT_LT(regions[i].begin, regions[i].end) << what << ": " << regions[i].name << " is empty";
    EXPECT_LE(regions[i].end, bytes) << what << ": " << regions[i].name << " runs past the end";
    EXPECT_EQ(regions[i].begin % regions[i].align, 0u)
        << what << ": " << regions[i].name << " not " << regions[i].align << "-byte aligned";
    if (i + 1 < regions.size()) {
      EXPECT_LE(regions[i].end, regions[i + 1].begin)
          << what << ": " << regions[i].name << " overlaps " << regions[i + 1].name;
    }
  }
}

// A 16-bit row pitch (elements) whose 16-byte rows, eight at a time (one ldmatrix), fall on
// distinct banks: a multiple of 16 bytes that is 4 words modulo 8 words.
void expect_conflict_free_pitch(int pitch, const std::string& what) {
  EXPECT_EQ(pitch * 2 % 16, 0) << what << " pitch " << pitch;
  EXPECT_EQ(pitch * 2 / 4 % 8, 4) << what << " pitch " << pitch;
}

TEST(PortableSmem, BackwardRegionsAreDisjointAlignedAndInside) {
  for (const Dims& d : kDims) {
    const portable::BwdConfig c = portable::bwd_config(d.dqk, d.dv);
    for (int stages : {1, 2}) {
      for (bool staged : {false, true}) {
        const portable::BwdSmem L = portable::bwd_smem(d.dqk, d.dv, stages, staged);
        const std::string what = "bwd D=" + std::to_string(d.dqk) + "/" + std::to_string(d.dv) +
                                 " stages=" + std::to_string(stages) + (staged ? " dQ staged" : "");
        std::vector<Region> r = {
            {"K", L.k, L.k + size_t(c.block_n) * L.k_pitch * 2},
            {"V", L.v, L.v + size_t(c.block_n) * L.v_pitch * 2},
            {"Q stages", L.q, L.q + L.q_stage * stages},
            {"dO stages", L.d_o, L.d_o + L.do_stage * stages},
            {"P^T", L.pt, L.pt + size_t(c.block_n) * L.s_pitch * 2},
            {"dS^T", L.dst, L.dst + size_t(c.block_n) * L.s_pitch * 2},
            {"LSE stages", L.lse, L.lse + L.stat_stage * stages},
            {"dot stages", L.dpsum, L.dpsum + L.stat_stage * stages},
        };
        EXPECT_EQ(L.q_stage, size_t(c.block_m) * L.q_pitch * 2) << what;
        EXPECT_EQ(L.do_stage, size_t(c.block_m) * L.do_pitch * 2) << what;
        EXPECT_EQ(L.stat_stage, size_t(c.block_m) * 4) << what;
        if (staged) {
          // The staged dQ tile is in the scratch's row layout (rows dqk floats apart), so one bulk
          // copy moves a query tile's rows.
          EXPECT_EQ(L.dq_pitch, d.dqk) << what;
          EXPECT_EQ(L.dq % 128, 0u) << what;
          EXPECT_EQ(L.bytes, L.dq + size_t(c.block_m) * d.dqk * 4) << what;
          r.push_back({"staged dQ", L.dq, L.dq + size_t(c.block_m) * L.dq_pitch * 4});
        } else {
          EXPECT_EQ(L.dq_pitch, 0) << what;
          EXPECT_EQ(L.dq, L.bytes) << what;
        }
        expect_disjoint_inside(r, L.bytes, what);
        for (int pitch : {L.q_pitch, L.k_pitch, L.v_pitch, L.do_pitch, L.s_pitch}) {
          expect_conflict_free_pitch(pitch, what);
        }
      }
    }
  }
}

// The staged dQ tile's stores (portable backward, sm_90 build): each thread writes every chunk of
// its row exactly once, and one store of a warp (rows lane / 4 = 0..7, the four lanes of a row
// two floats each) takes at most 2 passes over the 32 banks where the chunk's block has 4 or more
// chunks, 4 in a block of 2 (8 if every row wrote the same chunk: the rows are 128-byte
// multiples apart).
TEST(PortableSmem, StagedDqStoresSpreadOverTheBanks) {
  for (const Dims& d : kDims) {
    const int cols = portable::bwd_dq_warp_cols(d.dqk, d.dv), nc = cols / 8;
    const std::string what = "D=" + std::to_string(d.dqk) + "/" + std::to_string(d.dv);
    ASSERT_EQ(cols % 8, 0) << what;
    ASSERT_EQ(d.dqk * 4 % 128, 0) << what << ": rows not 128-byte multiples apart";
    for (int r = 0; r < 8; ++r) {
      std::vector<int> seen(nc, 0);
      for (int k = 0; k < nc; ++k) {
        const int c = portable::dq_stage_chunk(k, r, nc);
        ASSERT_TRUE(c >= 0 && c < nc) << what << " row " << r << " store " << k << ": chunk " << c;
        ++seen[c];
      }
      for (int c = 0; c < nc; ++c) EXPECT_EQ(seen[c], 1) << what << " row " << r << " chunk " << c;
    }
    for (int col0 = 0; col0 < d.dqk; col0 += cols) {  // every warp's column range
      for (int k = 0; k < nc; ++k) {
        std::vector<int> words_per_bank(32, 0);
        for (int r = 0; r < 8; ++r)
          for (int q = 0; q < 4; ++q)
            for (int e = 0; e < 2; ++e) {
              const int word =
                  r * d.dqk + col0 + portable::dq_stage_chunk(k, r, nc) * 8 + 2 * q + e;
              ++words_per_bank[word % 32];
            }
        const int passes = *std::max_element(words_per_bank.begin(), words_per_bank.end());
        const portable::DqStageBlocks b = portable::dq_stage_blocks(nc);
        const int block = k < b.first ? b.first : b.second;
        ASSERT_EQ(portable::pow2_floor(block), block) << what << ": a block of " << block;
        EXPECT_LE(passes, block >= 4 ? 2 : 8 / block)
            << what << " columns from " << col0 << ", store " << k << " (block of " << block << ")";
      }
    }
  }
}

TEST(PortableSmem, ForwardRegionsAreDisjointAlignedAndInside) {
  for (const Dims& d : kDims) {
    const portable::FwdConfig c = portable::fwd_config(d.dqk, d.dv);
    const portable::FwdSmem L = portable::fwd_smem(d.dqk, d.dv);
    const std::string what = "fwd D=" + std::to_string(d.dqk) + "/" + std::to_string(d.dv);
    expect_disjoint_inside({{"Q", L.q, L.q + size_t(c.block_m) * L.q_pitch * 2},
                            {"K", L.k, L.k + size_t(c.block_n) * L.k_pitch * 2},
                            {"V", L.v, L.v + size_t(c.block_n) * L.v_pitch * 2}},
                           L.bytes, what);
    for (int pitch : {L.q_pitch, L.k_pitch, L.v_pitch}) expect_conflict_free_pitch(pitch, what);
  }
}

// The Hopper path's pairs (both directions).
const std::vector<Dims> kSm90Dims = {{64, 64}, {128, 128}, {192, 128}, {256, 256}};

TEST(Sm90Smem, ForwardRegionsAreDisjointAlignedAndInside) {
  for (const Dims& d : kSm90Dims) {
    ASSERT_TRUE(sm90::fwd_supports(d.dqk, d.dv));
    for (bool persistent : {false, true}) {
      const sm90::FwdConfig c = sm90::fwd_config(d.dqk, d.dv, persistent);
      const sm90::FwdSmem L = sm90::fwd_smem(d.dqk, d.dv, persistent);
      const std::string what = "sm90 fwd D=" + std::to_string(d.dqk) + "/" + std::to_string(d.dv) +
                               (persistent ? " persistent" : " grid");
      std::vector<Region> r = {
          {"Q buffers", L.q, L.q + L.q_buffers * L.q_stage, 1024},
          {"K stages", L.k, L.k + c.stages * L.k_stage, 1024},
          {"V stages", L.v, L.v + c.stages * L.v_stage, 1024},
          {"mbarriers", L.bars, L.bars + sm90::fwd_barriers(d.dqk, d.dv, persistent) * 8, 8},
          {"fetched indices", L.slots, L.slots + 2 * 8, 8},
          {"item slots", L.items, L.items + L.q_buffers * sm90::kFwdItemBytes, 8}};
      // Stages are whole swizzle atoms, so every stage of a ring starts 1024-aligned too.
      for (size_t stage : {L.q_stage, L.k_stage, L.v_stage}) EXPECT_EQ(stage % 1024, 0u) << what;
      // The kernel aligns its base up to kSmemAlign inside the allocation: the layout must fit
      // in what is left.
      expect_disjoint_inside(r, L.bytes - sm90::kSmemAlign, what);
      EXPECT_LE(L.bytes, size_t(227) * 1024) << what;
    }
  }
}

TEST(Sm90Smem, BackwardRegionsAreDisjointAlignedAndInside) {
  for (const Dims& d : kSm90Dims) {
    ASSERT_TRUE(sm90::bwd_supports(d.dqk, d.dv));
    const bool split = sm90::bwd_column_split(d.dqk, d.dv);
    // Both of the column split's kernels (dQ through the tile, dQ from registers), the key
    // split's one.
    for (bool dq_regs : split ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      const sm90::BwdConfig c = sm90::bwd_config(d.dqk, d.dv, dq_regs);
      const sm90::BwdSmem L = sm90::bwd_smem(d.dqk, d.dv, dq_regs);
      const std::string what = "sm90 bwd D=" + std::to_string(d.dqk) + "/" + std::to_string(d.dv) +
                               (dq_regs ? " dQ from registers" : "");
      // The dQ tile holds the step's 64 x Dqk fp32 accumulators (the larger scratch type), or is
      // absent where they go from registers.
      EXPECT_EQ(L.dq_tile, dq_regs ? 0u : size_t(c.block_m) * d.dqk * 4) << what;
      std::vector<Region> r = {{"K", L.k, L.k + sm90::tile_bytes(c.block_n, d.dqk), 1024},
                               {"V", L.v, L.v + sm90::tile_bytes(c.block_n, d.dv), 1024},
                               {"Q stages", L.q, L.q + c.stages * L.q_stage, 1024},
                               {"dO stages", L.d_o, L.d_o + c.stages * L.do_stage, 1024},
                               {"dS^T buffers", L.ds, L.ds + L.ds_buffers * L.ds_stage, 1024},
                               {"LSE stages", L.lse, L.lse + c.stages * L.stat_stage, 16},
                               {"dot stages", L.dpsum, L.dpsum + c.stages * L.stat_stage, 16},
                               {"mbarriers", L.bars, L.bars + sm90::bwd_barriers(c.stages, c.consumers) * 8, 8}};
      if (L.dq_tile > 0) r.push_back({"dQ tile", L.dq, L.dq + L.dq_tile, 16});
      for (size_t stage : {L.q_stage, L.do_stage, L.ds_stage}) EXPECT_EQ(stage % 1024, 0u) << what;
      // The column split's dS^T copy per consumer; the key split's one or two (alternating steps).
      EXPECT_EQ(L.ds_buffers, split                                   ? c.consumers
                              : sm90::bwd_scores_in_turn(d.dqk, d.dv) ? 1
                                                                      : 2)
          << what;
      expect_disjoint_inside(r, L.bytes - sm90::kSmemAlign, what);
      EXPECT_LE(L.bytes, size_t(227) * 1024) << what;
    }
  }
}

}  // namespace
}  // namespace raggedattn

#include "verify/case_spec.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "common/dtype.hpp"
#include "verify/mask_rules.hpp"
#include "verify/rng.hpp"

namespace raggedattn {
namespace verify {
namespace {

CaseSpec base(const char* name, std::vector<int32_t> lens, int32_t hq, int32_t hkv) {
  CaseSpec c;
  c.name = name;
  c.seqlens_q = std::move(lens);
  c.hq = hq;
  c.hkv = hkv;
  return c;
}

CaseSpec causal(const char* name, std::vector<int32_t> lens, int32_t hq, int32_t hkv) {
  CaseSpec c = base(name, std::move(lens), hq, hkv);
  c.mask = RATTN_MASK_CAUSAL;
  return c;
}

// Attention sinks and the LSE's cotangent (rattn_problem.has_sink, rattn_bwd_tensors.d_lse).
void add_sink_cases(int32_t hq, int32_t hkv, std::vector<CaseSpec>* s) {
  {
    CaseSpec c = causal("sink_causal_gqa", {100, 1, 77, 45}, hq, hkv);
    c.sink = true;
    s->push_back(c);
  }
  {
    // A band on both sides from the bottom-right diagonal, more queries than keys in the last
    // segment: its first rows see no key (O = 0, LSE = the sink).
    CaseSpec c = base("sink_window", {90, 37, 64}, hq, hkv);
    c.seqlens_kv = {120, 37, 50};
    c.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
    c.window_left = 24;
    c.window_right = 8;
    c.sink = true;
    s->push_back(c);
  }
  {
    // MQA with empty segments of every kind, and segments whose queries outnumber their keys under
    // a bottom-right causal mask: rows that see nothing, whose LSE is the sink and whose d_sink
    // share is exp(0) * d_lse.
    CaseSpec c = causal("sink_zero_len", {50, 0, 20, 7, 0, 33}, hq, 1);
    c.seqlens_kv = {30, 10, 0, 7, 0, 40};
    c.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
    c.sink = true;
    c.lse_grad = true;
    s->push_back(c);
  }
  {
    // The LSE's cotangent alone, with rows that see no key (their LSE is -inf: no gradient).
    CaseSpec c = causal("lse_grad", {100, 1, 80, 33}, hq, hkv);
    c.seqlens_kv = {120, 1, 60, 33};
    c.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
    c.lse_grad = true;
    s->push_back(c);
  }
  {
    // Both, under a soft cap (the sink is in the capped scores' units), in padded THD whose
    // padding, d_lse's columns included, holds NaN that no result may read.
    CaseSpec c = causal("sink_lse_grad", {100, 80, 76, 17}, hq, hkv);
    c.softcap = 2.f;
    c.padded = true;
    c.nan_padding = true;
    c.sink = true;
    c.lse_grad = true;
    s->push_back(c);
  }
}

}  // namespace

std::vector<CaseSpec> named_suite(int32_t hq, int32_t hkv) {
  std::vector<CaseSpec> s;
  // llama3-style GQA causal self-attention over the packs of the issue.
  s.push_back(causal("gqa_causal_256", {256}, hq, hkv));
  s.push_back(causal("gqa_causal_100_80_76", {100, 80, 76}, hq, hkv));
  s.push_back(causal("gqa_causal_128x2", {128, 128}, hq, hkv));
  s.push_back(causal("gqa_causal_64x4", {64, 64, 64, 64}, hq, hkv));
  s.push_back(causal("gqa_causal_200_56", {200, 56}, hq, hkv));
  s.push_back(causal("gqa_causal_103_77_61", {103, 77, 61}, hq, hkv));
  // 2044 rows, not a multiple of 16, with a length-1 document inside the pack.
  s.push_back(causal("pack_2044", {700, 1, 333, 517, 493}, hq, hkv));
  s.push_back(causal("mqa", {131, 77, 40}, hq, 1));
  {
    CaseSpec c = causal("d192_dv128", {100, 80, 76}, hq, hkv);
    c.dqk = 192;
    c.dv = 128;
    s.push_back(c);
  }
  for (int32_t d : {64, 96, 256}) {
    CaseSpec c = causal(d == 64 ? "d64" : d == 96 ? "d96" : "d256", {97, 160, 33}, hq, hkv);
    c.dqk = c.dv = d;
    s.push_back(c);
  }
  {
    // Key/value cache shapes: more keys than queries, fewer (leading rows see no key: LSE -inf),
    // equal, a single query against a few keys.
    CaseSpec c = causal("cross_bottom_right", {37, 90, 100, 20, 1}, hq, hkv);
    c.seqlens_kv = {128, 50, 180, 20, 9};
    c.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
    s.push_back(c);
  }
  {
    // More keys than queries under a top-left causal mask: the key tiles past a segment's last
    // query row see no query (dK = dV = 0, no dQ step), and the last query tile of each segment
    // is partial, so a key tile with no step must leave that tile's dQ to the key tiles that
    // have one.
    CaseSpec c = causal("cross_top_left", {100, 37, 1, 70}, hq, hkv);
    c.seqlens_kv = {300, 200, 130, 70};
    s.push_back(c);
  }
  {
    // Empty segments of every kind: both empty, queries without keys (O = 0, LSE = -inf), keys
    // without queries (dK = dV = 0 exactly).
    CaseSpec c = causal("zero_length", {100, 0, 80, 7, 0, 76}, hq, hkv);
    c.seqlens_kv = {100, 50, 80, 0, 0, 76};
    s.push_back(c);
  }
  {
    CaseSpec c = causal("padded_thd", {100, 80, 76}, hq, hkv);
    c.padded = true;
    c.nan_padding = true;
    s.push_back(c);
  }
  {
    // The zero_padding mode (the Python bindings' outputs are allocated uninitialized): padded
    // THD's gaps, and rows past the last segment, come out zero.
    CaseSpec c = causal("padded_zeroed", {100, 80, 76}, hq, hkv);
    c.padded = true;
    c.nan_padding = true;
    c.trailing_rows = 9;
    c.zero_padding = true;
    s.push_back(c);
  }
  {
    // A packed layout with rows past the last segment (total rows > cu_seqlens[batch]), zeroed.
    CaseSpec c = causal("packed_tail_zeroed", {70, 1, 33}, hq, hkv);
    c.trailing_rows = 45;
    c.zero_padding = true;
    s.push_back(c);
  }
  {
    // GQA with a group that is not a power of two (three query heads per KV head), padded THD,
    // short causal segments at D = 64: the shape of the JAX tests' padded_causal_gqa case, which
    // the random suites (eight query heads) never drew.
    CaseSpec c = causal("gqa3_padded_d64", {11, 3, 25}, 3 * hkv, hkv);
    c.dqk = c.dv = 64;
    c.padded = true;
    c.nan_padding = true;
    s.push_back(c);
  }
  {
    CaseSpec c = causal("sliding_window", {256, 100, 77}, hq, hkv);
    c.window_left = 64;
    c.window_right = 0;
    s.push_back(c);
  }
  {
    CaseSpec c = base("window_bidirectional", {150, 64, 33}, hq, hkv);
    c.window_left = 40;
    c.window_right = 16;
    s.push_back(c);
  }
  {
    CaseSpec c = base("window_bottom_right", {60, 100}, hq, hkv);
    c.seqlens_kv = {150, 100};
    c.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
    c.window_left = 32;
    c.window_right = 8;
    s.push_back(c);
  }
  s.push_back(base("non_causal", {100, 80, 76}, hq, hkv));
  // Several key tiles that each see every query tile of their segment: the backward starts each
  // at its own query tile (MaskSpec::query_rotation), and all of them add into every dQ tile.
  s.push_back(base("non_causal_long", {517, 1, 300}, hq, hkv));
  {
    // A cap close to the scores' spread (they are ~N(0, 1) here), so tanh is far from linear.
    CaseSpec c = causal("softcap", {100, 80, 76, 17}, hq, hkv);
    c.softcap = 2.f;
    s.push_back(c);
  }
  s.push_back(causal("short_odd", {1, 17, 1, 33, 2, 15}, hq, hkv));
  {
    // More segments than one round of the post kernels' CTA-wide search takes (post::locate_cta:
    // 257), so its second round runs: 300 documents of 0 to 12 tokens (0 and 1 among them),
    // every 50th one 70 to 120 tokens long (two row tiles).
    std::vector<int32_t> lens(300);
    for (size_t i = 0; i < lens.size(); ++i) {
      lens[i] = i % 50 == 25 ? int32_t(70 + 10 * (i / 50)) : int32_t((i * 7 + 3) % 13);
    }
    s.push_back(causal("many_docs", std::move(lens), hq, hkv));
  }
  add_sink_cases(hq, hkv, &s);
  return s;
}

CaseSpec random_case(uint64_t seed, const RandomLimits& lim) {
  Rng r(mix_seed(seed, 0x72616e646f6dull));
  CaseSpec c;
  c.name = "random_" + std::to_string(seed);
  c.dtype = lim.dtype;
  c.backend = lim.backend;

  static const int32_t kDims[][2] = {{64, 64},   {96, 96},   {128, 128},
                                     {192, 192}, {256, 256}, {192, 128}};
  std::vector<const int32_t*> dims;
  for (const auto& d : kDims) {
    if (lim.takes_dims == nullptr || lim.takes_dims(d[0], d[1])) dims.push_back(d);
  }
  if (dims.empty()) {
    throw std::invalid_argument("random_case: the limits accept none of the head dims");
  }
  const int32_t* d = dims[size_t(r.range(0, int64_t(dims.size()) - 1))];
  c.dqk = d[0];
  c.dv = d[1];

  c.hq = std::max(1, lim.heads_q);
  std::vector<int32_t> divisors;
  for (int32_t k = 1; k <= c.hq; ++k) {
    if (c.hq % k == 0) divisors.push_back(k);
  }
  c.hkv = divisors[r.range(0, int64_t(divisors.size()) - 1)];

  const int32_t batch = int32_t(r.range(1, std::max(1, lim.max_segments)));
  int64_t budget = std::max(1, lim.max_total);
  const bool one_long = r.chance(0.3);
  const int32_t long_at = int32_t(r.range(0, batch - 1));
  const int64_t short_max = std::max<int64_t>(2, budget / (2 * batch));
  for (int32_t b = 0; b < batch; ++b) {
    int64_t len;
    if (one_long && b == long_at) {
      len = r.range(budget / 3, budget / 2);
    } else {
      const double u = r.uniform();
      len = u < 0.12 ? 0 : u < 0.24 ? 1 : r.range(2, short_max);
    }
    c.seqlens_q.push_back(int32_t(len));
  }
  if (r.chance(0.35)) {  // cross attention: key lengths of their own, sometimes shorter
    for (int32_t lq : c.seqlens_q) {
      const double u = r.uniform();
      int64_t lk = u < 0.1 ? 0 : u < 0.5 ? r.range(1, std::max(1, lq)) : lq + r.range(0, short_max);
      c.seqlens_kv.push_back(int32_t(lk));
    }
  }
  // Keep both sides within the budget by trimming the longest segments.
  for (std::vector<int32_t>* side : {&c.seqlens_q, &c.seqlens_kv}) {
    int64_t total = 0;
    for (int32_t l : *side) total += l;
    while (total > budget) {
      auto it = std::max_element(side->begin(), side->end());
      const int64_t cut = std::min<int64_t>(*it / 2 + 1, total - budget);
      *it -= int32_t(cut);
      total -= cut;
    }
  }

  c.mask = r.chance(0.5) ? RATTN_MASK_CAUSAL : RATTN_MASK_NONE;
  c.alignment = r.chance(0.5) ? RATTN_ALIGN_BOTTOM_RIGHT : RATTN_ALIGN_TOP_LEFT;
  if (r.chance(0.35)) {
    c.window_left = int32_t(r.range(0, 48));
    if (c.mask == RATTN_MASK_CAUSAL) {
      c.window_right = r.chance(0.5) ? 0 : -1;
    } else {
      c.window_right = int32_t(r.range(-1, 24));
    }
  }
  if (r.chance(0.25)) c.softcap = float(r.range(1, 30));
  c.padded = r.chance(0.3);
  c.nan_padding = c.padded && r.chance(0.5);
  // Drawn last, so that a seed's earlier draws (its segments, shapes, masks) stay what they were.
  c.zero_padding = r.chance(0.25);
  if (c.zero_padding && r.chance(0.5)) c.trailing_rows = int32_t(r.range(1, 40));
  // A stream of their own: every seed still draws the fields above as it did before these.
  Rng features(mix_seed(seed, 0x73696e6b6c7365ull));
  c.sink = features.chance(1.0 / 3);
  c.lse_grad = features.chance(1.0 / 3);
  return c;
}

int64_t visible_pairs(const CaseSpec& s) {
  const MaskRule m = MaskRule::of(s);
  int64_t pairs = 0;
  for (size_t b = 0; b < s.seqlens_q.size(); ++b) {
    const int64_t lq = s.seqlens_q[b], lk = s.kv_lens()[b];
    for (int64_t i = 0; i < lq; ++i) pairs += m.keys_seen(i, lq, lk);
  }
  return pairs;
}

double forward_flops(const CaseSpec& s) {
  return 2.0 * double(s.dqk + s.dv) * s.hq * double(visible_pairs(s));
}
double backward_flops(const CaseSpec& s) {
  return 2.5 * forward_flops(s);
}

const char* dtype_str(rattn_dtype t) {
  return dtype_name(t);
}

const char* backend_str(rattn_backend b) {
  switch (b) {
    case RATTN_BACKEND_AUTO:
      return "auto";
    case RATTN_BACKEND_CPU:
      return "cpu";
    case RATTN_BACKEND_CUDA:
      return "cuda";
    case RATTN_BACKEND_CUDA_PORTABLE:
      return "cuda_portable";
    case RATTN_BACKEND_CUDA_SM90:
      return "cuda_sm90";
  }
  return "?";
}

const char* dq_accum_str(rattn_dq_accum a) {
  return a == RATTN_DQ_ACCUM_BF16 ? "bf16" : "fp32";
}

std::string mask_str(const CaseSpec& s) {
  std::ostringstream os;
  const bool window = s.window_left >= 0 || s.window_right >= 0;
  const char* diagonal = s.alignment == RATTN_ALIGN_BOTTOM_RIGHT ? "bottom-right" : "top-left";
  if (s.mask == RATTN_MASK_CAUSAL) {
    os << "causal " << diagonal;
    if (window) os << ", window (" << s.window_left << ", " << s.window_right << ")";
  } else if (window) {
    os << "window (" << s.window_left << ", " << s.window_right << ") " << diagonal;
  } else {
    os << "no mask";
  }
  if (s.softcap > 0.f) os << ", softcap " << s.softcap;
  if (s.sink) os << ", sinks";
  if (s.lse_grad) os << ", lse grad";
  return os.str();
}

std::string segments_str(const CaseSpec& s) {
  auto list = [](const std::vector<int32_t>& v) {
    std::ostringstream os;
    os << "[";
    for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
    os << "]";
    return os.str();
  };
  if (s.seqlens_kv.empty() || s.seqlens_kv == s.seqlens_q) return list(s.seqlens_q);
  return "q" + list(s.seqlens_q) + " kv" + list(s.seqlens_kv);
}

bool parse_dtype(const std::string& s, rattn_dtype* out) {
  if (s == "bf16")
    *out = RATTN_DTYPE_BF16;
  else if (s == "fp16")
    *out = RATTN_DTYPE_FP16;
  else if (s == "fp32")
    *out = RATTN_DTYPE_FP32;
  else
    return false;
  return true;
}

bool parse_backend(const std::string& s, rattn_backend* out) {
  if (s == "auto")
    *out = RATTN_BACKEND_AUTO;
  else if (s == "cpu")
    *out = RATTN_BACKEND_CPU;
  else if (s == "cuda")
    *out = RATTN_BACKEND_CUDA;
  else if (s == "cuda_portable")
    *out = RATTN_BACKEND_CUDA_PORTABLE;
  else if (s == "cuda_sm90")
    *out = RATTN_BACKEND_CUDA_SM90;
  else
    return false;
  return true;
}

bool parse_dq_accum(const std::string& s, rattn_dq_accum* out) {
  if (s == "fp32")
    *out = RATTN_DQ_ACCUM_FP32;
  else if (s == "bf16")
    *out = RATTN_DQ_ACCUM_BF16;
  else
    return false;
  return true;
}

}  // namespace verify
}  // namespace raggedattn

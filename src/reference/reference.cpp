#include "reference/reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "common/dtype.hpp"
#include "common/half.hpp"

namespace raggedattn {
namespace reference {
namespace {

// Runs body(item) for item in [0, n) on a few threads; items are independent.
template <class F>
void parallel_for(int64_t n, int threads, F&& body) {
  int t = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  t = int(std::min<int64_t>(t, n));
  if (t <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (int k = 0; k < t; ++k) {
    pool.emplace_back([&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) body(i);
    });
  }
  for (auto& th : pool) th.join();
}

// fp32 products, fp64 sum (four partial sums).
double dot(const float* a, const float* b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int d = 0;
  for (; d + 4 <= n; d += 4) {
    s0 += double(a[d] * b[d]);
    s1 += double(a[d + 1] * b[d + 1]);
    s2 += double(a[d + 2] * b[d + 2]);
    s3 += double(a[d + 3] * b[d + 3]);
  }
  for (; d < n; ++d) s0 += double(a[d] * b[d]);
  return (s0 + s1) + (s2 + s3);
}

// One segment's rows of one head, converted to fp32 ([rows, dim], contiguous).
void gather(const void* base, TensorLayout layout, int64_t row0, int rows, int head, int dim,
            rattn_dtype t, std::vector<float>* out) {
  out->resize(size_t(rows) * dim);
  for (int r = 0; r < rows; ++r) {
    int64_t off = layout.offset(row0 + r, head);
    for (int d = 0; d < dim; ++d) (*out)[size_t(r) * dim + d] = load_elem(base, off + d, t);
  }
}

// The shared score computation of forward and backward: s = scale * q.k, soft-capped, optionally
// rounded as a plain low-precision implementation would. Also returns tanh' for the backward.
struct ScoreFn {
  float scale, softcap;
  bool emulate;
  rattn_dtype dtype;
  double operator()(const float* q, const float* k, int dim, double* dtanh) const {
    double raw = dot(q, k, dim);
    if (emulate) raw = round_to(dtype, float(raw));
    double s = raw * scale;
    *dtanh = 1.0;
    if (softcap > 0.f) {
      double th = std::tanh(s / softcap);
      s = softcap * th;
      *dtanh = 1.0 - th * th;
    }
    if (emulate) s = round_to(dtype, float(s));
    return s;
  }
};

struct Ctx {
  const PlanData& plan;
  const Problem& p;
  SegmentArrays segs;
  ScoreFn score;
  int group;  // query heads per KV head
  explicit Ctx(const PlanData& d, const int32_t* cu_q, const int32_t* cu_kv, const int32_t* oq,
               const int32_t* okv, bool emulate)
      : plan(d),
        p(d.problem),
        segs{cu_q, cu_kv, oq, okv},
        score{d.scale, d.problem.softcap, emulate, d.problem.dtype},
        group(d.problem.num_heads_q / d.problem.num_heads_kv) {}
};

// The work of one pass: (segment, KV head, rows [r0, r1) of the segment's queries or keys), in
// chunks of kChunk rows, so that a long segment spreads over the threads (one item per
// (segment, KV head) left a single 16k-token document on one core). Every output element is
// computed by one item with the same operations in the same order whatever the chunking, so the
// results do not depend on it or on the thread count.
constexpr int kChunk = 256;
struct Item {
  int b, hk, r0, r1;
};
template <class Len>
std::vector<Item> chunked_items(const Problem& p, const SegmentArrays& segs, Len len) {
  std::vector<Item> items;
  for (int b = 0; b < p.batch; ++b) {
    const int n = len(segs.get(b));
    for (int hk = 0; hk < p.num_heads_kv; ++hk) {
      for (int r0 = 0; r0 < n; r0 += kChunk) items.push_back({b, hk, r0, std::min(n, r0 + kChunk)});
    }
  }
  return items;
}

// Head h's sink logit; -inf (a column that adds nothing) for a problem without sinks.
double sink_logit(const Problem& p, const float* sink, int h) {
  return p.has_sink ? double(sink[h]) : -std::numeric_limits<double>::infinity();
}

// The row term of the softmax gradient: dot(dO_i, O_i) less the LSE's cotangent (d lse_i / d s_ij
// = p_ij, so a cotangent g on lse_i adds g * p_ij to dS_ij: the same as lowering the row term by
// g).
double row_term(const float* d_o, const float* o, int dv, const float* d_lse, int64_t stat) {
  return dot(d_o, o, dv) - (d_lse ? double(d_lse[stat]) : 0.0);
}

}  // namespace

void forward(const PlanData& plan, const FwdTensors& t, const Options& opt) {
  Ctx c(plan, t.cu_seqlens_q, t.cu_seqlens_kv, t.seq_offsets_q, t.seq_offsets_kv,
        opt.emulate_low_precision);
  const Problem& p = c.p;
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const RowStatLayout stats = plan.row_stats();
  // Work item: a chunk of a segment's query rows for one KV head's group of query heads.
  const std::vector<Item> items =
      chunked_items(p, c.segs, [](const Segment& s) { return s.len_q; });
  parallel_for(int64_t(items.size()), opt.threads, [&](int64_t n) {
    const Item it = items[size_t(n)];
    const int hk = it.hk;
    const Segment s = c.segs.get(it.b);
    std::vector<float> k, v, q, scores;
    gather(t.k, plan.k(), s.kv_row0, s.len_kv, hk, dqk, p.dtype, &k);
    gather(t.v, plan.v(), s.kv_row0, s.len_kv, hk, dv, p.dtype, &v);
    for (int h = hk * c.group; h < (hk + 1) * c.group; ++h) {
      gather(t.q, plan.q(), s.q_row0 + it.r0, it.r1 - it.r0, h, dqk, p.dtype, &q);
      for (int i = it.r0; i < it.r1; ++i) {
        const float* qi = &q[size_t(i - it.r0) * dqk];
        const int kb = plan.mask.key_begin(i, s.len_q, s.len_kv);
        const int ke = plan.mask.key_end(i, s.len_q, s.len_kv);
        const int64_t orow = plan.o().offset(s.q_row0 + i, h);
        float* lse = t.lse + stats.offset(h, s.q_row0 + i);
        const double sink = sink_logit(p, t.sink, h);
        if (kb >= ke) {  // the row sees no key: O = 0, LSE = the sink's logit (-inf: none)
          for (int d = 0; d < dv; ++d) store_elem(t.o, orow + d, p.dtype, 0.f);
          *lse = float(sink);
          continue;
        }
        scores.resize(ke - kb);
        double m = sink, unused;  // the sink is one more column of the row's softmax
        for (int j = kb; j < ke; ++j) {
          scores[j - kb] = float(c.score(qi, &k[size_t(j) * dqk], dqk, &unused));
          m = std::max(m, double(scores[j - kb]));
        }
        double l = p.has_sink ? std::exp(sink - m) : 0.0;
        for (int j = kb; j < ke; ++j) l += std::exp(double(scores[j - kb]) - m);
        std::vector<double> acc(dv, 0.0);
        for (int j = kb; j < ke; ++j) {
          double pj = std::exp(double(scores[j - kb]) - m) / l;
          if (c.score.emulate) pj = round_to(p.dtype, float(pj));
          const float* vj = &v[size_t(j) * dv];
          for (int d = 0; d < dv; ++d) acc[d] += pj * vj[d];
        }
        for (int d = 0; d < dv; ++d) store_elem(t.o, orow + d, p.dtype, float(acc[d]));
        *lse = float(m + std::log(l));
      }
    }
  });
}

namespace {

// One (query row i, key j) pair of the backward: P, and dS (the soft cap's tanh' included).
struct Pair {
  double p, ds;
};
struct BwdRow {  // what the pairs of query row i need
  const float *q, *d_o;
  double lse, di;
};

// d_sink[h] = -sum over the head's rows of p_sink(i) * (dot(dO_i, O_i) - d_lse_i), where
// p_sink(i) = exp(sink[h] - lse_i): the sink's column has no value, so its dS is p_sink times
// minus the row term. One item per head, its rows in segment order.
void sink_gradient(const Ctx& c, const BwdTensors& t, const Options& opt) {
  const Problem& p = c.p;
  const RowStatLayout stats = c.plan.row_stats();
  parallel_for(p.num_heads_q, opt.threads, [&](int64_t n) {
    const int h = int(n);
    const double sink = t.sink[h];
    std::vector<float> o, d_o;
    double sum = 0;
    for (int b = 0; b < p.batch; ++b) {
      const Segment s = c.segs.get(b);
      gather(t.o, c.plan.o(), s.q_row0, s.len_q, h, p.head_dim_v, p.dtype, &o);
      gather(t.d_o, c.plan.d_o(), s.q_row0, s.len_q, h, p.head_dim_v, p.dtype, &d_o);
      for (int i = 0; i < s.len_q; ++i) {
        const int64_t stat = stats.offset(h, s.q_row0 + i);
        const size_t x = size_t(i) * p.head_dim_v;
        sum += std::exp(sink - double(t.lse[stat])) *
               row_term(&d_o[x], &o[x], p.head_dim_v, t.d_lse, stat);
      }
    }
    t.d_sink[h] = float(-sum);
  });
}

}  // namespace

void backward(const PlanData& plan, const BwdTensors& t, const Options& opt) {
  Ctx c(plan, t.cu_seqlens_q, t.cu_seqlens_kv, t.seq_offsets_q, t.seq_offsets_kv,
        opt.emulate_low_precision);
  const Problem& p = c.p;
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const RowStatLayout stats = plan.row_stats();
  const bool emulate = c.score.emulate;
  auto rnd = [&](double x) { return emulate ? double(round_to(p.dtype, float(x))) : x; };
  auto pair = [&](const BwdRow& r, const float* kj, const float* vj) {
    double dtanh;
    const double sc = c.score(r.q, kj, dqk, &dtanh);
    const double pij = rnd(std::exp(sc - r.lse));
    const double dpij = rnd(dot(r.d_o, vj, dv));
    return Pair{pij, rnd(pij * (dpij - r.di)) * dtanh};
  };
  // A head's query-side rows [r0, r1) of segment s: Q, O and dO gathered, and what each row's
  // pairs need (LSE, dot(dO, O)).
  struct QuerySide {
    std::vector<float> q, o, d_o;
    std::vector<BwdRow> rows;
  };
  auto query_side = [&](const Segment& s, int h, int r0, int r1, QuerySide* qs) {
    gather(t.q, plan.q(), s.q_row0 + r0, r1 - r0, h, dqk, p.dtype, &qs->q);
    gather(t.o, plan.o(), s.q_row0 + r0, r1 - r0, h, dv, p.dtype, &qs->o);
    gather(t.d_o, plan.d_o(), s.q_row0 + r0, r1 - r0, h, dv, p.dtype, &qs->d_o);
    qs->rows.resize(size_t(r1 - r0));
    for (int i = r0; i < r1; ++i) {
      const size_t x = size_t(i - r0);
      const int64_t stat = stats.offset(h, s.q_row0 + i);
      qs->rows[x] = BwdRow{&qs->q[x * dqk], &qs->d_o[x * dv], double(t.lse[stat]),
                           row_term(&qs->d_o[x * dv], &qs->o[x * dv], dv, t.d_lse, stat)};
    }
  };
  // dQ: items of query rows; each row's dQ over its keys in order.
  const std::vector<Item> q_items =
      chunked_items(p, c.segs, [](const Segment& s) { return s.len_q; });
  parallel_for(int64_t(q_items.size()), opt.threads, [&](int64_t n) {
    const Item it = q_items[size_t(n)];
    const Segment s = c.segs.get(it.b);
    std::vector<float> k, v;
    gather(t.k, plan.k(), s.kv_row0, s.len_kv, it.hk, dqk, p.dtype, &k);
    gather(t.v, plan.v(), s.kv_row0, s.len_kv, it.hk, dv, p.dtype, &v);
    QuerySide qs;
    std::vector<double> dq(dqk);
    for (int h = it.hk * c.group; h < (it.hk + 1) * c.group; ++h) {
      query_side(s, h, it.r0, it.r1, &qs);
      for (int i = it.r0; i < it.r1; ++i) {
        const int kb = plan.mask.key_begin(i, s.len_q, s.len_kv);
        const int ke = plan.mask.key_end(i, s.len_q, s.len_kv);
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int j = kb; j < ke; ++j) {
          const float* kj = &k[size_t(j) * dqk];
          const Pair pr = pair(qs.rows[size_t(i - it.r0)], kj, &v[size_t(j) * dv]);
          for (int d = 0; d < dqk; ++d) dq[d] += pr.ds * kj[d];
        }
        const int64_t row = plan.dq().offset(s.q_row0 + i, h);
        for (int d = 0; d < dqk; ++d) store_elem(t.dq, row + d, p.dtype, float(dq[d] * plan.scale));
      }
    }
  });
  // dK and dV: items of key rows; each key's sums over the group's heads, then the rows that see
  // it, in order.
  const std::vector<Item> k_items =
      chunked_items(p, c.segs, [](const Segment& s) { return s.len_kv; });
  parallel_for(int64_t(k_items.size()), opt.threads, [&](int64_t n) {
    const Item it = k_items[size_t(n)];
    const Segment s = c.segs.get(it.b);
    const int keys = it.r1 - it.r0;
    std::vector<float> k, v;
    gather(t.k, plan.k(), s.kv_row0 + it.r0, keys, it.hk, dqk, p.dtype, &k);
    gather(t.v, plan.v(), s.kv_row0 + it.r0, keys, it.hk, dv, p.dtype, &v);
    std::vector<double> dk(size_t(keys) * dqk, 0.0), dvacc(size_t(keys) * dv, 0.0);
    // The query rows that see any of these keys.
    const int i0 = plan.mask.query_begin(it.r0, s.len_q, s.len_kv);
    const int i1 = plan.mask.query_end(it.r1 - 1, s.len_q, s.len_kv);
    QuerySide qs;
    for (int h = it.hk * c.group; h < (it.hk + 1) * c.group && i0 < i1; ++h) {
      query_side(s, h, i0, i1, &qs);
      for (int i = i0; i < i1; ++i) {
        const BwdRow& r = qs.rows[size_t(i - i0)];
        const int kb = std::max(it.r0, plan.mask.key_begin(i, s.len_q, s.len_kv));
        const int ke = std::min(it.r1, plan.mask.key_end(i, s.len_q, s.len_kv));
        for (int j = kb; j < ke; ++j) {
          const size_t x = size_t(j - it.r0);
          const Pair pr = pair(r, &k[x * dqk], &v[x * dv]);
          for (int d = 0; d < dqk; ++d) dk[x * dqk + d] += pr.ds * r.q[d];
          for (int d = 0; d < dv; ++d) dvacc[x * dv + d] += pr.p * r.d_o[d];
        }
      }
    }
    for (int j = it.r0; j < it.r1; ++j) {
      const size_t x = size_t(j - it.r0);
      const int64_t krow = plan.dk().offset(s.kv_row0 + j, it.hk);
      const int64_t vrow = plan.dv().offset(s.kv_row0 + j, it.hk);
      for (int d = 0; d < dqk; ++d) {
        store_elem(t.dk, krow + d, p.dtype, float(dk[x * dqk + d] * plan.scale));
      }
      for (int d = 0; d < dv; ++d) store_elem(t.dv, vrow + d, p.dtype, float(dvacc[x * dv + d]));
    }
  });
  if (p.has_sink) sink_gradient(c, t, opt);
}

namespace {

// Zeros in the padding rows of one [rows, heads, dim] tensor of `eb`-byte elements.
void zero_rows(void* base, const rattn_strides& st, int64_t rows, int heads, int dim, int eb,
               const int32_t* cu, const int32_t* offsets, int32_t batch) {
  auto* bytes = static_cast<unsigned char*>(base);
  for (int64_t r = 0; r < rows; ++r) {
    if (row_in_segment(cu, offsets, batch, r)) continue;
    for (int h = 0; h < heads; ++h) {
      std::memset(bytes + (r * st.token + int64_t(h) * st.head) * eb, 0, size_t(dim) * eb);
    }
  }
}

}  // namespace

void zero_padding(const PlanData& plan, const FwdTensors& t) {
  const Problem& p = plan.problem;
  const int eb = dtype_bytes(p.dtype);
  zero_rows(t.o, p.o, p.total_q, p.num_heads_q, p.head_dim_v, eb, t.cu_seqlens_q, t.seq_offsets_q,
            p.batch);
  const RowStatLayout stats{p.total_q};
  for (int64_t r = 0; r < p.total_q; ++r) {
    if (row_in_segment(t.cu_seqlens_q, t.seq_offsets_q, p.batch, r)) continue;
    for (int h = 0; h < p.num_heads_q; ++h) t.lse[stats.offset(h, r)] = 0.f;
  }
}

void zero_padding(const PlanData& plan, const BwdTensors& t) {
  const Problem& p = plan.problem;
  const int eb = dtype_bytes(p.dtype);
  zero_rows(t.dq, p.dq, p.total_q, p.num_heads_q, p.head_dim_qk, eb, t.cu_seqlens_q,
            t.seq_offsets_q, p.batch);
  zero_rows(t.dk, p.dk, p.total_kv, p.num_heads_kv, p.head_dim_qk, eb, t.cu_seqlens_kv,
            t.seq_offsets_kv, p.batch);
  zero_rows(t.dv, p.dv, p.total_kv, p.num_heads_kv, p.head_dim_v, eb, t.cu_seqlens_kv,
            t.seq_offsets_kv, p.batch);
}

}  // namespace reference
}  // namespace raggedattn

#include "reference/reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

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

}  // namespace

void forward(const PlanData& plan, const FwdTensors& t, const Options& opt) {
  Ctx c(plan, t.cu_seqlens_q, t.cu_seqlens_kv, t.seq_offsets_q, t.seq_offsets_kv,
        opt.emulate_low_precision);
  const Problem& p = c.p;
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const RowStatLayout stats = plan.row_stats();
  // Work item: (segment, KV head); its K and V are converted once for the group's query heads.
  parallel_for(int64_t(p.batch) * p.num_heads_kv, opt.threads, [&](int64_t item) {
    const int b = int(item / p.num_heads_kv), hk = int(item % p.num_heads_kv);
    const Segment s = c.segs.get(b);
    std::vector<float> k, v, q, scores, pv(dv);
    gather(t.k, plan.k(), s.kv_row0, s.len_kv, hk, dqk, p.dtype, &k);
    gather(t.v, plan.v(), s.kv_row0, s.len_kv, hk, dv, p.dtype, &v);
    for (int h = hk * c.group; h < (hk + 1) * c.group; ++h) {
      gather(t.q, plan.q(), s.q_row0, s.len_q, h, dqk, p.dtype, &q);
      for (int i = 0; i < s.len_q; ++i) {
        const int kb = plan.mask.key_begin(i, s.len_q, s.len_kv);
        const int ke = plan.mask.key_end(i, s.len_q, s.len_kv);
        const int64_t orow = plan.o().offset(s.q_row0 + i, h);
        float* lse = t.lse + stats.offset(h, s.q_row0 + i);
        if (kb >= ke) {  // the row sees no key: O = 0, LSE = -inf
          for (int d = 0; d < dv; ++d) store_elem(t.o, orow + d, p.dtype, 0.f);
          *lse = -std::numeric_limits<float>::infinity();
          continue;
        }
        scores.resize(ke - kb);
        double m = -std::numeric_limits<double>::infinity(), unused;
        for (int j = kb; j < ke; ++j) {
          scores[j - kb] = float(c.score(&q[size_t(i) * dqk], &k[size_t(j) * dqk], dqk, &unused));
          m = std::max(m, double(scores[j - kb]));
        }
        double l = 0;
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

void backward(const PlanData& plan, const BwdTensors& t, const Options& opt) {
  Ctx c(plan, t.cu_seqlens_q, t.cu_seqlens_kv, t.seq_offsets_q, t.seq_offsets_kv,
        opt.emulate_low_precision);
  const Problem& p = c.p;
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const RowStatLayout stats = plan.row_stats();
  const bool emulate = c.score.emulate;
  auto rnd = [&](double x) { return emulate ? double(round_to(p.dtype, float(x))) : x; };
  // Work item: (segment, KV head): it owns that head's dK/dV rows and its group's dQ rows.
  parallel_for(int64_t(p.batch) * p.num_heads_kv, opt.threads, [&](int64_t item) {
    const int b = int(item / p.num_heads_kv), hk = int(item % p.num_heads_kv);
    const Segment s = c.segs.get(b);
    std::vector<float> k, v, q, o, d_o;
    gather(t.k, plan.k(), s.kv_row0, s.len_kv, hk, dqk, p.dtype, &k);
    gather(t.v, plan.v(), s.kv_row0, s.len_kv, hk, dv, p.dtype, &v);
    std::vector<double> dk(size_t(s.len_kv) * dqk, 0.0), dvacc(size_t(s.len_kv) * dv, 0.0);
    std::vector<double> dq(dqk);
    for (int h = hk * c.group; h < (hk + 1) * c.group; ++h) {
      gather(t.q, plan.q(), s.q_row0, s.len_q, h, dqk, p.dtype, &q);
      gather(t.o, plan.o(), s.q_row0, s.len_q, h, dv, p.dtype, &o);
      gather(t.d_o, plan.d_o(), s.q_row0, s.len_q, h, dv, p.dtype, &d_o);
      for (int i = 0; i < s.len_q; ++i) {
        const int kb = plan.mask.key_begin(i, s.len_q, s.len_kv);
        const int ke = plan.mask.key_end(i, s.len_q, s.len_kv);
        const float* qi = &q[size_t(i) * dqk];
        const float* doi = &d_o[size_t(i) * dv];
        std::fill(dq.begin(), dq.end(), 0.0);
        if (kb < ke) {
          const double lse = t.lse[stats.offset(h, s.q_row0 + i)];
          const double di = dot(doi, &o[size_t(i) * dv], dv);
          for (int j = kb; j < ke; ++j) {
            const float* kj = &k[size_t(j) * dqk];
            double dtanh;
            const double sc = c.score(qi, kj, dqk, &dtanh);
            const double pij = rnd(std::exp(sc - lse));
            const double dpij = rnd(dot(doi, &v[size_t(j) * dv], dv));
            const double dsij = rnd(pij * (dpij - di)) * dtanh;
            for (int d = 0; d < dqk; ++d) {
              dq[d] += dsij * kj[d];
              dk[size_t(j) * dqk + d] += dsij * qi[d];
            }
            for (int d = 0; d < dv; ++d) dvacc[size_t(j) * dv + d] += pij * doi[d];
          }
        }
        const int64_t row = plan.dq().offset(s.q_row0 + i, h);
        for (int d = 0; d < dqk; ++d) store_elem(t.dq, row + d, p.dtype, float(dq[d] * plan.scale));
      }
    }
    for (int j = 0; j < s.len_kv; ++j) {
      const int64_t krow = plan.dk().offset(s.kv_row0 + j, hk);
      const int64_t vrow = plan.dv().offset(s.kv_row0 + j, hk);
      for (int d = 0; d < dqk; ++d) {
        store_elem(t.dk, krow + d, p.dtype, float(dk[size_t(j) * dqk + d] * plan.scale));
      }
      for (int d = 0; d < dv; ++d)
        store_elem(t.dv, vrow + d, p.dtype, float(dvacc[size_t(j) * dv + d]));
    }
  });
}

}  // namespace reference
}  // namespace raggedattn

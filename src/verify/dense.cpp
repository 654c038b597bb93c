#include "verify/dense.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

namespace raggedattn {
namespace verify {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double dot(const double* a, const double* b, int n) {
  double s0 = 0, s1 = 0;  // two chains: half the latency, still an exact-enough fp64 sum
  int i = 0;
  for (; i + 2 <= n; i += 2) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
  }
  if (i < n) s0 += a[i] * b[i];
  return s0 + s1;
}

void axpy(double a, const double* x, double* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

void add_abs(double a, const double* x, double* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * std::fabs(x[i]);
}

// Runs body(kv_head) for every KV head, on dense_threads(hkv) threads: a KV head owns its dK/dV
// rows and its group's query heads, so the items never write the same memory. An exception of a
// worker (std::bad_alloc of a score matrix) is rethrown here, not left to end the process.
template <class F>
void for_each_kv_head(int32_t hkv, F&& body) {
  const int threads = dense_threads(hkv);
  if (threads <= 1) {
    for (int32_t h = 0; h < hkv; ++h) body(h);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        for (int32_t h = t; h < hkv; h += threads) body(h);
      } catch (...) {
        errors[size_t(t)] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Counts the rows the workers finish and tells a RowProgress, one call at a time.
class RowCounter {
 public:
  RowCounter(const RowProgress& progress, int64_t total) : progress_(progress), total_(total) {}
  void row_done() {
    if (!progress_) return;
    std::lock_guard<std::mutex> lock(mutex_);
    progress_(++done_, total_);
  }

 private:
  const RowProgress& progress_;
  const int64_t total_;
  int64_t done_ = 0;
  std::mutex mutex_;
};

// Scores of query head h: S[r, c] = softcap(scale * q_r . k_c), -inf where masked. Also returns
// d(score)/d(q.k) per element for the backward (0 where masked).
void scores(const DenseProblem& p, const std::vector<uint8_t>& mask, const DenseTensor& q,
            const DenseTensor& k, int32_t h, std::vector<double>* s, std::vector<double>* ds) {
  const int32_t hk = h / (p.hq / p.hkv);
  s->assign(size_t(p.rows_q * p.rows_kv), kNegInf);
  if (ds) ds->assign(size_t(p.rows_q * p.rows_kv), 0.0);
  for (int64_t r = 0; r < p.rows_q; ++r) {
    for (int64_t c = 0; c < p.rows_kv; ++c) {
      const size_t idx = size_t(r * p.rows_kv + c);
      if (!mask[idx]) continue;
      double x = p.scale * dot(q.row(r, h), k.row(c, hk), p.dqk);
      double slope = p.scale;
      if (p.softcap > 0) {
        const double t = std::tanh(x / p.softcap);
        x = p.softcap * t;
        slope = p.scale * (1.0 - t * t);
      }
      (*s)[idx] = x;
      if (ds) (*ds)[idx] = slope;
    }
  }
}

std::vector<uint8_t> mask_matrix(const DenseProblem& p) {
  std::vector<uint8_t> m(size_t(p.rows_q * p.rows_kv));
  for (int64_t r = 0; r < p.rows_q; ++r) {
    for (int64_t c = 0; c < p.rows_kv; ++c) m[size_t(r * p.rows_kv + c)] = p.visible(r, c);
  }
  return m;
}

// Query head h's sink logit; -inf (a column that adds nothing) without sinks.
double sink_of(const DenseProblem& p, int32_t h) {
  return p.sink.empty() ? kNegInf : p.sink[size_t(h)];
}

// Row r's log-sum-exp over the visible scores and the sink's column (-inf when there is neither).
double row_lse(const double* s, int64_t n, double sink) {
  double m = sink;
  for (int64_t c = 0; c < n; ++c) m = std::max(m, s[c]);
  if (m == kNegInf) return kNegInf;
  double l = std::exp(sink - m);                            // 0 without a sink
  for (int64_t c = 0; c < n; ++c) l += std::exp(s[c] - m);  // exp(-inf) = 0 for masked keys
  return m + std::log(l);
}

}  // namespace

int dense_threads(int32_t hkv) {
  return int(std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()),
                                unsigned(std::max(1, hkv))));
}

TensorView DenseTensor::view() const {
  TensorView t;
  t.data = values.data();
  t.f64 = true;
  t.token_stride = int64_t(heads) * dim;
  t.head_stride = dim;
  t.heads = heads;
  t.dim = dim;
  return t;
}

DenseTensor to_dense(const TensorView& t, int64_t rows) {
  DenseTensor d(rows, t.heads, t.dim);
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t h = 0; h < t.heads; ++h) {
      for (int32_t i = 0; i < t.dim; ++i) d.row(r, h)[i] = t.at(r, h, i);
    }
  }
  return d;
}

bool DenseProblem::visible(int64_t r, int64_t c) const {
  const int32_t b = seg_q[size_t(r)];
  if (b < 0 || seg_kv[size_t(c)] != b) return false;
  return mask.visible(pos_q[size_t(r)], pos_kv[size_t(c)], len_q[size_t(b)], len_kv[size_t(b)]);
}

DenseProblem dense_problem(const CaseSpec& spec, const PackLayout& l) {
  DenseProblem p;
  p.rows_q = l.total_q;
  p.rows_kv = l.total_kv;
  p.hq = spec.hq;
  p.hkv = spec.hkv;
  p.dqk = spec.dqk;
  p.dv = spec.dv;
  p.scale = 1.0 / std::sqrt(double(spec.dqk));
  p.softcap = spec.softcap;
  p.mask = MaskRule::of(spec);
  p.seg_q.assign(size_t(p.rows_q), -1);
  p.pos_q.assign(size_t(p.rows_q), -1);
  p.seg_kv.assign(size_t(p.rows_kv), -1);
  p.pos_kv.assign(size_t(p.rows_kv), -1);
  const int32_t batch = int32_t(l.cu_q.size()) - 1;
  for (int32_t b = 0; b < batch; ++b) {
    // raggedattn.h: segment b has cu[b+1] - cu[b] valid rows, starting at seq_offsets[b] when
    // given and at cu[b] otherwise.
    const int32_t lq = l.cu_q[size_t(b) + 1] - l.cu_q[size_t(b)];
    const int32_t lk = l.cu_kv[size_t(b) + 1] - l.cu_kv[size_t(b)];
    const int64_t q0 = l.padded() ? l.off_q[size_t(b)] : l.cu_q[size_t(b)];
    const int64_t k0 = l.padded() ? l.off_kv[size_t(b)] : l.cu_kv[size_t(b)];
    p.len_q.push_back(lq);
    p.len_kv.push_back(lk);
    for (int32_t i = 0; i < lq; ++i) {
      p.seg_q[size_t(q0 + i)] = b;
      p.pos_q[size_t(q0 + i)] = i;
    }
    for (int32_t j = 0; j < lk; ++j) {
      p.seg_kv[size_t(k0 + j)] = b;
      p.pos_kv[size_t(k0 + j)] = j;
    }
  }
  return p;
}

DenseForward dense_forward(const DenseProblem& p, const DenseTensor& q, const DenseTensor& k,
                           const DenseTensor& v, const RowProgress& progress) {
  DenseForward f;
  f.o = DenseTensor(p.rows_q, p.hq, p.dv);
  f.lse = DenseTensor(p.rows_q, p.hq, 1);
  const std::vector<uint8_t> mask = mask_matrix(p);
  const int32_t group = p.hq / p.hkv;
  // Rows are counted in the loops' steps, so that rows which `continue` count too.
  RowCounter rows(progress, p.rows_q * p.hq);
  for_each_kv_head(p.hkv, [&](int32_t hk) {
    std::vector<double> s;
    for (int32_t h = hk * group; h < (hk + 1) * group; ++h) {
      scores(p, mask, q, k, h, &s, nullptr);
      for (int64_t r = 0; r < p.rows_q; ++r, rows.row_done()) {
        const double* sr = &s[size_t(r * p.rows_kv)];
        const double lse = row_lse(sr, p.rows_kv, sink_of(p, h));
        f.lse.row(r, h)[0] = lse;
        if (lse == kNegInf) continue;  // O stays 0
        double* o = f.o.row(r, h);
        for (int64_t c = 0; c < p.rows_kv; ++c) {
          if (sr[c] != kNegInf) axpy(std::exp(sr[c] - lse), v.row(c, hk), o, p.dv);
        }
      }
    }
  });
  return f;
}

DenseBackward dense_backward(const DenseProblem& p, const DenseTensor& q, const DenseTensor& k,
                             const DenseTensor& v, const DenseTensor& o, const DenseTensor& d_o,
                             const DenseTensor* d_lse, const RowProgress& progress) {
  DenseBackward g;
  g.dq = DenseTensor(p.rows_q, p.hq, p.dqk);
  g.dk = DenseTensor(p.rows_kv, p.hkv, p.dqk);
  g.dv = DenseTensor(p.rows_kv, p.hkv, p.dv);
  g.dq_magnitude = DenseTensor(p.rows_q, p.hq, p.dqk);
  g.dk_magnitude = DenseTensor(p.rows_kv, p.hkv, p.dqk);
  g.d_sink.assign(p.sink.size(), 0.0);
  g.d_sink_magnitude.assign(p.sink.size(), 0.0);
  const std::vector<uint8_t> mask = mask_matrix(p);
  const int32_t group = p.hq / p.hkv;
  RowCounter rows(progress, p.rows_q * p.hq);
  for_each_kv_head(p.hkv, [&](int32_t hk) {
    std::vector<double> s, slope;
    for (int32_t h = hk * group; h < (hk + 1) * group; ++h) {
      scores(p, mask, q, k, h, &s, &slope);
      for (int64_t r = 0; r < p.rows_q; ++r, rows.row_done()) {
        // Padding rows belong to no softmax: with a sink their LSE would be finite, but nothing
        // of theirs (dO, O, d_lse hold anything there) reaches a gradient.
        if (p.seg_q[size_t(r)] < 0) continue;
        const double* sr = &s[size_t(r * p.rows_kv)];
        const double lse = row_lse(sr, p.rows_kv, sink_of(p, h));
        if (lse == kNegInf) continue;  // a row that sees no key and no sink has zero gradients
        const double* dor = d_o.row(r, h);
        // sum_j P_rj dP_rj (via O), less the LSE's cotangent: dS_rj = P_rj (dP_rj - delta).
        const double delta = dot(dor, o.row(r, h), p.dv) - (d_lse ? d_lse->row(r, h)[0] : 0.0);
        // The sink's column has no value (its dP is 0): dS_sink = P_sink (0 - delta).
        if (!p.sink.empty()) {
          const double term = std::exp(p.sink[size_t(h)] - lse) * delta;
          g.d_sink[size_t(h)] -= term;
          g.d_sink_magnitude[size_t(h)] += std::fabs(term);
        }
        double* dq = g.dq.row(r, h);
        double* dq_mag = g.dq_magnitude.row(r, h);
        for (int64_t c = 0; c < p.rows_kv; ++c) {
          if (sr[c] == kNegInf) continue;
          const double prob = std::exp(sr[c] - lse);
          const double dprob = dot(dor, v.row(c, hk), p.dv);
          const double slope_rc = slope[size_t(r * p.rows_kv + c)];
          const double draw = prob * (dprob - delta) * slope_rc;  // d/d(q.k)
          const double draw_mag =
              prob * (std::fabs(dprob) + std::fabs(delta)) * std::fabs(slope_rc);
          axpy(draw, k.row(c, hk), dq, p.dqk);
          axpy(draw, q.row(r, h), g.dk.row(c, hk), p.dqk);
          axpy(prob, dor, g.dv.row(c, hk), p.dv);
          add_abs(draw_mag, k.row(c, hk), dq_mag, p.dqk);
          add_abs(draw_mag, q.row(r, h), g.dk_magnitude.row(c, hk), p.dqk);
        }
      }
    }
  });
  return g;
}

}  // namespace verify
}  // namespace raggedattn

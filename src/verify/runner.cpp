#include "verify/runner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "common/status.hpp"
#include "plan/plan_data.hpp"
#include "reference/reference.hpp"
#include "verify/dense.hpp"
#include "verify/host_data.hpp"
#include "verify/mask_rules.hpp"
#include "verify/memory.hpp"
#include "verify/rng.hpp"
#include "verify/watchdog.hpp"

namespace raggedattn {
namespace verify {
namespace {

// Unit roundoff of the storage format: rounding to nearest moves every element by at most this
// fraction of itself, so it bounds the norm-wise relative error rounding adds.
double unit_roundoff(rattn_dtype t) {
  switch (t) {
    case RATTN_DTYPE_BF16:
      return 1.0 / 256;  // 8 significant bits
    case RATTN_DTYPE_FP16:
      return 1.0 / 2048;  // 11
    case RATTN_DTYPE_FP32:
      return 1.0 / 16777216;
  }
  return 1.0;
}

// The tensors of one run, wherever `mem` keeps them.
struct Bound {
  void *q = nullptr, *k = nullptr, *v = nullptr, *d_o = nullptr;
  void *o = nullptr, *lse = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  void *sink = nullptr, *d_sink = nullptr, *d_lse = nullptr;  // null where the case has none
  const int32_t *cu_q = nullptr, *cu_kv = nullptr, *off_q = nullptr, *off_kv = nullptr;
  void *ws_fwd = nullptr, *ws_bwd = nullptr;
  size_t ws_fwd_bytes = 0, ws_bwd_bytes = 0;

  FwdTensors fwd() const {
    FwdTensors t{};
    t.q = q;
    t.k = k;
    t.v = v;
    t.o = o;
    t.lse = static_cast<float*>(lse);
    t.cu_seqlens_q = cu_q;
    t.cu_seqlens_kv = cu_kv;
    t.seq_offsets_q = off_q;
    t.seq_offsets_kv = off_kv;
    t.sink = static_cast<const float*>(sink);
    return t;
  }
  BwdTensors bwd() const {
    BwdTensors t{};
    t.q = q;
    t.k = k;
    t.v = v;
    t.o = o;
    t.d_o = d_o;
    t.lse = static_cast<const float*>(lse);
    t.dq = dq;
    t.dk = dk;
    t.dv = dv;
    t.cu_seqlens_q = cu_q;
    t.cu_seqlens_kv = cu_kv;
    t.seq_offsets_q = off_q;
    t.seq_offsets_kv = off_kv;
    t.sink = static_cast<const float*>(sink);
    t.d_sink = static_cast<float*>(d_sink);
    t.d_lse = static_cast<const float*>(d_lse);
    return t;
  }
};

Status alloc_copy(Memory& mem, const void* host, size_t bytes, void** ptr) {
  RATTN_RETURN_IF_ERROR(mem.alloc(bytes, ptr));
  return mem.upload(*ptr, host, bytes);
}

// A tensor the case may not have (sinks, d_sink, d_lse): null where it is empty.
Status alloc_optional(Memory& mem, const HostTensor& t, void** ptr) {
  *ptr = nullptr;
  return t.bytes() ? alloc_copy(mem, t.data(), t.bytes(), ptr) : Status::Ok();
}

Status alloc_ints(Memory& mem, const std::vector<int32_t>& v, const int32_t** ptr) {
  *ptr = nullptr;
  if (v.empty()) return Status::Ok();
  void* p = nullptr;
  RATTN_RETURN_IF_ERROR(alloc_copy(mem, v.data(), v.size() * sizeof(int32_t), &p));
  *ptr = static_cast<const int32_t*>(p);
  return Status::Ok();
}

// Fills `bytes` of workspace with the poison: a backend must initialize the scratch it reads.
Status poison_workspace(Memory& mem, void* ws, size_t bytes) {
  if (!bytes) return Status::Ok();
  HostBuffer poison(bytes);
  std::memset(poison.data(), kPoisonByte, bytes);
  return mem.upload(ws, poison.data(), bytes);
}

Status upload_outputs(Memory& mem, const HostOutputs& img, const Bound& b, bool fwd_outputs) {
  if (fwd_outputs) {
    RATTN_RETURN_IF_ERROR(mem.upload(b.o, img.o.data(), img.o.bytes()));
    RATTN_RETURN_IF_ERROR(mem.upload(b.lse, img.lse.data(), img.lse.bytes()));
  }
  RATTN_RETURN_IF_ERROR(mem.upload(b.dq, img.dq.data(), img.dq.bytes()));
  RATTN_RETURN_IF_ERROR(mem.upload(b.dk, img.dk.data(), img.dk.bytes()));
  RATTN_RETURN_IF_ERROR(mem.upload(b.d_sink, img.d_sink.data(), img.d_sink.bytes()));
  return mem.upload(b.dv, img.dv.data(), img.dv.bytes());
}

Status download_outputs(Memory& mem, const Bound& b, HostOutputs* out) {
  RATTN_RETURN_IF_ERROR(mem.download(out->o.data(), b.o, out->o.bytes()));
  RATTN_RETURN_IF_ERROR(mem.download(out->lse.data(), b.lse, out->lse.bytes()));
  RATTN_RETURN_IF_ERROR(mem.download(out->dq.data(), b.dq, out->dq.bytes()));
  RATTN_RETURN_IF_ERROR(mem.download(out->dk.data(), b.dk, out->dk.bytes()));
  RATTN_RETURN_IF_ERROR(mem.download(out->d_sink.data(), b.d_sink, out->d_sink.bytes()));
  return mem.download(out->dv.data(), b.dv, out->dv.bytes());
}

int64_t differing_bytes(const HostTensor& a, const HostTensor& b) {
  const auto* x = static_cast<const uint8_t*>(a.data());
  const auto* y = static_cast<const uint8_t*>(b.data());
  int64_t n = 0;
  for (size_t i = 0; i < a.bytes(); ++i) n += x[i] != y[i];
  return n;
}

int64_t total_tokens(const std::vector<int32_t>& lens) {
  int64_t total = 0;
  for (int32_t l : lens) total += l;
  return total;
}

// Bytes of a case's tensors, padding rows left out: Q, dQ, O, dO; K, dK, V, dV at `elem` bytes an
// element, and LSE at `lse_elem`.
double tensor_bytes(const CaseSpec& s, double elem, double lse_elem) {
  const double rows_q = double(total_tokens(s.seqlens_q)) * s.hq;
  const double rows_kv = double(total_tokens(s.kv_lens())) * s.hkv;
  return (rows_q + rows_kv) * (2.0 * s.dqk + 2.0 * s.dv) * elem + rows_q * lse_elem;
}

// Tells the progress callback, where there is one, that `phase` starts.
void report_phase(const RunOptions& opt, const std::string& phase) {
  if (opt.progress) opt.progress(phase, 0, 0);
}

// The progress callback as the brute force's RowProgress for `phase` (unset where there is none).
RowProgress row_progress(const RunOptions& opt, const std::string& phase) {
  if (!opt.progress) return nullptr;
  return [&opt, phase](int64_t done, int64_t total) { opt.progress(phase, done, total); };
}

void fail(CaseReport* r, const char* stage, const Status& s) {
  r->status = s.code();
  r->stage = stage;
  r->error = s.message();
  r->pass = false;
}

// The exact reference (fp32 data, fp32 math, fp64 sums) and the plain low-precision emulation, both
// on the host through the CPU backend. A plain implementation keeps each tensor at the precision
// the path under test stores it in: the problem's dtype, except dQ where the plan accumulates it
// in a 16-bit scratch of another format (bf16 scratch for fp16 data): that dQ is held to a plain
// implementation in the scratch's format (DESIGN.md names "a plain bf16 implementation").
struct ReferenceOutputs {
  HostOutputs exact, lowp, lowp_dq;  // lowp_dq: only where dQ's precision differs from the data's
};

Status run_reference(const CaseSpec& spec, const PackLayout& l, const HostInputs& in,
                     const HostTensor& stored_o, rattn_dtype dt, bool emulate,
                     const RunOptions& run, HostOutputs* o) {
  CaseSpec s = spec;
  s.dtype = dt;
  s.backend = RATTN_BACKEND_CPU;
  Plan plan;
  RATTN_RETURN_IF_ERROR(make_plan(make_problem(s, l), cpu_caps(), &plan));
  HostInputs data;
  data.q = convert(in.q.view(), in.q.rows, dt);
  data.k = convert(in.k.view(), in.k.rows, dt);
  data.v = convert(in.v.view(), in.v.rows, dt);
  data.d_o = convert(in.d_o.view(), in.d_o.rows, dt);
  // fp32 whatever the data's dtype (empty where the case has none).
  data.sink = convert(in.sink.view(), in.sink.rows, RATTN_DTYPE_FP32);
  data.d_lse = convert(in.d_lse.view(), in.d_lse.rows, RATTN_DTYPE_FP32);
  *o = make_outputs(s, l, dt);
  Bound b;
  b.q = data.q.data();
  b.k = data.k.data();
  b.v = data.v.data();
  b.d_o = data.d_o.data();
  b.o = o->o.data();
  b.lse = o->lse.data();
  b.dq = o->dq.data();
  b.dk = o->dk.data();
  b.dv = o->dv.data();
  b.sink = data.sink.data();
  b.d_sink = o->d_sink.data();
  b.d_lse = data.d_lse.data();
  b.cu_q = l.cu_q.data();
  b.cu_kv = l.cu_kv.data();
  b.off_q = l.padded() ? l.off_q.data() : nullptr;
  b.off_kv = l.padded() ? l.off_kv.data() : nullptr;
  reference::Options opt;
  opt.emulate_low_precision = emulate;
  opt.threads = run.reference_threads;
  const std::string kind = emulate ? std::string(dtype_str(dt)) + " emulation" : "exact fp32";
  report_phase(run, "CPU reference forward (" + kind + ")");
  reference::forward(plan.data(), b.fwd(), opt);
  // The backward under test was given the path's stored O: so is this backward, which makes the
  // rounding of O to the dtype part of the backward's input, not of its error (as for the brute
  // force). Where a short segment's dS = P (dP - dot(dO, O)) nearly cancels (one key and a sink),
  // that rounding is magnified, and the emulation's own O would round differently from the path's.
  HostTensor given_o = convert(stored_o.view(), stored_o.rows, dt);
  b.o = given_o.data();
  report_phase(run, "CPU reference backward (" + kind + ")");
  reference::backward(plan.data(), b.bwd(), opt);
  return Status::Ok();
}

// The precision dQ passes through on the plan's path: read from the plan (through the library,
// not the Plan's structs, so the verification code works over another build of the library),
// not re-derived.
rattn_dtype dq_precision(const Plan& plan) {
  const rattn_dtype t = plan.dq_accum_dtype();
  return t == RATTN_DTYPE_FP32 ? plan.problem().dtype : t;
}

Status compute_reference(const CaseSpec& spec, const Plan& plan, const PackLayout& l,
                         const HostInputs& in, const HostTensor& stored_o, const RunOptions& run,
                         ReferenceOutputs* out) {
  RATTN_RETURN_IF_ERROR(
      run_reference(spec, l, in, stored_o, RATTN_DTYPE_FP32, false, run, &out->exact));
  RATTN_RETURN_IF_ERROR(run_reference(spec, l, in, stored_o, spec.dtype, true, run, &out->lowp));
  const rattn_dtype dq = dq_precision(plan);
  if (dq != spec.dtype) {
    RATTN_RETURN_IF_ERROR(run_reference(spec, l, in, stored_o, dq, true, run, &out->lowp_dq));
  }
  return Status::Ok();
}

// A head_values tensor's values (empty for an empty tensor).
std::vector<double> head_doubles(const HostTensor& t) {
  std::vector<double> v;
  for (int64_t h = 0; h < t.rows; ++h) v.push_back(t.view().at(h, 0, 0));
  return v;
}

// d_sink is one value per query head, summed over every segment: it is compared as one vector
// (rows = heads). Without sinks the metrics are empty and pass.
Metrics check_d_sink(const HostTensor& x, const std::vector<double>& ref,
                     const std::vector<double>* lowp, const Tolerance& tol) {
  if (ref.empty()) return Metrics{};
  const std::vector<double> xs = head_doubles(x);
  Metrics m =
      compare(xs.data(), ref.data(), lowp ? lowp->data() : nullptr, int64_t(ref.size()), tol);
  m.rows = int64_t(ref.size());
  return m;
}

// cancellation() of d_sink, norm-wise over the heads.
double d_sink_cancellation(const std::vector<double>& sum, const std::vector<double>& magnitude) {
  double s = 0, m = 0;
  for (size_t h = 0; h < sum.size(); ++h) {
    s += sum[h] * sum[h];
    m += magnitude[h] * magnitude[h];
  }
  return cancellation(std::sqrt(s), std::sqrt(m));
}

// With sinks, a row that sees no key has O = 0 and LSE = the sink's logit by definition (no
// arithmetic on it but the sink's own rounding). Counts the (row, head) pairs of such rows into
// r->keyless_rows and those where either is not so into r->keyless_wrong: the norm-wise checks
// would let a small error there hide among the segment's other rows.
void check_keyless_rows(const CaseSpec& spec, const PackLayout& l, const HostOutputs& out,
                        const HostTensor& sink, CaseReport* r) {
  constexpr double kLseTol = 1e-6;  // relative: a few fp32 ulps of a log-domain round trip
  const MaskRule mask = MaskRule::of(spec);
  const TensorView o = out.o.view(), lse = out.lse.view();
  r->keyless_rows = r->keyless_wrong = 0;
  for (const SegmentRows& s : l.segments) {
    for (int32_t i = 0; i < s.len_q; ++i) {
      if (mask.keys_seen(i, s.len_q, s.len_kv) > 0) continue;
      const int64_t row = s.q_row0 + i;
      for (int32_t h = 0; h < spec.hq; ++h) {
        const double logit = sink.view().at(h, 0, 0);
        bool ok = std::fabs(lse.at(row, h, 0) - logit) <= kLseTol * std::max(1.0, std::fabs(logit));
        for (int32_t d = 0; d < spec.dv && ok; ++d) ok = o.at(row, h, d) == 0.0;
        ++r->keyless_rows;
        r->keyless_wrong += ok ? 0 : 1;
      }
    }
  }
}

struct DenseOutputs {
  DenseForward f;
  DenseBackward g;
};

// The float64 brute force's O, LSE, dQ, dK, dV for the cpu path's check. Memory that runs out
// part-way is reported as the brute force's, with its size (host_needs), not as a bare
// std::bad_alloc.
DenseOutputs brute_force(const CaseSpec& spec, const PackLayout& layout, const HostInputs& in,
                         const HostTensor& o, const RunOptions& opt) {
  try {
    report_phase(opt, "float64 brute force (setup)");
    DenseProblem dp = dense_problem(spec, layout);
    for (int64_t h = 0; h < in.sink.rows; ++h) dp.sink.push_back(in.sink.view().at(h, 0, 0));
    const DenseTensor q = to_dense(in.q.view(), in.q.rows);
    const DenseTensor k = to_dense(in.k.view(), in.k.rows);
    const DenseTensor v = to_dense(in.v.view(), in.v.rows);
    const DenseTensor d_o = to_dense(in.d_o.view(), in.d_o.rows);
    DenseOutputs out;
    report_phase(opt, "float64 brute force forward");
    out.f = dense_forward(dp, q, k, v, row_progress(opt, "float64 brute force forward"));
    report_phase(opt, "float64 brute force backward");
    // The backward under test was given the forward's stored O: so is the brute force, which
    // makes the rounding of O to the dtype part of the backward's input, not of its error.
    const DenseTensor d_lse = to_dense(in.d_lse.view(), in.d_lse.rows);
    out.g = dense_backward(dp, q, k, v, to_dense(o.view(), o.rows), d_o,
                           spec.lse_grad ? &d_lse : nullptr,
                           row_progress(opt, "float64 brute force backward"));
    return out;
  } catch (const std::bad_alloc&) {
    const HostNeed need = host_needs(spec, /*cpu_path=*/true, /*check=*/true).back();
    throw HostAllocError(need.bytes, need.what);
  }
}

}  // namespace

std::vector<HostNeed> host_needs(const CaseSpec& s, bool cpu_path, bool check) {
  using std::to_string;
  const int64_t tokens_q = total_tokens(s.seqlens_q), tokens_kv = total_tokens(s.kv_lens());
  const double elem = s.dtype == RATTN_DTYPE_FP32 ? 4 : 2;
  std::vector<HostNeed> needs;
  const std::string shape = to_string(tokens_q) + " query and " + to_string(tokens_kv) +
                            " key tokens, heads " + to_string(s.hq) + "/" + to_string(s.hkv) +
                            ", head dims " + to_string(s.dqk) + "/" + to_string(s.dv) + ", " +
                            dtype_str(s.dtype);
  needs.push_back({"the problem's tensors (Q, K, V, dO, O, LSE, dQ, dK, dV: " + shape + ")",
                   tensor_bytes(s, elem, 4)});
  if (cpu_path) needs.push_back({"the cpu backend's copies of them", tensor_bytes(s, elem, 4)});
  if (check && cpu_path) {
    // Float64 copies of the tensors (O twice: the backward's input and the forward's result),
    // dQ's and dK's magnitudes, the mask, and each thread's scores and slopes during the backward.
    const int threads = dense_threads(s.hkv);
    const double pairs = double(tokens_q) * double(tokens_kv);
    const double magnitudes = (double(tokens_q) * s.hq + double(tokens_kv) * s.hkv) * s.dqk * 8;
    const double bytes = tensor_bytes(s, 8, 8) + double(tokens_q) * s.hq * s.dv * 8 + magnitudes +
                         pairs + threads * pairs * 16;
    const std::string matrix = "[" + to_string(tokens_q) + " x " + to_string(tokens_kv) + "]";
    const std::string on =
        threads == 1 ? "on its thread" : "on each of " + to_string(threads) + " threads";
    needs.push_back({"the float64 brute force that checks the cpu path: float64 tensors, a " +
                         matrix + " mask, and " + matrix + " scores " + on,
                     bytes});
  } else if (check) {
    needs.push_back({"the CPU reference that checks the CUDA path (fp32 copies of the tensors)",
                     tensor_bytes(s, 4, 4)});
  }
  return needs;
}

Tolerances reference_tolerances() {
  Tolerances t;
  t.fill(Tolerance{});
  return t;
}

Tolerances dense_tolerances(rattn_dtype storage) {
  Tolerances t;
  for (int k = 0; k < kNumTensors; ++k) {
    // LSE is fp32 whatever the data's dtype.
    const rattn_dtype out = Tensor(k) == Tensor::Lse ? RATTN_DTYPE_FP32 : storage;
    t[size_t(k)] = Tolerance{kMinCosine, 0.0, kReferenceMathTol + unit_roundoff(out),
                             kReferenceMathTol, kReferenceMathTol};
  }
  return t;
}

namespace {

// Every tensor of the case in the plan's memory (inputs copied, outputs and workspaces poisoned).
Status bind_tensors(Memory& mem, const Plan& plan, const PackLayout& layout, const HostInputs& in,
                    const HostOutputs& test, Bound* b) {
  RATTN_RETURN_IF_ERROR(alloc_copy(mem, in.q.data(), in.q.bytes(), &b->q));
  RATTN_RETURN_IF_ERROR(alloc_copy(mem, in.k.data(), in.k.bytes(), &b->k));
  RATTN_RETURN_IF_ERROR(alloc_copy(mem, in.v.data(), in.v.bytes(), &b->v));
  RATTN_RETURN_IF_ERROR(alloc_copy(mem, in.d_o.data(), in.d_o.bytes(), &b->d_o));
  RATTN_RETURN_IF_ERROR(alloc_copy(mem, test.o.data(), test.o.bytes(), &b->o));
  RATTN_RETURN_IF_ERROR(alloc_copy(mem, test.lse.data(), test.lse.bytes(), &b->lse));
  RATTN_RETURN_IF_ERROR(alloc_copy(mem, test.dq.data(), test.dq.bytes(), &b->dq));
  RATTN_RETURN_IF_ERROR(alloc_copy(mem, test.dk.data(), test.dk.bytes(), &b->dk));
  RATTN_RETURN_IF_ERROR(alloc_copy(mem, test.dv.data(), test.dv.bytes(), &b->dv));
  RATTN_RETURN_IF_ERROR(alloc_optional(mem, in.sink, &b->sink));
  RATTN_RETURN_IF_ERROR(alloc_optional(mem, in.d_lse, &b->d_lse));
  RATTN_RETURN_IF_ERROR(alloc_optional(mem, test.d_sink, &b->d_sink));
  RATTN_RETURN_IF_ERROR(alloc_ints(mem, layout.cu_q, &b->cu_q));
  RATTN_RETURN_IF_ERROR(alloc_ints(mem, layout.cu_kv, &b->cu_kv));
  RATTN_RETURN_IF_ERROR(alloc_ints(mem, layout.off_q, &b->off_q));
  RATTN_RETURN_IF_ERROR(alloc_ints(mem, layout.off_kv, &b->off_kv));
  b->ws_fwd_bytes = plan.workspace_bytes(Direction::Forward);
  b->ws_bwd_bytes = plan.workspace_bytes(Direction::Backward);
  RATTN_RETURN_IF_ERROR(mem.alloc(b->ws_fwd_bytes, &b->ws_fwd));
  RATTN_RETURN_IF_ERROR(mem.alloc(b->ws_bwd_bytes, &b->ws_bwd));
  RATTN_RETURN_IF_ERROR(poison_workspace(mem, b->ws_fwd, b->ws_fwd_bytes));
  return poison_workspace(mem, b->ws_bwd, b->ws_bwd_bytes);
}

// One case's calls on the bound tensors: the forward and backward once (their outputs downloaded
// into `test`), the deterministic mode's second backward, and the timed calls where asked for.
// `stage` names the call a failure comes from.
class CaseCalls {
 public:
  CaseCalls(const CaseSpec& spec, const RunOptions& opt, const Plan& plan, const PackLayout& layout,
            Memory& mem, const Bound& b)
      : spec_(spec),
        opt_(opt),
        layout_(layout),
        mem_(mem),
        b_(b),
        ft_(b.fwd()),
        bt_(b.bwd()),
        fwd_([this, &plan] { return forward(plan, ft_, b_.ws_fwd, b_.ws_fwd_bytes); }),
        bwd_([this, &plan] { return backward(plan, bt_, b_.ws_bwd, b_.ws_bwd_bytes); }),
        on_device_(plan.path() != Path::Cpu) {}

  const char* stage = "memory";

  Status run(HostOutputs* test, CaseReport* r) {
    {
      const Watchdog dog = deadline("its forward, backward and downloads");
      RATTN_RETURN_IF_ERROR(checked_calls(test, r));
    }
    if (opt_.timing_runs > 0) RATTN_RETURN_IF_ERROR(time_both(r));
    return Status::Ok();
  }

 private:
  // RunOptions::hang_seconds on a span of device work; none on the CPU path, whose calls are the
  // host's own (the reference's sizes, minutes where a case is large).
  Watchdog deadline(const char* what) const {
    return Watchdog(
        on_device_ ? opt_.hang_seconds : 0.0,
        "case " + spec_.name + " (run seed " + std::to_string(opt_.seed) + "): " + what);
  }

  // The forward and backward once, their outputs downloaded, and deterministic mode's repeat.
  Status checked_calls(HostOutputs* test, CaseReport* r) {
    stage = "forward";
    report_phase(opt_, "forward");
    RATTN_RETURN_IF_ERROR(mem_.time(fwd_, &r->fwd_ms));
    stage = "backward";
    report_phase(opt_, "backward");
    RATTN_RETURN_IF_ERROR(mem_.time(bwd_, &r->bwd_ms));
    stage = "memory";
    RATTN_RETURN_IF_ERROR(download_outputs(mem_, b_, test));
    if (spec_.deterministic && opt_.check) RATTN_RETURN_IF_ERROR(repeat_backward(*test, r));
    return Status::Ok();
  }

  // Same inputs, fresh poison: a deterministic backward must reproduce every byte.
  Status repeat_backward(const HostOutputs& test, CaseReport* r) {
    HostOutputs again = make_outputs(spec_, layout_, spec_.dtype);
    RATTN_RETURN_IF_ERROR(upload_outputs(mem_, again, b_, /*fwd_outputs=*/false));
    RATTN_RETURN_IF_ERROR(poison_workspace(mem_, b_.ws_bwd, b_.ws_bwd_bytes));
    stage = "backward";
    report_phase(opt_, "backward again (determinism)");
    RATTN_RETURN_IF_ERROR(bwd_());
    stage = "memory";
    RATTN_RETURN_IF_ERROR(download_outputs(mem_, b_, &again));
    // d_sink too: it is computed in a fixed order in every mode.
    r->nondeterministic = differing_bytes(test.dq, again.dq) + differing_bytes(test.dk, again.dk) +
                          differing_bytes(test.dv, again.dv) +
                          differing_bytes(test.d_sink, again.d_sink);
    return Status::Ok();
  }

  // Each direction: an optional pause, the warm-up, then the timed calls (RunOptions), with the
  // GPU's clock and power sampled meanwhile. One report per direction: a report between the
  // timed calls would be time between them.
  Status time_both(CaseReport* r) {
    RATTN_RETURN_IF_ERROR(mem_.alloc(opt_.l2_flush_bytes, &flush_));
    stage = "forward";
    report_phase(opt_, "timing forward");
    {
      const Watchdog dog = deadline("its timed forward calls");
      RATTN_RETURN_IF_ERROR(time_direction(fwd_, &r->fwd_ms, &r->fwd_call_ms, &r->fwd_readings));
    }
    stage = "backward";
    report_phase(opt_, "timing backward");
    {
      const Watchdog dog = deadline("its timed backward calls");
      RATTN_RETURN_IF_ERROR(time_direction(bwd_, &r->bwd_ms, &r->bwd_call_ms, &r->bwd_readings));
    }
    r->timed_runs = opt_.timing_runs;
    return Status::Ok();
  }

  Status timed_call(const std::function<Status()>& fn, double* ms) {
    RATTN_RETURN_IF_ERROR(mem_.zero(flush_, opt_.l2_flush_bytes));
    return mem_.time(fn, ms);
  }

  Status time_direction(const std::function<Status()>& fn, double* median_ms,
                        std::vector<double>* times, std::vector<GpuReading>* readings) {
    constexpr int kMaxCalls = 100000;
    if (opt_.pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opt_.pause_ms));
    double ms = 0, warm = 0;
    for (int i = 0; i == 0 || (warm < opt_.warmup_ms && i < kMaxCalls); ++i) {
      RATTN_RETURN_IF_ERROR(timed_call(fn, &ms));
      warm += ms;
    }
    SensorSampler sampler([this](GpuReading* g) { return mem_.read_sensors(g); }, readings);
    double total = 0;
    while (int(times->size()) < opt_.timing_runs ||
           (total < opt_.min_timed_ms && int(times->size()) < kMaxCalls)) {
      RATTN_RETURN_IF_ERROR(timed_call(fn, &ms));
      times->push_back(ms);
      total += ms;
    }
    sampler.stop();
    *median_ms = median(*times);
    return Status::Ok();
  }

  const CaseSpec& spec_;
  const RunOptions& opt_;
  const PackLayout& layout_;
  Memory& mem_;
  const Bound& b_;
  const FwdTensors ft_;
  const BwdTensors bt_;
  const std::function<Status()> fwd_, bwd_;
  const bool on_device_;
  void* flush_ = nullptr;
};

// The outputs against the dense float64 brute force (the CPU path) or the reference (the GPU
// paths), segment by segment and tensor by tensor; sets r's checks and verdict.
void check_outputs(const CaseSpec& spec, const RunOptions& opt, const Plan& plan,
                   const PackLayout& layout, const HostInputs& in, const HostOutputs& test,
                   bool padding_ok, CaseReport* r) {
  const auto t0 = std::chrono::steady_clock::now();
  if (plan.path() == Path::Cpu) {
    r->mode = CheckMode::Dense;
    const DenseOutputs dense = brute_force(spec, layout, in, test.o, opt);
    const TensorViews ref = {dense.f.o.view(), dense.f.lse.view(), dense.g.dq.view(),
                             dense.g.dk.view(), dense.g.dv.view()};
    const Tolerances tol = dense_tolerances(spec.dtype);
    // dQ's and dK's rounding is relative to their terms (dS nearly cancels in short segments).
    TensorViews magnitude{};
    magnitude[size_t(Tensor::Dq)] = dense.g.dq_magnitude.view();
    magnitude[size_t(Tensor::Dk)] = dense.g.dk_magnitude.view();
    r->segments = check_all(layout.segments, views(test), ref, nullptr, tol, &magnitude);
    // d_sink is fp32 whatever the data's dtype, as LSE is; its rounding is relative to its terms.
    const Tolerance d_sink_tol = tol[size_t(Tensor::Lse)].with_cancellation(
        d_sink_cancellation(dense.g.d_sink, dense.g.d_sink_magnitude));
    r->d_sink = check_d_sink(test.d_sink, dense.g.d_sink, nullptr, d_sink_tol);
  } else {
    r->mode = CheckMode::Reference;
    ReferenceOutputs ref;
    if (Status s = compute_reference(spec, plan, layout, in, test.o, opt, &ref); !s.ok()) {
      fail(r, "reference", s);
      return;
    }
    TensorViews lowp = views(ref.lowp);
    if (ref.lowp_dq.dq.data()) lowp[size_t(Tensor::Dq)] = ref.lowp_dq.dq.view();
    r->segments =
        check_all(layout.segments, views(test), views(ref.exact), &lowp, reference_tolerances());
    const std::vector<double> lowp_d_sink = head_doubles(ref.lowp.d_sink);
    r->d_sink = check_d_sink(test.d_sink, head_doubles(ref.exact.d_sink), &lowp_d_sink,
                             reference_tolerances()[size_t(Tensor::Lse)]);
  }
  if (spec.sink) check_keyless_rows(spec, layout, test, in.sink, r);
  r->check_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  r->pass = padding_ok && r->nondeterministic <= 0 && r->d_sink.pass && r->keyless_wrong <= 0 &&
            std::all_of(r->segments.begin(), r->segments.end(),
                        [](const SegmentCheck& seg) { return seg.pass(); });
}

}  // namespace

CaseReport run_case(const CaseSpec& spec, const RunOptions& opt) {
  CaseReport r;
  r.spec = spec;
  r.seed = mix_seed(opt.seed, hash_name(spec.name.c_str()));

  const PackLayout layout = make_layout(spec, r.seed);
  const Problem problem = make_problem(spec, layout);
  const DeviceCaps caps = opt.caps ? *opt.caps : query_device();
  Plan plan;
  if (Status s = make_plan(problem, caps, &plan); !s.ok()) {
    fail(&r, "make_plan", s);
    return r;
  }
  r.path = plan.describe();

  report_phase(opt, "drawing inputs");
  const HostInputs in = make_inputs(spec, layout, r.seed);
  HostOutputs test = make_outputs(spec, layout, spec.dtype);

  std::unique_ptr<Memory> mem = plan.path() == Path::Cpu ? host_memory() : device_memory();
  if (!mem) {
    fail(&r, "memory",
         Status(RATTN_ERROR_NOT_SUPPORTED,
                "raggedattn verify: the plan chose " + r.path +
                    " but this build has no CUDA runtime to allocate its memory"));
    return r;
  }

  Bound b;
  if (Status s = bind_tensors(*mem, plan, layout, in, test, &b); !s.ok()) {
    fail(&r, "memory", s);
    return r;
  }
  CaseCalls calls(spec, opt, plan, layout, *mem, b);
  if (Status s = calls.run(&test, &r); !s.ok()) {
    fail(&r, calls.stage, s);
    return r;
  }

  // Padding rows keep the sentinel, or hold zeros in the zero_padding mode.
  const uint8_t pad = spec.zero_padding ? uint8_t(0) : kPaddingByte;
  r.padding_changed = {changed_padding(test.o, layout.q_padding, pad),
                       changed_padding(test.lse, layout.q_padding, pad),
                       changed_padding(test.dq, layout.q_padding, pad),
                       changed_padding(test.dk, layout.kv_padding, pad),
                       changed_padding(test.dv, layout.kv_padding, pad)};
  const bool padding_ok =
      std::all_of(r.padding_changed.begin(), r.padding_changed.end(), [](int64_t n) { return !n; });
  if (!opt.check) {
    r.mode = CheckMode::None;
    r.pass = true;
    return r;
  }
  check_outputs(spec, opt, plan, layout, in, test, padding_ok, &r);
  return r;
}

}  // namespace verify
}  // namespace raggedattn

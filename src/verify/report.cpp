#include "verify/report.hpp"

#include <cinttypes>
#include <cstdio>
#include <string>

namespace raggedattn {
namespace verify {
namespace {

template <class... Args>
std::string fmt(const char* f, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), f, args...);
  return buf;
}

// One tensor's cell: "cos rel max" and a mark, 26 columns.
std::string cell(const Metrics& m) {
  if (m.empty()) return fmt("%-26s", "         (empty)");
  const char mark = m.pass ? ' ' : '!';
  if (m.nonfinite || m.inf_mismatch) {
    return fmt("%-25s%c",
               fmt(" nonfinite=%" PRId64 " -inf=%" PRId64, m.nonfinite, m.inf_mismatch).c_str(),
               mark);
  }
  if (m.elements == 0) return fmt("%-25s%c", "   (all -inf, as ref)", mark);
  return fmt(" %8.6f %7.1e %7.1e%c", m.cos, m.rel, m.max_abs, mark);
}

std::string mode_str(const CaseReport& r) {
  switch (r.mode) {
    case CheckMode::Reference:
      return fmt("vs CPU reference: cos >= %.4f, rel <= %.0f x low-precision rel + %.0e",
                 kMinCosine, kLowpFactor, kRelFloor);
    case CheckMode::Dense:
      return fmt(
          "vs float64 brute force: cos >= %.4f, rel <= %.0e (x the terms' cancellation "
          "in dQ, dK) + %s rounding",
          kMinCosine, kReferenceMathTol, dtype_str(r.spec.dtype));
    case CheckMode::None:
      break;
  }
  return "not checked";
}

void print_failures(std::ostream& os, const CaseReport& r) {
  for (size_t b = 0; b < r.segments.size(); ++b) {
    for (int k = 0; k < kNumTensors; ++k) {
      const Metrics& m = r.segments[b].t[size_t(k)];
      if (m.pass) continue;
      os << "   ! segment " << b << " " << tensor_name(Tensor(k)) << ": ";
      if (m.nonfinite) os << m.nonfinite << " NaN/Inf outputs (unwritten or overflowed); ";
      if (m.inf_mismatch)
        os << m.inf_mismatch << " elements -inf in only one of output/reference; ";
      if (m.zero_ref) {
        os << fmt("reference is all zero, max abs %.3e (bound %.3e)", m.max_abs, m.bound);
      } else if (!m.nonfinite && !m.inf_mismatch) {
        os << fmt("cos %.6f (min %.4f), rel %.3e (bound %.3e", m.cos, kMinCosine, m.rel, m.bound);
        if (r.mode == CheckMode::Reference) os << fmt(" = 2 x %.3e + floor", m.rel_lowp);
        os << ")";
      }
      os << "\n";
    }
  }
  for (int k = 0; k < kNumTensors; ++k) {
    if (r.padding_changed[size_t(k)]) {
      os << "   ! padding rows of " << tensor_name(Tensor(k)) << ": "
         << r.padding_changed[size_t(k)]
         << (r.spec.zero_padding ? " elements outside every segment not zeroed (zero_padding)\n"
                                 : " elements written outside every segment\n");
    }
  }
  if (r.nondeterministic > 0) {
    os << "   ! deterministic backward: " << r.nondeterministic
       << " bytes of dQ/dK/dV/d_sink differ between two runs\n";
  }
  const Metrics& ds = r.d_sink;
  if (!ds.pass) {
    os << "   ! d_sink: ";
    if (ds.nonfinite || ds.inf_mismatch) {
      os << ds.nonfinite + ds.inf_mismatch << " of " << ds.rows << " heads NaN/Inf";
    } else {
      os << fmt("cos %.6f (min %.4f), rel %.3e (bound %.3e)", ds.cos, kMinCosine, ds.rel, ds.bound);
    }
    os << "\n";
  }
  if (r.keyless_wrong > 0) {
    os << "   ! rows that see no key: " << r.keyless_wrong << " of " << r.keyless_rows
       << " (row, head) pairs where O is not 0 or LSE is not the sink's logit\n";
  }
}

// With sinks: d_sink over the heads, and whether the rows that see no key came out as defined.
void print_sink_checks(std::ostream& os, const CaseReport& r) {
  const Metrics& m = r.d_sink;
  if (!m.empty()) {
    os << "   d_sink (" << m.rows << " heads, summed over the segments):";
    if (m.nonfinite || m.inf_mismatch || m.elements == 0) {
      os << cell(m) << "\n";
    } else {
      os << fmt(" cos %.6f rel %.1e max %.1e%s\n", m.cos, m.rel, m.max_abs, m.pass ? "" : " !");
    }
  }
  if (r.keyless_wrong == 0 && r.keyless_rows > 0) {
    os << "   rows that see no key (" << r.keyless_rows
       << " row-heads): O = 0, LSE = the sink's logit\n";
  }
}

}  // namespace

double worst_ratio(const CaseReport& r, int* segment, Tensor* tensor) {
  double worst = 0;
  if (segment) *segment = -1;
  for (size_t b = 0; b < r.segments.size(); ++b) {
    for (int k = 0; k < kNumTensors; ++k) {
      const Metrics& m = r.segments[b].t[size_t(k)];
      if (m.empty() || m.elements == 0 || m.zero_ref || m.bound <= 0) continue;
      const double ratio = m.rel / m.bound;
      if (ratio > worst || (segment && *segment < 0)) {
        worst = ratio;
        if (segment) *segment = int(b);
        if (tensor) *tensor = Tensor(k);
      }
    }
  }
  return worst;
}

void print_summary(std::ostream& os, const CaseReport& r) {
  const char* verdict = r.pass ? (r.mode == CheckMode::None ? "RAN " : "PASS") : "FAIL";
  os << fmt("%-24s %s", r.spec.name.c_str(), verdict);
  if (r.status != RATTN_SUCCESS) {
    os << "  " << r.stage << " failed: " << r.error << "\n";
    return;
  }
  os << "  " << r.path;
  if (r.timed_runs > 0) {
    os << fmt("  fwd %.3f ms  bwd %.3f ms (median of %d)", r.fwd_ms, r.bwd_ms, r.timed_runs);
  } else {
    os << fmt("  fwd %.3f ms  bwd %.3f ms", r.fwd_ms, r.bwd_ms);
  }
  int seg = -1;
  Tensor t = Tensor::O;
  const double w = worst_ratio(r, &seg, &t);
  if (seg >= 0) os << fmt("  worst rel/bound %.2f (%s, segment %d)", w, tensor_name(t), seg);
  const Metrics& ds = r.d_sink;
  if (!ds.empty() && ds.elements > 0 && ds.bound > 0) {
    os << fmt("  d_sink rel/bound %.2f", ds.zero_ref ? ds.max_abs / ds.bound : ds.rel / ds.bound);
  }
  os << "\n";
}

void print_case(std::ostream& os, const CaseReport& r) {
  const CaseSpec& s = r.spec;
  os << "== " << s.name << ": " << segments_str(s) << " Hq=" << s.hq << " Hkv=" << s.hkv
     << " D=" << s.dqk << "/" << s.dv << " " << dtype_str(s.dtype) << ", " << mask_str(s)
     << (s.padded ? (s.nan_padding ? ", padded THD (NaN padding)" : ", padded THD") : "")
     << (s.trailing_rows > 0 ? fmt(", %d rows past the last segment", s.trailing_rows) : "")
     << (s.zero_padding ? ", zero_padding" : "") << ", dq_accum " << dq_accum_str(s.dq_accum)
     << (s.deterministic ? ", deterministic" : "") << fmt(", seed 0x%016" PRIx64, r.seed) << "\n";
  if (r.status == RATTN_SUCCESS && r.mode != CheckMode::None) {
    os << "   " << mode_str(r) << "\n";
    std::string head = fmt(" %4s %6s %6s", "seg", "len_q", "len_kv");
    std::string sub = fmt(" %4s %6s %6s", "", "", "");
    for (int k = 0; k < kNumTensors; ++k) {
      head += fmt(" |%-26s", fmt(" %s", tensor_name(Tensor(k))).c_str());
      sub += fmt(" |%-26s", "      cos     rel     max");
    }
    os << head << "\n" << sub << "\n";
    for (size_t b = 0; b < r.segments.size(); ++b) {
      const SegmentCheck& c = r.segments[b];
      std::string line = fmt(" %4zu %6d %6d", b, c.len_q, c.len_kv);
      for (int k = 0; k < kNumTensors; ++k) line += " |" + cell(c.t[size_t(k)]);
      os << line << "\n";
    }
    if (r.spec.padded || r.spec.trailing_rows > 0) {
      bool clean = true;
      for (int64_t n : r.padding_changed) clean = clean && n == 0;
      if (clean)
        os << (r.spec.zero_padding ? "   padding rows: zeroed\n" : "   padding rows: untouched\n");
    }
    print_sink_checks(os, r);
    if (r.nondeterministic == 0) os << "   deterministic: two backward runs bitwise equal\n";
    print_failures(os, r);
  }
  print_summary(os, r);
}

bool print_verdict(std::ostream& os, const std::vector<CaseReport>& reports) {
  std::string failed;
  int n_failed = 0;
  for (const CaseReport& r : reports) {
    if (r.pass) continue;
    failed += (n_failed++ ? ", " : "") + r.spec.name;
  }
  if (n_failed == 0) {
    os << "PASS (" << reports.size() << (reports.size() == 1 ? " case)" : " cases)") << "\n";
    return true;
  }
  os << "FAIL (" << n_failed << " of " << reports.size() << " cases: " << failed << ")\n";
  return false;
}

}  // namespace verify
}  // namespace raggedattn

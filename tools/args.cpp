#include "args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace raggedattn {
namespace cli {
namespace {

[[noreturn]] void bad(const std::string& option, const std::string& text, const std::string& want) {
  throw UsageError(option + ": got '" + text + "'; expected " + want);
}

bool to_int64(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno || *end != '\0') return false;
  *out = v;
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t at = s.find(sep, start);
    parts.push_back(s.substr(start, at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

}  // namespace

Args::Args(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) items_.emplace_back(argv[i]);
}

std::string Args::next_option() {
  std::string item = items_[pos_++];
  if (item.size() < 3 || item.compare(0, 2, "--") != 0) {
    throw UsageError("unexpected argument '" + item + "'; options start with --");
  }
  has_pending_ = false;
  const size_t eq = item.find('=');
  if (eq != std::string::npos) {
    pending_ = item.substr(eq + 1);
    has_pending_ = true;
    item.resize(eq);
  }
  return item;
}

std::string Args::value(const std::string& option) {
  if (has_pending_) {
    has_pending_ = false;
    return pending_;
  }
  if (done()) throw UsageError(option + ": missing value");
  return items_[pos_++];
}

void Args::no_value(const std::string& option) {
  if (has_pending_) throw UsageError(option + " takes no value (got '=" + pending_ + "')");
}

int32_t parse_int(const std::string& option, const std::string& text, int64_t min, int64_t max) {
  int64_t v = 0;
  if (!to_int64(text, &v) || v < min || v > max) {
    bad(option, text, "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return int32_t(v);
}

uint64_t parse_u64(const std::string& option, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 0);
  if (text.empty() || text[0] == '-' || errno || *end != '\0') {
    bad(option, text, "a non-negative integer (decimal or 0x hex)");
  }
  return v;
}

float parse_float(const std::string& option, const std::string& text, double min) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || errno || *end != '\0' || !std::isfinite(v) || v < min ||
      v > std::numeric_limits<float>::max()) {
    char lo[32];
    std::snprintf(lo, sizeof(lo), "%g", min);
    bad(option, text, std::string("a finite number >= ") + lo);
  }
  return float(v);
}

std::vector<int32_t> parse_lengths(const std::string& option, const std::string& text) {
  // cu_seqlens are int32: each length, and their running sum, must fit. Parsed as int64 so that
  // an over-long total is named, not wrapped.
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> lens;
  int64_t total = 0;
  for (const std::string& part : split(text, ',')) {
    int64_t v = 0;
    if (!to_int64(part, &v) || v < 0) {
      bad(option, text, "comma-separated segment lengths >= 0, e.g. 100,80,76");
    }
    if (v > kMax) {
      throw UsageError(
          option + ": segment " + std::to_string(lens.size()) + " has " + std::to_string(v) +
          " tokens; cu_seqlens are int32, so a segment has at most " + std::to_string(kMax));
    }
    lens.push_back(int32_t(v));
    total += v;  // at most (number of segments) * 2^31: no overflow from a command line
  }
  if (total > kMax) {
    throw UsageError(option + ": the total token count (" + std::to_string(total) +
                     ") exceeds the int32 range of cu_seqlens (" + std::to_string(kMax) + ")");
  }
  return lens;
}

void parse_heads(const std::string& option, const std::string& text, int32_t* hq, int32_t* hkv) {
  const std::vector<std::string> parts = split(text, '/');
  int64_t a = 0, b = 0;
  if (parts.size() != 2 || !to_int64(parts[0], &a) || !to_int64(parts[1], &b) || a < 1 || b < 1 ||
      a > 4096 || b > 4096) {
    bad(option, text, "HQ/HKV with positive head counts, e.g. 32/8");
  }
  *hq = int32_t(a);
  *hkv = int32_t(b);
}

void parse_window(const std::string& option, const std::string& text, int32_t* left,
                  int32_t* right) {
  const std::vector<std::string> parts = split(text, ',');
  int64_t l = 0, r = 0;
  if (parts.size() != 2 || !to_int64(parts[0], &l) || !to_int64(parts[1], &r) || l < -1 || r < -1 ||
      l > std::numeric_limits<int32_t>::max() || r > std::numeric_limits<int32_t>::max()) {
    bad(option, text, "L,R with each side -1 (unbounded) or >= 0, e.g. 128,0");
  }
  *left = int32_t(l);
  *right = int32_t(r);
}

}  // namespace cli
}  // namespace raggedattn

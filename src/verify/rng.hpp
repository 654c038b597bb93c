// A small seeded generator (SplitMix64 with Box-Muller normals). Written out rather than taken from
// <random> because std::normal_distribution's output differs between standard libraries, and a
// failing case must reproduce from its printed seed on any machine.
#pragma once

#include <cmath>
#include <cstdint>

namespace raggedattn {
namespace verify {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform integer in [lo, hi] (hi >= lo).
  int64_t range(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }
  bool chance(double p) { return uniform() < p; }
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;  // log(0)
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double t = 6.283185307179586 * u2;
    spare_ = r * std::sin(t);
    has_spare_ = true;
    return r * std::cos(t);
  }

 private:
  uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

// Derives independent streams from one run seed (per case, per tensor).
inline uint64_t mix_seed(uint64_t a, uint64_t b) {
  Rng r(a ^ (b * 0xd1342543de82ef95ull));
  r.next();
  return r.next();
}

inline uint64_t hash_name(const char* s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (; *s; ++s) h = (h ^ uint8_t(*s)) * 0x100000001b3ull;
  return h;
}

}  // namespace verify
}  // namespace raggedattn

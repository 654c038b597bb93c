// Host+device portability for src/core: these headers compile as plain C++ (CPU tests, plan,
// reference backend) and as CUDA (kernels), so the math each side uses is the same code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define RATTN_HD __host__ __device__ __forceinline__
#else
#define RATTN_HD inline
#endif

namespace raggedattn {

RATTN_HD int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
RATTN_HD int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}
RATTN_HD int64_t clamp64(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

}  // namespace raggedattn

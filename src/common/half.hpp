// Host conversions between float and the 16-bit formats (round to nearest even), with no
// dependency on compiler extensions: the CPU backend and the tests read and write bf16/fp16 data.
#pragma once

#include <cstdint>
#include <cstring>

#include "raggedattn/raggedattn.h"

namespace raggedattn {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t h) {
  return bits_to_float(uint32_t(h) << 16);
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float fp16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    float f = float(man) * (1.0f / 16777216.0f);  // subnormal: man * 2^-24
    return sign ? -f : f;
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (man << 13));
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}
inline uint16_t float_to_fp16(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                  // below 2^-14: subnormal or zero
    float v = bits_to_float(a) * 16777216.0f;             // in units of 2^-24
    uint32_t m = uint32_t(v);
    float rem = v - float(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return uint16_t(sign | m);
  }
  uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
  return uint16_t(sign | (((rounded >> 23) - 112) << 10) | ((rounded >> 13) & 0x3ffu));
}

inline float load_elem(const void* base, int64_t i, rattn_dtype t) {
  switch (t) {
    case RATTN_DTYPE_BF16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case RATTN_DTYPE_FP16:
      return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}
inline void store_elem(void* base, int64_t i, rattn_dtype t, float v) {
  switch (t) {
    case RATTN_DTYPE_BF16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16(v);
      break;
    case RATTN_DTYPE_FP16:
      static_cast<uint16_t*>(base)[i] = float_to_fp16(v);
      break;
    default:
      static_cast<float*>(base)[i] = v;
      break;
  }
}
// Rounds v to what `t` can hold (identity for fp32).
inline float round_to(rattn_dtype t, float v) {
  switch (t) {
    case RATTN_DTYPE_BF16:
      return bf16_to_float(float_to_bf16(v));
    case RATTN_DTYPE_FP16:
      return fp16_to_float(float_to_fp16(v));
    default:
      return v;
  }
}

}  // namespace raggedattn

// Special functions on the fast hardware paths (MUFU), as the softmax needs them.
#pragma once

namespace raggedattn {
namespace gpu {

constexpr float kLn2 = 0.6931471805599453f;

// 2^x; exp2(-inf) = 0, which the masking relies on.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// tanh with about 2^-11 relative error: well under bf16/fp16 rounding of the scores it caps.
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace gpu
}  // namespace raggedattn

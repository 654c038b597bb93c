// One dispatcher from a problem's dtype and head dims to a kernel instantiation, for every CUDA
// path: each path lists its instantiated (head_dim_qk, head_dim_v) pairs once as an X-macro
// (portable/instantiations.hpp, core/sm90_shapes.hpp), its supports() test and its dispatch both
// read that list, and a pair outside it is an error here, never another kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "plan/plan_data.hpp"

// One case of a dispatcher body: the launcher `f` for (DQK, DV) at the problem's 16-bit type.
#define RATTN_DISPATCH_CASE(DQK, DV)                                                      \
  if (pr.head_dim_qk == DQK && pr.head_dim_v == DV) {                                     \
    return pr.dtype == RATTN_DTYPE_BF16 ? f.template operator()<__nv_bfloat16, DQK, DV>() \
                                        : f.template operator()<__half, DQK, DV>();       \
  }

// Defines `template <class F> cudaError_t NAME(const Problem& pr, const F& f)`, which calls
// f.template operator()<T, DQK, DV>() for the (DQK, DV) of LIST that the problem has, and returns
// cudaErrorInvalidValue for any other pair (callers check their supports() first and report it).
// F is a struct with a templated call operator: nvcc 13.0's front end crashes on generic lambdas
// with integral_constant parameters used as template arguments.
#define RATTN_DEFINE_DIMS_DISPATCH(NAME, LIST)                    \
  template <class F>                                              \
  cudaError_t NAME(const ::raggedattn::Problem& pr, const F& f) { \
    LIST(RATTN_DISPATCH_CASE)                                     \
    return cudaErrorInvalidValue;                                 \
  }

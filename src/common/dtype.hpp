#pragma once

#include "raggedattn/raggedattn.h"

namespace raggedattn {

inline int dtype_bytes(rattn_dtype t) {
  return t == RATTN_DTYPE_FP32 ? 4 : 2;
}
inline const char* dtype_name(rattn_dtype t) {
  switch (t) {
    case RATTN_DTYPE_BF16:
      return "bf16";
    case RATTN_DTYPE_FP16:
      return "fp16";
    case RATTN_DTYPE_FP32:
      return "fp32";
  }
  return "unknown";
}

}  // namespace raggedattn

// The explicit, short list of kernel instantiations of the portable path: one line per supported
// (head_dim_qk, head_dim_v); each is compiled in its own translation unit (inst_*.cu) for both
// 16-bit types, so the build parallelizes and a change to one shape recompiles one file.
#pragma once

#define RATTN_PORTABLE_HEAD_DIMS(X) \
  X(64, 64)                         \
  X(96, 96)                         \
  X(128, 128)                       \
  X(192, 192)                       \
  X(192, 128)                       \
  X(256, 256)

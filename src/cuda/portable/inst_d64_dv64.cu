#include "cuda/portable/launch_impl.cuh"

RATTN_INSTANTIATE_PORTABLE(64, 64)

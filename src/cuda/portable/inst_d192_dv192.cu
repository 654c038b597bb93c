#include "cuda/portable/launch_impl.cuh"

RATTN_INSTANTIATE_PORTABLE(192, 192)

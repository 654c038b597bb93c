#include "cuda/portable/launch_impl.cuh"

RATTN_INSTANTIATE_PORTABLE(256, 256)

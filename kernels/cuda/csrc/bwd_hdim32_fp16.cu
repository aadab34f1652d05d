// Backward instantiation: fp16, head_dim 32.
#include "bwd.cuh"
VITK_INSTANTIATE_BWD(kFloat16, 32)

// Backward instantiation: fp16, head_dim 128.
#include "bwd.cuh"
VITK_INSTANTIATE_BWD(kFloat16, 128)

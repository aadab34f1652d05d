// Backward instantiation: bf16, head_dim 128.
#include "bwd.cuh"
VITK_INSTANTIATE_BWD(kBFloat16, 128)

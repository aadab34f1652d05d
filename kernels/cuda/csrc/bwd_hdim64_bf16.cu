// Backward instantiation: bf16, head_dim 64.
#include "bwd.cuh"
VITK_INSTANTIATE_BWD(kBFloat16, 64)

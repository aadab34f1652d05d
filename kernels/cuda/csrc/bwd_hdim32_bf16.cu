// Backward instantiation: bf16, head_dim 32.
#include "bwd.cuh"
VITK_INSTANTIATE_BWD(kBFloat16, 32)

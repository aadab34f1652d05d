// Forward instantiation: bf16, head_dim 64.
#include "fwd.cuh"
VITK_INSTANTIATE_FWD(kBFloat16, 64)

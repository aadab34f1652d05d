// Forward instantiation: bf16, head_dim 128.
#include "fwd.cuh"
VITK_INSTANTIATE_FWD(kBFloat16, 128)

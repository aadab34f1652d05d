// Forward instantiation: fp16, head_dim 64.
#include "fwd.cuh"
VITK_INSTANTIATE_FWD(kFloat16, 64)

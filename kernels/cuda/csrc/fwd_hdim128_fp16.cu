// Forward instantiation: fp16, head_dim 128.
#include "fwd.cuh"
VITK_INSTANTIATE_FWD(kFloat16, 128)

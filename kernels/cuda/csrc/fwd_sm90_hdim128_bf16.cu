// Forward instantiation for Hopper (sm_90a): bf16, head_dim 128.
#include "fwd_sm90.cuh"
VITK_INSTANTIATE_FWD_SM90(kBFloat16, 128)

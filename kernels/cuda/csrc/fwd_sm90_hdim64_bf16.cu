// Forward instantiation for Hopper (sm_90a): bf16, head_dim 64.
#include "fwd_sm90.cuh"
VITK_INSTANTIATE_FWD_SM90(kBFloat16, 64)

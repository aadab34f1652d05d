// Backward instantiation for Hopper (sm_90a): bf16, head_dim 64.
#include "bwd_sm90.cuh"
VITK_INSTANTIATE_BWD_SM90(kBFloat16, 64)

// Backward instantiation for Hopper (sm_90a): bf16, head_dim 128.
#include "bwd_sm90.cuh"
VITK_INSTANTIATE_BWD_SM90(kBFloat16, 128)

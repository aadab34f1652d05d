// Backward instantiation for Hopper (sm_90a): fp16, head_dim 64.
#include "bwd_sm90.cuh"
VITK_INSTANTIATE_BWD_SM90(kFloat16, 64)

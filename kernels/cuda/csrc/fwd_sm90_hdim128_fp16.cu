// Forward instantiation for Hopper (sm_90a): fp16, head_dim 128.
#include "fwd_sm90.cuh"
VITK_INSTANTIATE_FWD_SM90(kFloat16, 128)

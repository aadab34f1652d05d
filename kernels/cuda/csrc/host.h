// The extension's host entry points (api.cpp), shared by the Python bindings and the eager autograd node
// (eager.cpp). Shapes: q, k, v, out, dout, dq, dk, dv (B, H, N, head_dim) float16/bfloat16 CUDA tensors, lse
// (B, H, N) float32; each forward returns {out, lse}, each backward {dq, dk, dv}. api.cpp's comments and bindings
// say what each variant runs; every one checks its arguments and raises ValueError or TypeError.
#pragma once

#include <optional>
#include <vector>

#include <torch/extension.h>

#include "packed_views.h"

namespace vitk::host {

using Forward = std::vector<at::Tensor> (*)(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale);

std::vector<at::Tensor> fwd(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale);
std::vector<at::Tensor> fwd_sm90(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale);
std::vector<at::Tensor> fwd_sm90_pingpong(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale);
std::vector<at::Tensor> fwd_sm90_wide(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale);
std::vector<at::Tensor> fwd_sm90_persistent(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale);
std::vector<at::Tensor> fwd_sm90_persistent_pingpong(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale);
std::vector<at::Tensor> fwd_sm90_short(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale);

std::vector<at::Tensor> bwd(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out,
                            at::Tensor lse, double softmax_scale, int64_t bwd_warps, int64_t dq_splits,
                            std::optional<at::Tensor> dqkv);
std::vector<at::Tensor> bwd_sm90(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out,
                                 at::Tensor lse, double softmax_scale, std::optional<at::Tensor> dqkv, bool dq_cols,
                                 bool dq_sum, bool dq_rows, bool dq_tma, bool overlap, int64_t key_ctas,
                                 int64_t dq_splits);

}  // namespace vitk::host

namespace vitk::eager {

// Adds the eager entry points (eager.cpp) to the extension's module.
void bind(pybind11::module_ &m);

}  // namespace vitk::eager

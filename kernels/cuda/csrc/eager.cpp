// Eager attention with no Python between the call and the kernels' launchers: the autograd node in C++.
//
// Why: at ViT sizes one call's GPU work is about what its CPU work costs, so at batch 16 the GPU waits for the host.
// The Python torch.autograd.Function that launched these kernels cost 0.297 ms of CPU per forward+backward at
// (256, 12, 197, 64) against SDPA's 0.203 on the H200's host (benchmarks/results/h200_20261204_d/call1_launch.log);
// the flash backend's C++ node (kernels/flash/csrc/eager.cpp) took its own path from 0.404 to 0.183 ms. This node, on
// an H100's host in one process (benchmarks/results/h100_20261207f/call1_overhead_new.log, median of 5 rounds): 0.157-
// 0.187 ms (packed 0.150-0.172) at (256, 6 or 12, 197, 64) against SDPA's 0.168-0.192, the op path 0.30-0.37.
//
// What: Python (kernels/cuda/eager.py) picks the forward's entry point and the backward's arguments, the plan, once
// per call from kernels/cuda/ops.py's rules, the ones the torch.library ops (torch.compile's path) follow; the node
// saves q, k, v (or the packed qkv), out and lse, and its backward calls the same entry point the ops call
// (`backward` below), so both paths run the same kernels with the same arguments (tests/test_cuda_eager.py compares
// them on the GPU).
#include <array>
#include <string>

#include "once_differentiable.h"

#include "host.h"

namespace vitk::eager {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The backward plan: {sm90, bwd_warps, dq_splits, dq_cols, dq_sum, dq_rows, dq_tma, overlap, key_ctas}, as
// kernels/cuda/ops.py's backward_plan builds it.
constexpr size_t kPlanSize = 9;

host::Forward forward_named(const std::string &name) {
  static const std::array<std::pair<const char *, host::Forward>, 7> table = {{
      {"fwd", host::fwd}, {"fwd_sm90", host::fwd_sm90}, {"fwd_sm90_pingpong", host::fwd_sm90_pingpong},
      {"fwd_sm90_wide", host::fwd_sm90_wide}, {"fwd_sm90_persistent", host::fwd_sm90_persistent},
      {"fwd_sm90_persistent_pingpong", host::fwd_sm90_persistent_pingpong}, {"fwd_sm90_short", host::fwd_sm90_short},
  }};
  for (const auto &[n, f] : table) {
    if (name == n) return f;
  }
  TORCH_CHECK_VALUE(false, "unknown forward '" + name + "': one of fwd, fwd_sm90, fwd_sm90_pingpong, fwd_sm90_wide, "
                    "fwd_sm90_persistent, fwd_sm90_persistent_pingpong, fwd_sm90_short");
  return nullptr;
}

void check_plan(const std::vector<int64_t> &plan) {
  TORCH_CHECK_VALUE(plan.size() == kPlanSize, "the backward plan must hold 9 integers {sm90, bwd_warps, dq_splits, "
                    "dq_cols, dq_sum, dq_rows, dq_tma, overlap, key_ctas}, got " + std::to_string(plan.size()));
}

struct Attention : public torch::autograd::Function<Attention> {
  static at::Tensor forward(AutogradContext *ctx, at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale,
                            const std::string &forward, std::vector<int64_t> plan) {
    auto out_lse = forward_named(forward)(q, k, v, softmax_scale);  // out (B, H, N, d), lse (B, H, N) float32
    ctx->save_for_backward({q, k, v, out_lse[0], out_lse[1]});
    ctx->saved_data["softmax_scale"] = softmax_scale;
    ctx->saved_data["plan"] = std::move(plan);
    return out_lse[0];
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    std::vector<at::Tensor> g;
    {
      torch::NoGradGuard no_grad;  // as once_differentiable runs a backward: no graph of its copies and views
      auto s = ctx->get_saved_variables();  // q, k, v, out, lse
      g = backward_impl(grads[0], s[0], s[1], s[2], s[3], s[4], ctx->saved_data["softmax_scale"].toDouble(),
                        ctx->saved_data["plan"].toIntVector(), std::nullopt);
    }
    auto d = vitk::once_differentiable({g[0], g[1], g[2]}, grads[0], "cuda");
    return {d[0], d[1], d[2], at::Tensor(), at::Tensor(), at::Tensor()};
  }

  static std::vector<at::Tensor> backward_impl(const at::Tensor &dout, const at::Tensor &q, const at::Tensor &k,
                                               const at::Tensor &v, const at::Tensor &out, const at::Tensor &lse,
                                               double softmax_scale, const std::vector<int64_t> &p,
                                               const std::optional<at::Tensor> &dqkv) {
    check_plan(p);
    if (p[0]) {
      return host::bwd_sm90(dout, q, k, v, out, lse, softmax_scale, dqkv, p[3], p[4], p[5], p[6], p[7], p[8], p[2]);
    }
    return host::bwd(dout, q, k, v, out, lse, softmax_scale, p[1], p[2], dqkv);
  }
};

struct AttentionQKVPacked : public torch::autograd::Function<AttentionQKVPacked> {
  static at::Tensor forward(AutogradContext *ctx, at::Tensor qkv, double softmax_scale, const std::string &forward,
                            std::vector<int64_t> plan) {
    auto [q, k, v] = vitk::packed_views(qkv);
    auto out_lse = forward_named(forward)(q, k, v, softmax_scale);  // out (B, H, N, d), lse (B, H, N) float32
    ctx->save_for_backward({qkv, out_lse[0], out_lse[1]});
    ctx->saved_data["softmax_scale"] = softmax_scale;
    ctx->saved_data["plan"] = std::move(plan);
    return out_lse[0];
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    at::Tensor dqkv;
    {
      torch::NoGradGuard no_grad;
      auto s = ctx->get_saved_variables();  // qkv, out, lse
      auto [q, k, v] = vitk::packed_views(s[0]);
      dqkv = at::empty(s[0].sizes(), s[0].options().memory_format(at::MemoryFormat::Contiguous));  // (B, N, 3, H, d)
      Attention::backward_impl(grads[0], q, k, v, s[1], s[2], ctx->saved_data["softmax_scale"].toDouble(),
                               ctx->saved_data["plan"].toIntVector(), dqkv);
    }
    return {vitk::once_differentiable({dqkv}, grads[0], "cuda")[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, double softmax_scale,
                     const std::string &forward, std::vector<int64_t> plan) {
  check_plan(plan);
  return Attention::apply(q, k, v, softmax_scale, forward, std::move(plan));
}

at::Tensor attention_qkvpacked(const at::Tensor &qkv, double softmax_scale, const std::string &forward,
                               std::vector<int64_t> plan) {
  TORCH_CHECK_VALUE(qkv.dim() == 5 && qkv.size(2) == 3, "qkv must be (B, N, 3, H, d)");
  check_plan(plan);
  return AttentionQKVPacked::apply(qkv, softmax_scale, forward, std::move(plan));
}

}  // namespace

void bind(pybind11::module_ &m) {
  namespace py = pybind11;
  m.def("attention", &attention, "out (B, H, N, d) of q, k, v (B, H, N, d), differentiable: the forward entry point "
        "named `forward`, and a backward by `plan` (backward's); the C++ autograd node of the eager path",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("softmax_scale"), py::arg("forward"), py::arg("plan"));
  m.def("attention_qkvpacked", &attention_qkvpacked, "attention on a packed qkv (B, N, 3, H, d), whose gradient is "
        "one contiguous (B, N, 3, H, d) tensor", py::arg("qkv"), py::arg("softmax_scale"), py::arg("forward"),
        py::arg("plan"));
  m.def("backward", &Attention::backward_impl, "[dq, dk, dv] of bwd or bwd_sm90 as `plan` says: {sm90, bwd_warps, "
        "dq_splits, dq_cols, dq_sum, dq_rows, dq_tma, overlap, key_ctas}; dqkv: None, or a packed (B, N, 3, H, d) "
        "gradient to write the three into", py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"),
        py::arg("out"), py::arg("lse"), py::arg("softmax_scale"), py::arg("plan"), py::arg("dqkv"));
}

}  // namespace vitk::eager

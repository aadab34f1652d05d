// The gradients of a C++ autograd node as torch.autograd.function.once_differentiable leaves them: where a graph of
// them is being recorded (create_graph=True) and dout is part of it, detached aliases behind a DelayedError node, so
// that the first derivative is returned and a second one raises when it is taken, not before. Shared by the cuda
// backend's node (kernels/cuda/csrc/eager.cpp) and the flash backend's (kernels/flash/csrc/eager.cpp).
#pragma once
#include <string>
#include <utility>

#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace vitk {

// grads: the node's gradients (undefined entries stay undefined); dout: the incoming gradient; backend: the name the
// error gives, as attention=<backend> spells it.
inline torch::autograd::variable_list once_differentiable(torch::autograd::variable_list grads, const at::Tensor &dout,
                                                          const std::string &backend) {
  if (!torch::autograd::GradMode::is_enabled() || !dout.requires_grad()) return grads;
  for (auto &g : grads) {
    if (g.defined()) g = g.detach().requires_grad_(true);
  }
  auto error = std::make_shared<torch::autograd::DelayedError>(
      "attention=" + backend + ": trying to differentiate twice: the second derivative (create_graph=True through "
      "the gradient) is not implemented; use attention=sdpa or attention=naive for double backward",
      static_cast<int64_t>(grads.size()));
  return (*error)(std::move(grads));
}

}  // namespace vitk

// q, k, v as (B, H, N, d) views of a packed (B, N, 3, H, d) qkv (or of its gradient), with the strides and storage
// offsets kernels.split_qkv gives them: qkv[:, :, i].transpose(1, 2), as one as_strided each (a permute and an unbind
// or select cost about 20 us of CPU more). Shared by the cuda extension (api.cpp, eager.cpp) and the flash eager
// launcher (kernels/flash/csrc/eager.cpp).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace vitk {

inline std::array<at::Tensor, 3> packed_views(const at::Tensor &qkv) {
  const std::vector<int64_t> size = {qkv.size(0), qkv.size(3), qkv.size(1), qkv.size(4)};
  const std::vector<int64_t> stride = {qkv.stride(0), qkv.stride(3), qkv.stride(1), qkv.stride(4)};
  const int64_t at = qkv.storage_offset(), step = qkv.stride(2);
  return {qkv.as_strided(size, stride, at), qkv.as_strided(size, stride, at + step),
          qkv.as_strided(size, stride, at + 2 * step)};
}

}  // namespace vitk

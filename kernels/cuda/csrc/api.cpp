// Host side: checks the tensors, fills the params structs and dispatches on (dtype, head_dim); the entry points
// (host.h) and their Python bindings. eager.cpp builds the eager autograd node on them.
// The Python wrapper (kernels/cuda/__init__.py) validates first with friendlier messages; these
// checks guard the raw ops (TORCH_CHECK_TYPE -> TypeError, TORCH_CHECK_VALUE -> ValueError).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "host.h"
#include "params.h"

namespace {

using vitk::Strides;

// Error messages built without iostreams. A TORCH_CHECK with several message arguments formats them through
// std::ostringstream (c10::str), and in an extension built by g++ 13.3 against torch 2.11's wheel that ended the
// process with a segmentation fault instead of raising, in a one-function extension as in this one; std::to_string
// and string concatenation raised as they should (benchmarks/results/h100_20261207b/call4_segv2.log). So every check
// here passes one message: a literal, or msg(...).
std::string piece(const char *s) { return s; }
std::string piece(const std::string &s) { return s; }
template <typename I, std::enable_if_t<std::is_integral_v<I>, int> = 0> std::string piece(I x) {
  return std::to_string(x);
}
std::string piece(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}
std::string piece(c10::IntArrayRef a) {
  std::string s = "[";
  for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}
std::string piece(const c10::Device &d) { return d.str(); }
std::string piece(c10::ScalarType t) { return c10::toString(t); }
template <typename... A> std::string msg(const A &...parts) {
  std::string s;
  (s.append(piece(parts)), ...);
  return s;
}

void check_qkv(const at::Tensor &t, const char *name, const at::Tensor &q) {
  TORCH_CHECK_VALUE(t.is_cuda(), msg(name, " must be a CUDA tensor, got device ", t.device()));
  TORCH_CHECK_TYPE(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, msg(name,
                   " must be float16 or bfloat16, got ", t.scalar_type()));
  TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), msg(name, " dtype ", t.scalar_type(), " != q dtype ",
                   q.scalar_type()));
  TORCH_CHECK_VALUE(t.device() == q.device(), msg(name, " is on ", t.device(), " but q is on ", q.device()));
  TORCH_CHECK_VALUE(t.dim() == 4, msg(name, " must be (B, H, N, head_dim), got ", t.sizes()));
  TORCH_CHECK_VALUE(t.sizes() == q.sizes(), msg(name, " shape ", t.sizes(), " != q shape ", q.sizes()));
  const int64_t d = t.size(3);
  TORCH_CHECK_VALUE(d == 32 || d == 64 || d == 128, msg(name, " head_dim must be 32, 64 or 128 here, got ", d,
                    " (the Python wrapper pads other head dims)"));
  TORCH_CHECK_VALUE(t.stride(3) == 1, msg(name, " must be contiguous in its last dimension, got strides ",
                    t.strides()));
}

// cp.async moves 16-byte chunks: rows must start on 16-byte boundaries. Otherwise copy once.
at::Tensor aligned(const at::Tensor &t) {
  const bool ok = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % 8 == 0 &&
                  t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0;
  return ok ? t : t.contiguous();
}

Strides strides(const at::Tensor &t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

template <typename F> void dispatch(at::ScalarType dtype, int64_t d, F &&f) {
  const bool bf16 = dtype == at::kBFloat16;
#define VITK_CASE(D)                                                      \
  if (d == D) {                                                           \
    bf16 ? f(std::integral_constant<int, vitk::kBFloat16>{}, std::integral_constant<int, D>{}) \
         : f(std::integral_constant<int, vitk::kFloat16>{}, std::integral_constant<int, D>{});  \
    return;                                                               \
  }
  VITK_CASE(32) VITK_CASE(64) VITK_CASE(128)
#undef VITK_CASE
}

void check_launch(cudaError_t err, const char *what) {
  TORCH_CHECK(err == cudaSuccess, msg(what, " launch failed: ", cudaGetErrorString(err)));
}

// TMA tensor maps need every stride of a dimension longer than 1 to be a positive multiple of 16 bytes.
at::Tensor tma_ready(const at::Tensor &t) {
  bool ok = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int i = 0; i < 3; ++i) ok = ok && (t.size(i) == 1 || (t.stride(i) > 0 && t.stride(i) % 8 == 0));
  return ok ? t : t.contiguous();
}

}  // namespace

namespace vitk::host {

// sm90 = true runs the Hopper kernels (fwd_sm90.cuh; schedule: kFwdSequential, kFwdPingpong (its pipelined
// consumers), kFwdWide (three sequential consumers, head_dim 64) or kFwdShort (sequential, 208-key tiles, head_dim
// 64, persistent only); persistent: one CTA an SM looping over the Q tiles, not with kFwdWide), else the mma.sync
// ones (fwd.cuh).
std::vector<at::Tensor> fwd_impl(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale, bool sm90,
                                 int schedule = 0, bool persistent = false) {
  check_qkv(q, "q", q);
  check_qkv(k, "k", q);
  check_qkv(v, "v", q);
  TORCH_CHECK_VALUE(softmax_scale > 0, msg("softmax_scale must be > 0, got ", softmax_scale));
  const c10::cuda::CUDAGuard guard(q.device());
  if (sm90) {
    TORCH_CHECK_VALUE(q.size(3) != 32, "the sm90 forward has kernels for head_dim 64 and 128, got 32");
    q = tma_ready(q), k = tma_ready(k), v = tma_ready(v);
  } else {
    q = aligned(q), k = aligned(k), v = aligned(v);
  }
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d = q.size(3);
  TORCH_CHECK_VALUE(H <= 65535 && B <= 65535, msg("B and H must be <= 65535 (grid limits), got ", B, ", ", H));
  // (B, N, H, d) in memory, as SDPA does, so the caller's transpose(1, 2).reshape(B, N, H*d) is a view.
  auto out = at::empty_strided({B, H, N, d}, {N * H * d, d, H * d, 1}, q.options());  // (B, N, H, d) transposed
  auto lse = at::empty({B, H, N}, q.options().dtype(at::kFloat));
  if (B * H * N == 0) return {out, lse};
  vitk::FwdParams p{};
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.q_st = strides(q), p.k_st = strides(k), p.v_st = strides(v), p.out_st = strides(out);
  p.B = B, p.H = H, p.N = N, p.softmax_scale = static_cast<float>(softmax_scale);
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  dispatch(q.scalar_type(), d, [&](auto dt, auto hd) {
    constexpr int DT = decltype(dt)::value, D = decltype(hd)::value;
    if (!sm90) return check_launch(vitk::run_fwd<DT, D>(p, stream), "attention forward");
#ifdef VITK_SM90A
    if constexpr (D != 32) {
      const char *what = "";
      const cudaError_t err = vitk::run_fwd_sm90<DT, D>(p, stream, &what, schedule, persistent);
      TORCH_CHECK(err == cudaSuccess, msg("attention forward (sm90): ", what, " failed: ", cudaGetErrorString(err)));
    }
#endif
  });
  return {out, lse};
}

std::vector<at::Tensor> fwd(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale) {
  return fwd_impl(q, k, v, softmax_scale, false);
}

// The Hopper kernels exist in this build and q is on a compute capability 9.0 GPU, else a clear error.
void check_sm90(const at::Tensor &q) {
#ifndef VITK_SM90A
  TORCH_CHECK(false, "this build of the extension has no sm_90a kernels: build with TORCH_CUDA_ARCH_LIST "
              "containing 9.0 or 9.0a (kernels/cuda/build.py), or run the sm80 kernels (VIT_CUDA_FWD=sm80, "
              "VIT_CUDA_BWD=sm80)");
#endif
  int major = 0;
  TORCH_CHECK_VALUE(q.is_cuda(), msg("q must be a CUDA tensor, got device ", q.device()));
  check_launch(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.get_device()),
               "reading the compute capability");
  TORCH_CHECK(major == 9, msg("the sm90 kernels run on compute capability 9.0 GPUs (H100, H200) only, this is ",
              major, ".x"));
}

std::vector<at::Tensor> fwd_sm90(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale) {
  check_sm90(q);
  return fwd_impl(q, k, v, softmax_scale, true);
}

std::vector<at::Tensor> fwd_sm90_pingpong(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale) {
  check_sm90(q);
  return fwd_impl(q, k, v, softmax_scale, true, 1);
}

std::vector<at::Tensor> fwd_sm90_wide(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale) {
  check_sm90(q);
  TORCH_CHECK_VALUE(q.dim() == 4 && q.size(3) == 64, "the three-consumer sm90 forward (fwd_sm90_wide) has kernels "
                    "for head_dim 64 only: use fwd_sm90 or fwd_sm90_pingpong");
  return fwd_impl(q, k, v, softmax_scale, true, 2);
}

std::vector<at::Tensor> fwd_sm90_persistent(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale) {
  check_sm90(q);
  return fwd_impl(q, k, v, softmax_scale, true, 0, true);
}

std::vector<at::Tensor> fwd_sm90_persistent_pingpong(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale) {
  check_sm90(q);
  return fwd_impl(q, k, v, softmax_scale, true, 1, true);
}

std::vector<at::Tensor> fwd_sm90_short(at::Tensor q, at::Tensor k, at::Tensor v, double softmax_scale) {
  check_sm90(q);
  TORCH_CHECK_VALUE(q.dim() == 4 && q.size(3) == 64, "the 208-key-tile sm90 forward (fwd_sm90_short) has kernels "
                    "for head_dim 64 only: use fwd_sm90_persistent");
  return fwd_impl(q, k, v, softmax_scale, true, 3, true);
}

// dq, dk, dv to write: new contiguous (B, H, N, d) tensors, or the three (B, H, N, d) views of a packed
// (B, N, 3, H, d) gradient dqkv (contiguous, q's dtype and device), so that the ViT's fused projection gets its
// gradient without a stack of three.
std::vector<at::Tensor> grad_outputs(const at::Tensor &q, const std::optional<at::Tensor> &dqkv) {
  if (!dqkv) return {at::empty(q.sizes(), q.options()), at::empty(q.sizes(), q.options()), at::empty(q.sizes(), q.options())};
  const at::Tensor &g = *dqkv;
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d = q.size(3);
  TORCH_CHECK_VALUE(g.dim() == 5 && g.size(0) == B && g.size(1) == N && g.size(2) == 3 && g.size(3) == H &&
                        g.size(4) == d,
                    msg("dqkv must be (B, N, 3, H, d) = (", B, ", ", N, ", 3, ", H, ", ", d, "), got ", g.sizes()));
  TORCH_CHECK_VALUE(g.is_contiguous() && g.device() == q.device(), "dqkv must be contiguous and on q's device");
  TORCH_CHECK_TYPE(g.scalar_type() == q.scalar_type(),
                   msg("dqkv dtype ", g.scalar_type(), " != q dtype ", q.scalar_type()));
  auto views = vitk::packed_views(g);
  return {views[0], views[1], views[2]};
}

// sm90 = true runs the Hopper dK/dV/dQ kernel (bwd_sm90.cuh; bwd_warps unused), else bwd.cuh's;
// sm90_opt which of its kernels (params.h); dq_splits > 0 (bwd.cuh, bwd_sm90.cuh) the deterministic mode; key_ctas > 0
// (bwd_sm90.cuh, with sm90_opt.persistent) CTAs per (batch, head) walking its key tiles;
// dqkv: write into a packed gradient (grad_outputs).
std::vector<at::Tensor> bwd_impl(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out,
                                 at::Tensor lse, double softmax_scale, int64_t bwd_warps, bool sm90,
                                 const vitk::BwdSm90Options &sm90_opt, int64_t dq_splits,
                                 const std::optional<at::Tensor> &dqkv, int64_t key_ctas = 0) {
  check_qkv(q, "q", q);
  check_qkv(k, "k", q);
  check_qkv(v, "v", q);
  TORCH_CHECK_VALUE(dout.sizes() == q.sizes() && out.sizes() == q.sizes(), "dout and out must have q's shape");
  TORCH_CHECK_TYPE(dout.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(),
                   "dout and out must have q's dtype");
  TORCH_CHECK_TYPE(lse.scalar_type() == at::kFloat, "lse must be float32");
  TORCH_CHECK_VALUE(bwd_warps == 4 || bwd_warps == 8, msg("bwd_warps must be 4 or 8, got ", bwd_warps));
  const int64_t key_tiles = (q.size(2) + 16 * bwd_warps - 1) / (16 * bwd_warps);
  TORCH_CHECK_VALUE(dq_splits >= 0 && dq_splits <= key_tiles, msg("dq_splits must be in 0..", key_tiles,
                    " (key tiles of ", 16 * bwd_warps, " rows), got ", dq_splits));
  const c10::cuda::CUDAGuard guard(q.device());
  if (dout.stride(3) != 1) dout = dout.contiguous();  // autograd may hand a transposed view
  if (sm90) {
    TORCH_CHECK_VALUE(q.size(3) != 32, "the sm90 backward has kernels for head_dim 64 and 128, got 32");
    TORCH_CHECK_VALUE(!sm90_opt.dq_cols || q.size(3) == 128, msg("the column split of dQ needs head_dim 128, got ",
                      q.size(3)));
    TORCH_CHECK_VALUE(!sm90_opt.overlap || q.size(3) == 64 || sm90_opt.dq_cols,
                      msg("the overlapped sm90 consumer needs head_dim 64 (at 128 the ping-pong one, dq_cols), got ",
                      q.size(3)));
    TORCH_CHECK_VALUE(!(sm90_opt.dq_cols && sm90_opt.overlap) || sm90_opt.dq_tma,
                      "the ping-pong consumer (dq_cols with overlap) adds dQ by TMA: needs dq_tma");
    TORCH_CHECK_VALUE(!sm90_opt.dq_sum || q.size(3) == 64, msg("the summed dQ needs head_dim 64, got ", q.size(3)));
    TORCH_CHECK_VALUE(!sm90_opt.dq_rows || q.size(3) == 64, msg("the row-split dQ needs head_dim 64, got ", q.size(3)));
    TORCH_CHECK_VALUE(!sm90_opt.dq_rows || !(sm90_opt.dq_sum || sm90_opt.dq_cols),
                      "the row-split dQ is its own dQ mode: not with dq_cols or dq_sum");
    TORCH_CHECK_VALUE(!(sm90_opt.dq_rows && sm90_opt.overlap) || sm90_opt.dq_tma,
                      "the ping-pong consumer (dq_rows with overlap) adds dQ by TMA: needs dq_tma");
    TORCH_CHECK_VALUE(dq_splits == 0 || ((q.size(3) == 64 ? sm90_opt.dq_rows : sm90_opt.dq_cols) &&
                                         sm90_opt.dq_tma && !sm90_opt.overlap),
                      "the deterministic sm90 backward (dq_splits > 0) needs dq_rows at head_dim 64, dq_cols at 128, "
                      "with dq_tma and without overlap");
    q = tma_ready(q), k = tma_ready(k), v = tma_ready(v), dout = tma_ready(dout);
  }
  q = aligned(q), k = aligned(k), v = aligned(v), out = aligned(out), dout = aligned(dout);
  lse = lse.contiguous();
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d = q.size(3);
  auto grads = grad_outputs(q, dqkv);
  at::Tensor dq = grads[0], dk = grads[1], dv = grads[2];
  if (B * H * N == 0) return {dq, dk, dv};
  // One float32 scratch buffer (one allocation, not two): dq_accum (max(1, dq_splits), B, H, N, d), zeroed by the
  // delta kernel and summed in slice order into dq by the dq kernel (bwd.cuh), then delta (B, H, N).
  const int64_t accum = std::max<int64_t>(dq_splits, 1) * B * H * N * d;
  auto scratch = at::empty({accum + B * H * N}, q.options().dtype(at::kFloat));
  vitk::BwdParams p{};
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr(), p.out = out.data_ptr(), p.dout = dout.data_ptr();
  p.lse = lse.data_ptr<float>(), p.dq_accum = scratch.data_ptr<float>(), p.delta = p.dq_accum + accum;
  p.dq = dq.data_ptr(), p.dk = dk.data_ptr(), p.dv = dv.data_ptr();
  p.q_st = strides(q), p.k_st = strides(k), p.v_st = strides(v), p.out_st = strides(out);
  p.dout_st = strides(dout), p.dq_st = strides(dq), p.dk_st = strides(dk), p.dv_st = strides(dv);
  p.B = B, p.H = H, p.N = N, p.softmax_scale = static_cast<float>(softmax_scale);
  p.dq_scale = sm90 ? p.softmax_scale : 1.f;  // bwd_sm90.cuh leaves the scale out of dSᵀ, bwd.cuh folds it in
  p.bwd_warps = static_cast<int>(bwd_warps);
  p.dq_splits = static_cast<int>(dq_splits);
  p.key_ctas = static_cast<int>(key_ctas);
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  dispatch(q.scalar_type(), d, [&](auto dt, auto hd) {
    constexpr int DT = decltype(dt)::value, D = decltype(hd)::value;
    if (!sm90) return check_launch(vitk::run_bwd<DT, D>(p, stream), "attention backward");
#ifdef VITK_SM90A
    if constexpr (D != 32) {
      const char *what = "";
      const cudaError_t err = vitk::run_bwd_sm90<DT, D>(p, stream, &what, sm90_opt);
      TORCH_CHECK(err == cudaSuccess, msg("attention backward (sm90): ", what, " failed: ", cudaGetErrorString(err)));
    }
#endif
  });
  return {dq, dk, dv};
}

std::vector<at::Tensor> bwd(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out,
                            at::Tensor lse, double softmax_scale, int64_t bwd_warps, int64_t dq_splits,
                            std::optional<at::Tensor> dqkv) {
  return bwd_impl(dout, q, k, v, out, lse, softmax_scale, bwd_warps, false, {}, dq_splits, dqkv);
}

std::vector<at::Tensor> bwd_sm90(at::Tensor dout, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out,
                                 at::Tensor lse, double softmax_scale, std::optional<at::Tensor> dqkv, bool dq_cols,
                                 bool dq_sum, bool dq_rows, bool dq_tma, bool overlap, int64_t key_ctas,
                                 int64_t dq_splits) {
  check_sm90(q);
  TORCH_CHECK_VALUE(key_ctas == 0 || (key_ctas > 0 && key_ctas <= (q.size(2) + 127) / 128 && dq_splits == 0 &&
                                      dq_tma && !overlap && (q.size(3) == 64 ? dq_rows : dq_cols)),
                    "the sm90 backward's key-tile walk (key_ctas > 0) has kernels for rows-tma at head_dim 64 and "
                    "columns-tma at 128, with the sequential consumer, dq_splits = 0 and key_ctas in 1..key tiles "
                    "of 128");
  return bwd_impl(dout, q, k, v, out, lse, softmax_scale, 8, true,
                  {dq_cols, dq_sum, dq_rows, dq_tma, overlap, key_ctas > 0}, dq_splits, dqkv, key_ctas);
}

// CTAs of the deterministic mma.sync backward (bf16 or fp16, head_dim 32/64/128) that one SM of GPU `device`
// holds at once. Takes no tensor, so torch.compile's tracing (fake tensors) can ask too.
int64_t bwd_split_ctas_per_sm(bool bf16, int64_t head_dim, int64_t bwd_warps, int64_t device) {
  TORCH_CHECK_VALUE(head_dim == 32 || head_dim == 64 || head_dim == 128, msg("head_dim must be 32, 64 or 128, got ",
                    head_dim));
  TORCH_CHECK_VALUE(bwd_warps == 4 || bwd_warps == 8, msg("bwd_warps must be 4 or 8, got ", bwd_warps));
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  int ctas = 0;
  dispatch(bf16 ? at::kBFloat16 : at::kHalf, head_dim, [&](auto dt, auto hd) {
    ctas = vitk::bwd_split_ctas_per_sm<decltype(dt)::value, decltype(hd)::value>(static_cast<int>(bwd_warps));
  });
  TORCH_CHECK(ctas > 0, "the occupancy query of the deterministic backward failed");
  return ctas;
}

at::Tensor vector_add(const at::Tensor &a, const at::Tensor &b) {
  TORCH_CHECK_VALUE(a.is_cuda() && b.is_cuda() && a.device() == b.device(), "a and b must be on one CUDA device");
  TORCH_CHECK_TYPE(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat, "a and b must be float32");
  TORCH_CHECK_VALUE(a.sizes() == b.sizes(), msg("a and b must have one shape, got ", a.sizes(), " and ", b.sizes()));
  const c10::cuda::CUDAGuard guard(a.device());
  const auto ac = a.contiguous(), bc = b.contiguous();
  auto c = at::empty_like(ac);
  check_launch(vitk::run_vector_add(ac.data_ptr<float>(), bc.data_ptr<float>(), c.data_ptr<float>(), ac.numel(),
                                    c10::cuda::getCurrentCUDAStream().stream()),
               "vector_add");
  return c;
}

}  // namespace vitk::host

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace vitk::host;
  m.doc() = "Hand-written CUDA C++ FlashAttention-2 (mma.sync), Hopper kernels (wgmma, TMA) and the vector-add example";
  m.def("fwd", &fwd, "attention forward, mma.sync (sm_80+): (q, k, v, softmax_scale) -> [out, lse]");
  m.def("fwd_sm90", &fwd_sm90, "attention forward, wgmma + TMA (sm_90a): (q, k, v, softmax_scale) -> [out, lse]");
  m.def("fwd_sm90_pingpong", &fwd_sm90_pingpong, "fwd_sm90 with pipelined consumers: each issues Q·K_jᵀ with "
        "P_{j-1}·V_{j-1} and runs the softmax under the second, the two take turns (FlashAttention-3's ping-pong): "
        "(q, k, v, softmax_scale) -> [out, lse]");
  m.def("fwd_sm90_persistent", &fwd_sm90_persistent, "fwd_sm90 with one CTA an SM looping over the Q tiles: "
        "(q, k, v, softmax_scale) -> [out, lse]");
  m.def("fwd_sm90_persistent_pingpong", &fwd_sm90_persistent_pingpong, "fwd_sm90_pingpong with one CTA an SM looping "
        "over the Q tiles: (q, k, v, softmax_scale) -> [out, lse]");
  m.def("fwd_sm90_short", &fwd_sm90_short, "fwd_sm90_persistent with 208-key tiles, all of N <= 208 in one (head_dim "
        "64): (q, k, v, softmax_scale) -> [out, lse]");
  m.def("fwd_sm90_wide", &fwd_sm90_wide, "fwd_sm90 with three consumer warpgroups, 192 query rows a CTA (head_dim 64): "
        "(q, k, v, softmax_scale) -> [out, lse]");
#ifdef VITK_SM90A
  m.attr("has_sm90") = true;
#else
  m.attr("has_sm90") = false;
#endif
  m.def("bwd", &bwd, "attention backward, mma.sync: (dout, q, k, v, out, lse, softmax_scale, bwd_warps, dq_splits, "
        "dqkv) -> [dq, dk, dv]; dq_splits > 0: deterministic (bitwise the same every run); dqkv: None, or a packed "
        "(B, N, 3, H, d) gradient the three are written into (and returned as views of)");
  m.def("bwd_split_ctas_per_sm", &bwd_split_ctas_per_sm, "CTAs of the deterministic mma.sync backward (dq_splits > 0) "
        "that one SM holds at once: (bf16, head_dim, bwd_warps, device) -> int");
  m.def("bwd_sm90", &bwd_sm90, "attention backward, wgmma + TMA (sm_90a): (dout, q, k, v, out, lse, softmax_scale, "
        "dqkv, dq_cols, dq_sum, dq_rows, dq_tma, overlap, key_ctas, dq_splits) -> [dq, dk, dv]; dq_cols: dQ split by "
        "columns across "
        "the consumers (head_dim 128), dq_sum: the consumers' dQ summed in shared memory and added once (head_dim "
        "64), dq_rows: 128 query rows a step, dQ split by rows across the consumers (head_dim 64), dq_tma: dQ "
        "added by TMA reduce-add instead of atomics, overlap: Pᵀ's exponentials under dPᵀ's wgmma (head_dim 64; "
        "with dq_rows or dq_cols and dq_tma the ping-pong consumer), key_ctas > 0: that many CTAs per (batch, head), "
        "CTA j walking key tiles j, j + key_ctas, ... (dq_rows at head_dim 64, dq_cols at 128, with dq_tma, "
        "sequential; 0: one CTA per key tile), dq_splits > 0: deterministic (CTA j of a "
        "(batch, head) walks key tiles j, j + dq_splits, ... into dq slice j; dq_rows at head_dim 64, dq_cols at "
        "128, with dq_tma, sequential)");
  m.def("vector_add", &vector_add, "c = a + b, float32");
  vitk::eager::bind(m);
}

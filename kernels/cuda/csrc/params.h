// Plain parameter structs shared by the host binding (api.cpp) and the kernels (*.cu).
// No torch here, so the kernels compile with nvcc alone (the CPU CI's SASS check does that).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace vitk {

enum DType : int { kFloat16 = 0, kBFloat16 = 1 };

// Strides are in elements; the last dimension (head_dim) is contiguous. (B, H, N, d) layout.
struct Strides {
  int64_t batch, head, row;
};

struct FwdParams {
  const void *q, *k, *v;
  void *out;                 // (B, H, N, d), contiguous
  float *lse;                // (B, H, N) float32, natural log
  Strides q_st, k_st, v_st, out_st;
  int B, H, N;
  float softmax_scale;       // > 0
};

struct BwdParams {
  const void *q, *k, *v, *out, *dout;
  const float *lse;          // (B, H, N) from the forward
  float *delta;              // (B, H, N) scratch: rowsum(dout * out)
  float *dq_accum;           // (max(1, dq_splits), B, H, N, d) float32, zeroed by the delta kernel; dq before the cast
  void *dq, *dk, *dv;        // (B, H, N, d), any strides with the last dimension contiguous and even row strides
  Strides q_st, k_st, v_st, out_st, dout_st, dq_st, dk_st, dv_st;
  int B, H, N;
  float softmax_scale;
  float dq_scale;            // the dq kernel's factor on dq_accum: 1, or softmax_scale after bwd_sm90.cuh (dSᵀ/scale)
  int bwd_warps;             // 4 or 8: key rows per CTA = 16 * bwd_warps
  // 0: one CTA per key tile, dq_accum (B, H, N, d) summed with atomics or TMA reduce-adds in any order.
  // s in 1..key tiles: deterministic, dq_accum (s, B, H, N, d), CTA j of a (batch, head) owns slice j and walks key
  // tiles j, j + s, ... (bwd.cuh; bwd_sm90.cuh with its row- or column-split TMA dQ).
  int dq_splits;
  // bwd_sm90.cuh only, with dq_splits = 0: 0 one CTA per key tile; c > 0: c CTAs per (batch, head), CTA j walking key
  // tiles j, j + c, ... (K and V reloaded, the Q/dO ring counted on), dQ into the one dq_accum (BwdSm90Options's
  // persistent).
  int key_ctas;
};

// One explicit instantiation per (dtype, head_dim), each in its own .cu file so builds parallelise.
template <int DTYPE, int D> cudaError_t run_fwd(const FwdParams &p, cudaStream_t stream);
template <int DTYPE, int D> cudaError_t run_bwd(const BwdParams &p, cudaStream_t stream);
// CTAs of the deterministic (dq_splits > 0) mma.sync backward one SM holds at once (0 if the query fails).
template <int DTYPE, int D> int bwd_split_ctas_per_sm(int bwd_warps);
// Hopper forward and backward (fwd_sm90.cuh, bwd_sm90.cuh; only in builds for sm_90a): head_dim 64 or 128. On failure `*what`
// names the step that failed.
// schedule: 0 sequential, 1 pingpong (pipelined consumers: FlashAttention-3's ping-pong and intra-warpgroup overlap),
// 2 wide (three sequential consumers, head_dim 64 only); persistent: one CTA an SM looping over the Q tiles (0 and 2).
template <int DTYPE, int D>
cudaError_t run_fwd_sm90(const FwdParams &p, cudaStream_t stream, const char **what, int schedule, bool persistent);
// Which bwd_sm90.cuh kernel runs: dq_cols its kDqCols dQ (head_dim 128 only), dq_sum its kDqSum (head_dim 64 only),
// dq_rows its kDqRows (128 query rows a step; head_dim 64 only), dq_tma its DQ_TMA, overlap its OVERLAP consumer
// (head_dim 64 only, not with dq_rows); elsewhere cudaErrorInvalidValue.
struct BwdSm90Options {
  bool dq_cols = false, dq_sum = false, dq_rows = false, dq_tma = false, overlap = false;
  bool persistent = false;  // p.key_ctas CTAs a (batch, head) walk its key tiles (rows-tma at 64, columns-tma at 128)
};
template <int DTYPE, int D>
cudaError_t run_bwd_sm90(const BwdParams &p, cudaStream_t stream, const char **what, const BwdSm90Options &opt);
cudaError_t run_vector_add(const float *a, const float *b, float *c, int64_t n, cudaStream_t stream);

}  // namespace vitk

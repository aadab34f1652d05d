// FlashAttention-2 backward (Dao, 2023, Algorithm 2) with mma.sync m16n8k16, in two kernels:
//  1. delta = rowsum(dout ∘ out), float32 (the D_i of the paper).
//  2. A CTA of WARPS (4 or 8) warps owns a 16·WARPS-row K/V tile (16 key rows per warp) and walks over all Q tiles
//     (double-buffered cp.async): recompute Sᵀ = K Qᵀ and Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e),
//     dV += Pᵀ dO, dPᵀ = V dOᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − delta)·scale, dK += dSᵀ Q, all with Pᵀ/dSᵀ reused
//     from registers as A operands. dQ += dS K needs a sum over every key tile, so dSᵀ goes through
//     shared memory and each CTA adds its part to a float32 dQ with atomicAdd (as FA-2 does): the
//     summation order across CTAs varies, so dq is not bitwise deterministic run to run (dk, dv are).
//     Deterministic mode (p.dq_splits = s > 0, FlashAttention-2's own): s CTAs per (batch, head), CTA j
//     walking key tiles j, j + s, j + 2s, ... in order and adding into its own float32 slice j of
//     dq_accum, (s, B, H, N, d). Each dq element of a slice is added by one thread, in program order,
//     so every sum has one order; the host then sums the s slices (a fixed-order reduction).
#pragma once
#include "common.cuh"

namespace vitk {

template <int D, int WARPS> struct BwdTraits {
  static constexpr int kWarps = WARPS;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = 16 * kWarps;           // key rows per CTA
  static constexpr int kBlockM = D <= 64 ? 64 : 32;     // query rows per step (d=128: registers)
  static constexpr int kSRow = D + 8;
  static constexpr int kSRowS = kBlockM + 8;            // dSᵀ tile pitch
  static constexpr int kSmemBytes =
      (2 * kBlockN + 4 * kBlockM) * kSRow * 2 + kBlockN * kSRowS * 2 + 4 * kBlockM * 4;
  // dQ tile (kBlockM, D) split over warps: kMTiles row tiles, each by kDSplit warps over columns.
  static constexpr int kMTiles = kBlockM / 16;
  static constexpr int kDSplit = kWarps / kMTiles;
  static constexpr int kDqCols = D / kDSplit;
  static constexpr int kDqChunk = kDqCols < 64 ? kDqCols : 64;
};

// Before the backward: delta = rowsum(dO ∘ O) (FlashAttention-2, Algorithm 2 line 4), one float32 per (b, h, n), and
// that row of every dq_accum slice zeroed (in this kernel rather than a memset of its own: one launch fewer).
// TPR threads per row, 8 columns each.
template <int DTYPE, int D>
__global__ void __launch_bounds__(256) bwd_delta_kernel(const BwdParams p) {
  using T = typename Elem<DTYPE>::T;
  constexpr int TPR = D / 8, RPB = 256 / TPR;  // threads per row, rows per block
  const int64_t row = (int64_t)blockIdx.x * RPB + threadIdx.x / TPR;  // over (B, H, N)
  const int64_t rows = (int64_t)p.B * p.H * p.N;
  const int c = (threadIdx.x % TPR) * 8;
  float acc = 0.f;
  if (row < rows) {
    const int slices = p.dq_splits > 0 ? p.dq_splits : 1;
    for (int s = 0; s < slices; ++s) {
      float4 *dq = reinterpret_cast<float4 *>(p.dq_accum + (s * rows + row) * D + c);
      dq[0] = dq[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const int n = row % p.N, h = (row / p.N) % p.H, b = row / ((int64_t)p.N * p.H);
    const uint4 ov = *reinterpret_cast<const uint4 *>(static_cast<const T *>(p.out) + b * p.out_st.batch +
                                                      h * p.out_st.head + n * p.out_st.row + c);
    const uint4 dv = *reinterpret_cast<const uint4 *>(static_cast<const T *>(p.dout) + b * p.dout_st.batch +
                                                      h * p.dout_st.head + n * p.dout_st.row + c);
    const T *oe = reinterpret_cast<const T *>(&ov), *de = reinterpret_cast<const T *>(&dv);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc += Elem<DTYPE>::to_float(oe[i]) * Elem<DTYPE>::to_float(de[i]);
  }
#pragma unroll
  for (int off = TPR / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffff, acc, off);
  if (row < rows && threadIdx.x % TPR == 0) p.delta[row] = acc;
}

// After the backward: dq = the dq_accum slices summed in slice order, times p.dq_scale, rounded to dq's dtype (round
// to nearest even) and stored with dq's strides (a packed gradient's view too). The layout of bwd_delta_kernel.
template <int DTYPE, int D>
__global__ void __launch_bounds__(256) bwd_dq_kernel(const BwdParams p) {
  using T = typename Elem<DTYPE>::T;
  constexpr int TPR = D / 8, RPB = 256 / TPR;
  const int64_t row = (int64_t)blockIdx.x * RPB + threadIdx.x / TPR;
  const int64_t rows = (int64_t)p.B * p.H * p.N;
  if (row >= rows) return;
  const int c = (threadIdx.x % TPR) * 8;
  const int slices = p.dq_splits > 0 ? p.dq_splits : 1;
  float acc[8] = {};
  for (int s = 0; s < slices; ++s) {
    const float4 *dq = reinterpret_cast<const float4 *>(p.dq_accum + (s * rows + row) * D + c);
    const float4 a = dq[0], b = dq[1];
    acc[0] += a.x, acc[1] += a.y, acc[2] += a.z, acc[3] += a.w, acc[4] += b.x, acc[5] += b.y, acc[6] += b.z,
        acc[7] += b.w;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] *= p.dq_scale;
  uint4 packed;
  packed.x = Elem<DTYPE>::pack(acc[0], acc[1]), packed.y = Elem<DTYPE>::pack(acc[2], acc[3]);
  packed.z = Elem<DTYPE>::pack(acc[4], acc[5]), packed.w = Elem<DTYPE>::pack(acc[6], acc[7]);
  const int n = row % p.N, h = (row / p.N) % p.H, b = row / ((int64_t)p.N * p.H);
  *reinterpret_cast<uint4 *>(static_cast<T *>(p.dq) + b * p.dq_st.batch + h * p.dq_st.head + n * p.dq_st.row + c) =
      packed;
}

template <int DTYPE, int D> cudaError_t run_bwd_dq(const BwdParams &p, cudaStream_t stream) {
  const int64_t rows = (int64_t)p.B * p.H * p.N;
  constexpr int RPB = 256 / (D / 8);
  bwd_dq_kernel<DTYPE, D><<<(unsigned)((rows + RPB - 1) / RPB), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

// One CTA's work on the key tile starting at n0 of (batch b, head h): dK, dV of its keys, and its dS K added to dq
// ((N, D) float32, this (batch, head)'s rows of one dq_accum slice).
template <int DTYPE, int D, int WARPS>
__device__ __forceinline__ void bwd_key_tile(const BwdParams &p, int n0, int h, int b, float *dq) {
  using T = typename Elem<DTYPE>::T;
  using Tr = BwdTraits<D, WARPS>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, SROW = Tr::kSRow, SROWS = Tr::kSRowS, NT = Tr::kThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  T *Ks = reinterpret_cast<T *>(smem);  // (BN, SROW)
  T *Vs = Ks + BN * SROW;               // (BN, SROW)
  T *Qs = Vs + BN * SROW;               // (2, BM, SROW)
  T *dOs = Qs + 2 * BM * SROW;          // (2, BM, SROW)
  T *dSs = dOs + 2 * BM * SROW;         // (BN, SROWS): dSᵀ, rows = keys
  float *lse_s = reinterpret_cast<float *>(dSs + BN * SROWS);  // (2, BM)
  float *delta_s = lse_s + 2 * BM;                             // (2, BM)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int N = p.N;
  const int64_t bh = (int64_t)b * p.H + h;
  const T *q = static_cast<const T *>(p.q) + b * p.q_st.batch + h * p.q_st.head;
  const T *k = static_cast<const T *>(p.k) + b * p.k_st.batch + h * p.k_st.head;
  const T *v = static_cast<const T *>(p.v) + b * p.v_st.batch + h * p.v_st.head;
  const T *dout = static_cast<const T *>(p.dout) + b * p.dout_st.batch + h * p.dout_st.head;
  const float *lse = p.lse + bh * N, *delta = p.delta + bh * N;
  const float sl2 = p.softmax_scale * kLog2e, scale = p.softmax_scale;

  auto load_q_step = [&](int i, int buf) {
    load_tile<T, BM, D, SROW, NT>(Qs + buf * BM * SROW, q, p.q_st.row, i * BM, N);
    load_tile<T, BM, D, SROW, NT>(dOs + buf * BM * SROW, dout, p.dout_st.row, i * BM, N);
    if (threadIdx.x < BM) {
      const int m = i * BM + threadIdx.x;
      const bool ok = m < N;
      cp_async4(lse_s + buf * BM + threadIdx.x, lse + (ok ? m : 0), ok);
      cp_async4(delta_s + buf * BM + threadIdx.x, delta + (ok ? m : 0), ok);
    }
  };
  load_tile<T, BN, D, SROW, NT>(Ks, k, p.k_st.row, n0, N);
  load_tile<T, BN, D, SROW, NT>(Vs, v, p.v_st.row, n0, N);
  load_q_step(0, 0);
  cp_async_commit();

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};  // (16, D) per warp
  const int m_blocks = (N + BM - 1) / BM;
  const T *Kw = Ks + warp * 16 * SROW, *Vw = Vs + warp * 16 * SROW;  // this warp's key rows
  const bool key_tail = n0 + BN > N;

  for (int i = 0; i < m_blocks; ++i) {
    const int buf = i & 1, m0 = i * BM;
    if (i + 1 < m_blocks) {
      load_q_step(i + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T *Qb = Qs + buf * BM * SROW, *dOb = dOs + buf * BM * SROW;
    const float *lse_b = lse_s + buf * BM, *delta_b = delta_s + buf * BM;

    float s[BM / 8][4] = {}, dp[BM / 8][4] = {};  // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, (16, BM) per warp
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      ldmatrix_x4(ka, Kw + a_row(lane) * SROW + kk * 16 + a_col(lane));
      ldmatrix_x4(va, Vw + a_row(lane) * SROW + kk * 16 + a_col(lane));
#pragma unroll
      for (int mp = 0; mp < BM / 16; ++mp) {
        uint32_t qb[4], ob[4];
        ldmatrix_x4(qb, Qb + (mp * 16 + bn_row(lane)) * SROW + kk * 16 + bn_col(lane));
        ldmatrix_x4(ob, dOb + (mp * 16 + bn_row(lane)) * SROW + kk * 16 + bn_col(lane));
        mma16816<DTYPE>(s[2 * mp], ka, qb[0], qb[1]);
        mma16816<DTYPE>(s[2 * mp + 1], ka, qb[2], qb[3]);
        mma16816<DTYPE>(dp[2 * mp], va, ob[0], ob[1]);
        mma16816<DTYPE>(dp[2 * mp + 1], va, ob[2], ob[3]);
      }
    }
    const bool tail = key_tail || m0 + BM > N;
#pragma unroll
    for (int mt = 0; mt < BM / 8; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = mt * 8 + 2 * t + (e & 1);
        float pv = exp2f(fmaf(s[mt][e], sl2, -lse_b[col] * kLog2e));
        if (tail && (m0 + col >= N || n0 + warp * 16 + g + 8 * (e / 2) >= N)) pv = 0.f;
        s[mt][e] = pv;                                        // Pᵀ
        dp[mt][e] = pv * (dp[mt][e] - delta_b[col]) * scale;  // dSᵀ (softmax_scale folded in)
      }

#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk) {  // dV += Pᵀ dO, dK += dSᵀ Q
      const uint32_t pa[4] = {Elem<DTYPE>::pack(s[2 * kk][0], s[2 * kk][1]),
                              Elem<DTYPE>::pack(s[2 * kk][2], s[2 * kk][3]),
                              Elem<DTYPE>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              Elem<DTYPE>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const uint32_t sa[4] = {Elem<DTYPE>::pack(dp[2 * kk][0], dp[2 * kk][1]),
                              Elem<DTYPE>::pack(dp[2 * kk][2], dp[2 * kk][3]),
                              Elem<DTYPE>::pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                              Elem<DTYPE>::pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
      T *Sw = dSs + warp * 16 * SROWS + kk * 16 + 2 * t;  // dSᵀ rows of this warp
      *reinterpret_cast<uint32_t *>(Sw + g * SROWS) = sa[0];
      *reinterpret_cast<uint32_t *>(Sw + (g + 8) * SROWS) = sa[1];
      *reinterpret_cast<uint32_t *>(Sw + g * SROWS + 8) = sa[2];
      *reinterpret_cast<uint32_t *>(Sw + (g + 8) * SROWS + 8) = sa[3];
#pragma unroll
      for (int dp2 = 0; dp2 < D / 16; ++dp2) {
        uint32_t ob[4], qb[4];
        ldmatrix_x4_trans(ob, dOb + (kk * 16 + bt_row(lane)) * SROW + dp2 * 16 + bt_col(lane));
        ldmatrix_x4_trans(qb, Qb + (kk * 16 + bt_row(lane)) * SROW + dp2 * 16 + bt_col(lane));
        mma16816<DTYPE>(dv[2 * dp2], pa, ob[0], ob[1]);
        mma16816<DTYPE>(dv[2 * dp2 + 1], pa, ob[2], ob[3]);
        mma16816<DTYPE>(dk[2 * dp2], sa, qb[0], qb[1]);
        mma16816<DTYPE>(dk[2 * dp2 + 1], sa, qb[2], qb[3]);
      }
    }
    __syncthreads();  // dSᵀ complete

    // dQ[m0:m0+BM] += dS K: warp -> (16-row tile, column slice), float32 atomics.
    const int mt = warp % Tr::kMTiles, c0 = (warp / Tr::kMTiles) * Tr::kDqCols;
#pragma unroll
    for (int cc = 0; cc < Tr::kDqCols; cc += Tr::kDqChunk) {
      float acc[Tr::kDqChunk / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t sa[4];
        ldmatrix_x4_trans(sa, dSs + (kk * 16 + bn_row(lane)) * SROWS + mt * 16 + bn_col(lane));
#pragma unroll
        for (int dp2 = 0; dp2 < Tr::kDqChunk / 16; ++dp2) {
          uint32_t kb[4];
          ldmatrix_x4_trans(kb, Ks + (kk * 16 + bt_row(lane)) * SROW + c0 + cc + dp2 * 16 + bt_col(lane));
          mma16816<DTYPE>(acc[2 * dp2], sa, kb[0], kb[1]);
          mma16816<DTYPE>(acc[2 * dp2 + 1], sa, kb[2], kb[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int m = m0 + mt * 16 + g + 8 * r;
        if (m < N) {
#pragma unroll
          for (int dt = 0; dt < Tr::kDqChunk / 8; ++dt) {
            float *dst = dq + (int64_t)m * D + c0 + cc + dt * 8 + 2 * t;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // REDG.F32x2: fwd+bwd 9.22 -> 6.93 ms on H200
            atomicAdd(reinterpret_cast<float2 *>(dst), make_float2(acc[dt][2 * r], acc[dt][2 * r + 1]));
#else
            atomicAdd(dst, acc[dt][2 * r]);
            atomicAdd(dst + 1, acc[dt][2 * r + 1]);
#endif
          }
        }
      }
    }
    __syncthreads();  // Q/dO buffer and dSᵀ are rewritten next step
  }

  // dK, dV rows of this warp (strided outputs: (B, H, N, d) views, e.g. of a packed (B, N, 3, H, d) gradient), 4-byte stores.
  T *dk_out = static_cast<T *>(p.dk) + b * p.dk_st.batch + h * p.dk_st.head;
  T *dv_out = static_cast<T *>(p.dv) + b * p.dv_st.batch + h * p.dv_st.head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int n = n0 + warp * 16 + g + 8 * r;
    if (n < N) {
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        const int c = dt * 8 + 2 * t;
        *reinterpret_cast<uint32_t *>(dk_out + n * p.dk_st.row + c) = Elem<DTYPE>::pack(dk[dt][2 * r], dk[dt][2 * r + 1]);
        *reinterpret_cast<uint32_t *>(dv_out + n * p.dv_st.row + c) = Elem<DTYPE>::pack(dv[dt][2 * r], dv[dt][2 * r + 1]);
      }
    }
  }
}

// SPLITS = false: grid (key tiles, H, B), one tile per CTA. SPLITS (p.dq_splits = s > 0): grid (s, H, B), CTA j
// taking tiles j, j + s, ... into dq slice j. Two kernels, so that the default one is the loop-free tile alone.
template <int DTYPE, int D, int WARPS, bool SPLITS>
__global__ void __launch_bounds__(BwdTraits<D, WARPS>::kThreads, SPLITS ? 1 : 0) bwd_kernel(const BwdParams p) {
  constexpr int BN = BwdTraits<D, WARPS>::kBlockN;
  const int h = blockIdx.y, b = blockIdx.z;
  const int64_t bh = (int64_t)b * p.H + h;
  if constexpr (!SPLITS) {
    bwd_key_tile<DTYPE, D, WARPS>(p, blockIdx.x * BN, h, b, p.dq_accum + bh * p.N * D);
  } else {
    float *dq = p.dq_accum + ((int64_t)blockIdx.x * p.B * p.H + bh) * p.N * D;  // slice blockIdx.x
    for (int n0 = blockIdx.x * BN; n0 < p.N; n0 += p.dq_splits * BN) {
      bwd_key_tile<DTYPE, D, WARPS>(p, n0, h, b, dq);  // ends with __syncthreads: shared memory is free again
    }
  }
}

template <int DTYPE, int D, int WARPS> cudaError_t launch_bwd_kernel(const BwdParams &p, cudaStream_t stream) {
  using Tr = BwdTraits<D, WARPS>;
  auto kernel = p.dq_splits > 0 ? bwd_kernel<DTYPE, D, WARPS, true> : bwd_kernel<DTYPE, D, WARPS, false>;
  cudaError_t err = p.dq_splits > 0 ? set_smem_once<bwd_kernel<DTYPE, D, WARPS, true>>(Tr::kSmemBytes)
                                    : set_smem_once<bwd_kernel<DTYPE, D, WARPS, false>>(Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int tiles = (p.N + Tr::kBlockN - 1) / Tr::kBlockN;
  if (p.dq_splits < 0 || p.dq_splits > tiles) return cudaErrorInvalidValue;
  dim3 grid(p.dq_splits > 0 ? p.dq_splits : tiles, p.H, p.B);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <int DTYPE, int D, int WARPS> int split_ctas_per_sm() {
  using Tr = BwdTraits<D, WARPS>;
  auto kernel = bwd_kernel<DTYPE, D, WARPS, true>;
  int ctas = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, Tr::kThreads, Tr::kSmemBytes) != cudaSuccess) {
    (void)cudaGetLastError();  // the caller raises; a later launch check must not see this error
    return 0;
  }
  return ctas;
}

template <int DTYPE, int D> int bwd_split_ctas_per_sm(int bwd_warps) {
  if (bwd_warps == 8) return split_ctas_per_sm<DTYPE, D, 8>();
  if (bwd_warps == 4) return split_ctas_per_sm<DTYPE, D, 4>();
  return 0;
}

template <int DTYPE, int D> cudaError_t run_bwd(const BwdParams &p, cudaStream_t stream) {
  const int64_t rows = (int64_t)p.B * p.H * p.N;
  constexpr int RPB = 256 / (D / 8);
  bwd_delta_kernel<DTYPE, D><<<(unsigned)((rows + RPB - 1) / RPB), 256, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (p.bwd_warps != 8 && p.bwd_warps != 4) return cudaErrorInvalidValue;
  err = p.bwd_warps == 8 ? launch_bwd_kernel<DTYPE, D, 8>(p, stream) : launch_bwd_kernel<DTYPE, D, 4>(p, stream);
  return err != cudaSuccess ? err : run_bwd_dq<DTYPE, D>(p, stream);
}

}  // namespace vitk

#define VITK_INSTANTIATE_BWD(DTYPE, D)                                                      \
  template cudaError_t vitk::run_bwd<vitk::DTYPE, D>(const vitk::BwdParams &, cudaStream_t); \
  template int vitk::bwd_split_ctas_per_sm<vitk::DTYPE, D>(int);

// FlashAttention-2 forward (Dao, 2023, "FlashAttention-2", Algorithm 1) with mma.sync m16n8k16.
// A CTA of 4 warps owns a 64-row Q tile (16 rows per warp, Q fragments held in registers) and
// streams 64-row K/V tiles through double-buffered shared memory (cp.async). The online softmax
// lives in registers in base 2 (softmax_scale·log2e folded into one FFMA before exp2); P is packed
// to 16-bit in registers and used directly as the A operand of P·V. Writes out and lse only.
#pragma once
#include "common.cuh"

namespace vitk {

template <int D> struct FwdTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = 16 * kWarps;  // query rows per CTA
  static constexpr int kBlockN = 64;           // key rows per step
  static constexpr int kSRow = D + 8;          // +16 B pad: ldmatrix rows hit distinct banks
  static constexpr int kSmemBytes = (kBlockM + 4 * kBlockN) * kSRow * 2;  // Q + 2x(K, V)
};

template <int DTYPE, int D>
__global__ void __launch_bounds__(FwdTraits<D>::kThreads) fwd_kernel(const FwdParams p) {
  using T = typename Elem<DTYPE>::T;
  using Tr = FwdTraits<D>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, SROW = Tr::kSRow, NT = Tr::kThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  T *Qs = reinterpret_cast<T *>(smem);  // (BM, SROW)
  T *Ks = Qs + BM * SROW;               // (2, BN, SROW)
  T *Vs = Ks + 2 * BN * SROW;           // (2, BN, SROW)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int N = p.N, m0 = blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z;
  const T *q = static_cast<const T *>(p.q) + b * p.q_st.batch + h * p.q_st.head;
  const T *k = static_cast<const T *>(p.k) + b * p.k_st.batch + h * p.k_st.head;
  const T *v = static_cast<const T *>(p.v) + b * p.v_st.batch + h * p.v_st.head;
  const float sl2 = p.softmax_scale * kLog2e;

  load_tile<T, BM, D, SROW, NT>(Qs, q, p.q_st.row, m0, N);
  load_tile<T, BN, D, SROW, NT>(Ks, k, p.k_st.row, 0, N);
  load_tile<T, BN, D, SROW, NT>(Vs, v, p.v_st.row, 0, N);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  uint32_t qf[D / 16][4];  // this warp's 16 Q rows as A fragments
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrix_x4(qf[kk], Qs + (warp * 16 + a_row(lane)) * SROW + kk * 16 + a_col(lane));

  float o[D / 8][4] = {};                       // (16, D) accumulator per warp
  float row_max[2] = {-INFINITY, -INFINITY};    // rows g, g+8, in units of log2
  float row_sum[2] = {0.f, 0.f};                // this thread's partial sums, reduced at the end
  const int n_blocks = (N + BN - 1) / BN;

  for (int j = 0; j < n_blocks; ++j) {
    const int buf = j & 1;
    if (j + 1 < n_blocks) {
      load_tile<T, BN, D, SROW, NT>(Ks + (buf ^ 1) * BN * SROW, k, p.k_st.row, (j + 1) * BN, N);
      load_tile<T, BN, D, SROW, NT>(Vs + (buf ^ 1) * BN * SROW, v, p.v_st.row, (j + 1) * BN, N);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T *Kb = Ks + buf * BN * SROW, *Vb = Vs + buf * BN * SROW;

    float s[BN / 8][4] = {};  // S = Q Kᵀ, (16, BN) per warp
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, Kb + (np * 16 + bn_row(lane)) * SROW + kk * 16 + bn_col(lane));
        mma16816<DTYPE>(s[2 * np], qf[kk], kb[0], kb[1]);
        mma16816<DTYPE>(s[2 * np + 1], qf[kk], kb[2], kb[3]);
      }
    }
    if ((j + 1) * BN > N) {  // keys past N -> -inf
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (j * BN + nt * 8 + 2 * t + (e & 1) >= N) s[nt][e] = -INFINITY;
    }

    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
    }
    float alpha[2], neg_m[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(row_max[r], quad_max(mx[r]) * sl2);  // finite: every tile has a key < N
      alpha[r] = exp2f(row_max[r] - m_new);
      row_max[r] = m_new;
      neg_m[r] = -m_new;
    }
    float ls[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(fmaf(s[nt][e], sl2, neg_m[e / 2]));
        ls[e / 2] += s[nt][e];
      }
    row_sum[0] = row_sum[0] * alpha[0] + ls[0];
    row_sum[1] = row_sum[1] * alpha[1] + ls[1];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= alpha[0]; o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1]; o[dt][3] *= alpha[1];
    }

#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {  // O += P V; P from registers
      const uint32_t pa[4] = {Elem<DTYPE>::pack(s[2 * kk][0], s[2 * kk][1]),
                              Elem<DTYPE>::pack(s[2 * kk][2], s[2 * kk][3]),
                              Elem<DTYPE>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              Elem<DTYPE>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, Vb + (kk * 16 + bt_row(lane)) * SROW + dp * 16 + bt_col(lane));
        mma16816<DTYPE>(o[2 * dp], pa, vb[0], vb[1]);
        mma16816<DTYPE>(o[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // buffer `buf` is refilled at step j + 1
  }

  // Normalise, stage this warp's 16 rows through its own slice of Qs, write 16-byte vectors.
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(row_sum[r]);
    inv[r] = 1.f / l;
    const int row = m0 + warp * 16 + g + 8 * r;
    if (t == 0 && row < N)
      p.lse[((int64_t)b * p.H + h) * N + row] = (row_max[r] + log2f(l)) * kLn2;
  }
  T *Os = Qs + warp * 16 * SROW;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) {
    *reinterpret_cast<uint32_t *>(Os + g * SROW + dt * 8 + 2 * t) = Elem<DTYPE>::pack(o[dt][0] * inv[0], o[dt][1] * inv[0]);
    *reinterpret_cast<uint32_t *>(Os + (g + 8) * SROW + dt * 8 + 2 * t) = Elem<DTYPE>::pack(o[dt][2] * inv[1], o[dt][3] * inv[1]);
  }
  __syncwarp();
  T *out = static_cast<T *>(p.out) + b * p.out_st.batch + h * p.out_st.head;
  constexpr int CPR = D / 8;
#pragma unroll
  for (int it = 0; it < 16 * CPR / 32; ++it) {
    const int i = it * 32 + lane, r = i / CPR, c = (i % CPR) * 8;
    const int row = m0 + warp * 16 + r;
    if (row < N)
      *reinterpret_cast<uint4 *>(out + (int64_t)row * p.out_st.row + c) = *reinterpret_cast<const uint4 *>(Os + r * SROW + c);
  }
}

template <int DTYPE, int D> cudaError_t run_fwd(const FwdParams &p, cudaStream_t stream) {
  using Tr = FwdTraits<D>;
  cudaError_t err = set_smem_once<fwd_kernel<DTYPE, D>>(Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 grid((p.N + Tr::kBlockM - 1) / Tr::kBlockM, p.H, p.B);
  fwd_kernel<DTYPE, D><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace vitk

#define VITK_INSTANTIATE_FWD(DTYPE, D) \
  template cudaError_t vitk::run_fwd<vitk::DTYPE, D>(const vitk::FwdParams &, cudaStream_t);

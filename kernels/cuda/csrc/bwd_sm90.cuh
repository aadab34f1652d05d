// Hopper backward (sm_90a): FlashAttention-2's Algorithm 2 (as bwd.cuh) on the forward's Hopper
// machinery (fwd_sm90.cuh: TMA, wgmma, a producer warpgroup, mbarriers). Passes the GPU tests on
// an H200; ops.py's auto runs it at head_dim 64 and 128 and N >= 128, where it measured faster.
//
// CTA = 3 warpgroups; a 128-key tile of K and V stays in shared memory, consumer warpgroup w owns
// keys 64w..64w+63 of it and keeps their dK, dV (64 x D each) in registers. The producer streams
// 64-row Q and dO tiles through a 2-stage ring (qd_full / qd_empty). Per query tile, each consumer (the rows-tma and
// columns-tma ones in another order of the same products: bwd_sm90_ordered_step):
//   Sᵀ = K_w Qᵀ, dPᵀ = V_w dOᵀ     wgmma m64n64k16, A and B K-major from shared memory
//   Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e), dSᵀ/scale = Pᵀ ∘ (dPᵀ − delta), in registers (masked);
//                                     the scale goes onto dK as it is stored and dQ in the dq kernel
//   dV += Pᵀ dO, dK += dSᵀ Q         wgmma m64nDk16, A = Pᵀ / dSᵀ from registers, B MN-major
//   dSᵀ -> shared memory (128B-swizzled by hand, as TMA would), then
//   dQ_w = dS K_w                     wgmma m64nDk16, A = dS (MN-major: dSᵀ's rows are keys), B = K_w
//                                     MN-major, over this warpgroup's 64 keys only
//   dq_accum += dQ_w with float32 atomics (REDG.F32x2), so both consumers add to the same rows:
//   twice the atomics of a 128-key split, and dq is not bitwise reproducible (dk, dv are).
// The dQ mode DQ: kDqOwn as above; kDqCols (head_dim 128 only, VIT_CUDA_BWD_DQ=columns; with DQ_TMA the default there):
// instead, consumer w computes dQ[:, 64w..64w+63] = dS K[:, 64w..] over all 128 keys (both halves of
// dSᵀ, so the dSᵀ barriers span both consumers) and adds it once: half the atomics per CTA and
// 32 accumulator registers instead of 64. kDqSum (head_dim 64 only, VIT_CUDA_BWD_DQ=sum or sum-tma):
// consumer 0 stores its dQ_w in shared memory, consumer 1 adds it to its own and adds the sum to dq_accum, so a
// CTA adds one 64 x 64 float32 tile a step instead of two (at head_dim 128 the column split did the same for
// atomics and measured 10.2 against 12.7 ms fwd+bwd).
// DQ_TMA (VIT_CUDA_BWD_DQ=tma, columns-tma (the head_dim-128 default), sum-tma, rows-tma): instead of the
// atomics, each consumer writes its dQ_w into a shared-memory staging box in TMA's 128B-swizzled layout
// (ncu, H100: 4 shared-store wavefronts per STS.64 where 2 would do, two rows of a half-warp on one pair of 16-byte
// chunks), and one thread adds the box into dq_accum with one TMA reduce-add per 32 columns
// (cp.reduce.async.bulk.tensor, UTMAREDG; FlashAttention-3's dQ): the L2 does the float32 adds in whole boxes, the
// consumer issues no REDG. The box is rewritten a step later, after the issuing thread's bulk_wait_read, placed
// before the step's second dSᵀ barrier (bwd_sm90_ordered_step: after the dK issue, followed
// by a warpgroup barrier) a whole step after the copy was issued, so no thread waits on it unless the copy is still
// reading.
// OVERLAP (head_dim 64, VIT_CUDA_BWD_SM90=overlap; measured slower, opt-in): Sᵀ and dPᵀ in two commit groups, the wait
// for Sᵀ only (wgmma.wait_group 1), Pᵀ's exponentials while dPᵀ's wgmma runs, then the wait for dPᵀ and dSᵀ
// (FlashAttention-3's intra-warpgroup overlap of the softmax with a matrix product). The same arithmetic in the
// same order: Pᵀ, dSᵀ and so dk, dv are bitwise those of the sequential consumer (dq too, but for the order of its
// atomic adds, which differs run to run in both). At head_dim 128 it runs out
// of registers (ptxas 13.0: C7512, wgmmas serialised, 750-910 bytes spilled), as the forward's overlap did.
// kDqRows (head_dim 64 only, VIT_CUDA_BWD_DQ=rows or rows-tma; rows-tma the default there): FlashAttention-3's
// head_dim-64 tile, 128 query rows a step instead of 64. Sᵀ and dPᵀ become m64n128 products (N = 64 gave the
// head_dim-64 kernels their small wgmmas: at 128 the dK and dV products already have N = 128), dV and dK take 8
// k-steps, dSᵀ is stored in two 64-query blocks, and consumer w computes dQ's rows 64w..64w+63 of the step over all
// 128 keys (dS from dSᵀ's block w, the dSᵀ barriers span both consumers) and adds them once, by atomics or TMA. 0 spills.
// Every consumer but the overlapped one reads a step's lse and delta from shared memory (bwd_sm90_stage_lsd).
// OVERLAP with kDqRows or kDqCols and DQ_TMA (VIT_CUDA_BWD_SM90=pingpong, opt-in): the ping-pong consumer, bwd_sm90_consume_pp
// below (the two consumers issue their products in turn; dQ one step late; dSᵀ double-buffered).
// SPLITS (p.dq_splits = s > 0, attention.deterministic=true; the sequential consumer with rows-tma at head_dim 64,
// columns-tma at 128, where each dQ element gets one reduce-add a key tile, always from the same thread):
// FlashAttention-2's deterministic dq slices. Grid (s, H, B); CTA j walks key tiles j, j + s, ..., K and V reloaded
// once both consumers release them (kv_empty), and adds its dQ into its own float32 slice of dq_accum, waiting at each
// tile's end until its reduce-adds are done: each slice element sums its tiles in one order, and the dq kernel sums
// the slices in order. (FlashAttention-3 orders its dQ adds with a semaphore per query tile instead, so the CTAs of
// a (batch, head) add one behind the other.)
// delta = rowsum(dO ∘ O) comes from bwd.cuh's delta kernel (which zeroes dq_accum), dq from dq_accum by its dq kernel.
#pragma once
#include <cuda.h>
#include <type_traits>
#include "bwd.cuh"
#include "fwd_sm90.cuh"

namespace vitk {

template <int D, int BM = 64> struct BwdSm90Traits {
  static_assert(D == 64 || D == 128, "the sm90 backward has kernels for head_dim 64 and 128");
  static_assert(BM == 64 || (BM == 128 && D == 64), "128 query rows a step: head_dim 64 only (kDqRows)");
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kBlockN = 64 * kConsumers;  // keys per CTA
  static constexpr int kBlockM = BM;               // query rows per step
  static constexpr int kStages = 2;
  static constexpr int kColBlocks = D / 64;
  static constexpr int kKVBytes = kBlockN * D * 2;   // K or V
  static constexpr int kTileBytes = kBlockM * D * 2; // one Q or dO stage
  static constexpr int kDSBytes = kBlockN * kBlockM * 2;
  static constexpr int kSmemBytes = 2 * kKVBytes + 2 * kStages * kTileBytes + kDSBytes + 1024;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  // registers a thread gets at launch (__launch_bounds__(kThreads, 1): the register file / threads, in steps of 8);
  // setmaxnreg can only redistribute the CTA's kThreads x kLaunchRegs, or the increase waits forever
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
  static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (1 + kConsumers) * kLaunchRegs, "register split");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

enum : int { kDqOwn = 0, kDqCols = 1, kDqSum = 2, kDqRows = 3 };  // dQ modes (the comment at the top)
// The traits of a dQ mode: kDqRows steps over 128 query rows, the others over 64.
template <int D, int DQ> using BwdSm90TraitsOf = BwdSm90Traits<D, DQ == kDqRows ? 128 : 64>;

// What differs between the kernel variants: the query rows a step (kDqRows: 128), shared memory (the dQ staging
// boxes, float32, 64 rows x the columns each consumer adds: one per consumer with DQ_TMA, one shared with kDqSum) and
// the register split (DQ_TMA and kDqRows: 24 for the producer, 240 for each consumer, as FlashAttention-3 splits three
// warpgroups; at 40 / 232 the head_dim-128 DQ_TMA kernels spilled 12 bytes, ptxas 13.0).

// Whether a consumer takes bwd_sm90_ordered_step: the sequential one with a split, TMA-added dQ (rows-tma, columns-tma).
// OVERLAP with those dQ modes is the ping-pong consumer, which keeps its own order.
__host__ __device__ constexpr bool bwd_sm90_ordered(int dq, bool dq_tma, bool overlap) {
  return (dq == kDqRows || dq == kDqCols) && dq_tma && !overlap;
}

template <int D, int DQ, bool DQ_TMA, bool PP = false> struct BwdSm90Variant {
  using Tr = BwdSm90TraitsOf<D, DQ>;
  static_assert(!PP || (DQ_TMA && (D == 64 ? DQ == kDqRows : DQ == kDqCols)),
                "the ping-pong consumer: rows-tma at head_dim 64, columns-tma at 128");
  static constexpr int kDsBuffers = PP || bwd_sm90_ordered(DQ, DQ_TMA, PP) ? 2 : 1;  // dSᵀ, double-buffered for those
  static constexpr int kBoxes = DQ == kDqSum ? 1 : DQ_TMA ? Tr::kConsumers : 0;  // dQ staging boxes of 64 rows
  static constexpr int kBoxFloats = kBoxes * 64 * (DQ == kDqCols ? 64 : D);
  static constexpr int kLsdFloats = Tr::kConsumers * 2 * Tr::kBlockM;  // a step's lse, delta per consumer
  static constexpr int kSmemBytes = Tr::kSmemBytes + (kDsBuffers - 1) * Tr::kDSBytes + (kBoxFloats + kLsdFloats) * 4;
  static constexpr bool kWide = DQ_TMA || DQ == kDqRows;  // the consumers' 240 registers
  static constexpr int kProducerRegs = kWide ? 24 : Tr::kProducerRegs;
  static constexpr int kConsumerRegs = kWide ? 240 : Tr::kConsumerRegs;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(kProducerRegs + Tr::kConsumers * kConsumerRegs <= (1 + Tr::kConsumers) * Tr::kLaunchRegs,
                "register split");
};

template <int STAGES> struct BwdSm90Barriers {
  uint64_t kv_full, kv_empty, qd_full[STAGES], qd_empty[STAGES];  // kv_empty: SPLITS only (the next key tile's K, V)
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// One key tile's loads: K, V once, then Q and dO stage by stage. `tile`: the key tiles this CTA has done before
// (SPLITS walks several; the others one, tile 0), whose m_blocks steps each the Q/dO ring counts on from (unsigned:
// at N = 4M with one slice the count passes 2^31; S divides 2^32, so stage and parity wrap consistently).
template <typename Tr, typename T>
__device__ __forceinline__ void bwd_sm90_produce(const CUtensorMap *tm_q, const CUtensorMap *tm_k,
                                                 const CUtensorMap *tm_v, const CUtensorMap *tm_do, T *Ks, T *Vs,
                                                 T *Qs, T *dOs, BwdSm90Barriers<Tr::kStages> &bar, int n0, int h,
                                                 int b, int m_blocks, int tile = 0) {
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, D = Tr::kColBlocks * 64, S = Tr::kStages;
  const unsigned first = (unsigned)tile * m_blocks;
  auto load_q_do = [&](int m) {  // query rows m·BM.. of Q and dO into the stage of ring step first + m
    const unsigned r = first + m, s = r % S;
    mbar_wait(&bar.qd_empty[s], ((r / S) & 1) ^ 1);
    mbar_arrive_expect_tx(&bar.qd_full[s], 2 * Tr::kTileBytes);
#pragma unroll
    for (int c = 0; c < Tr::kColBlocks; ++c) {
      tma_load_4d(Qs + s * BM * D + c * BM * 64, tm_q, &bar.qd_full[s], 64 * c, m * BM, h, b);
      tma_load_4d(dOs + s * BM * D + c * BM * 64, tm_do, &bar.qd_full[s], 64 * c, m * BM, h, b);
    }
  };
  // A later tile's first Q/dO stages need only the last tile's stages freed, not its K and V: loaded first, they
  // come in under the consumers' last dQ product and dK/dV stores.
  const int early = tile > 0 ? (m_blocks < S ? m_blocks : S) : 0;
  for (int m = 0; m < early; ++m) load_q_do(m);
  if (tile > 0) mbar_wait(&bar.kv_empty, (tile - 1) & 1);  // the consumers are done with the last tile's K, V
  mbar_arrive_expect_tx(&bar.kv_full, 2 * Tr::kKVBytes);
#pragma unroll
  for (int c = 0; c < Tr::kColBlocks; ++c) {
    tma_load_4d(Ks + c * BN * 64, tm_k, &bar.kv_full, 64 * c, n0, h, b);
    tma_load_4d(Vs + c * BN * 64, tm_v, &bar.kv_full, 64 * c, n0, h, b);
  }
  for (int m = early; m < m_blocks; ++m) load_q_do(m);
}

// Pᵀ of one 64-key x BM-query tile in place (s -> Pᵀ, BM/2 elements), zero past N. Thread's element 4c + 2r + u:
// key `key` + 8r, query m = m0 + 8c + 2t + u; lse is read once per query, at lse[m - lse0] (lse0 = 0: the head's
// lse in global memory; m0: this step's copy in shared memory). STAGED (the copy, zero past N): query rows past N
// need no mask, as their Q and dO rows are TMA's zero fill, so their Pᵀ = 1 meets dPᵀ = delta = 0 and zero Q and dO
// rows in every product. Keys past N stay masked: an exp2 of -lse could overflow and meet K's zero rows (inf · 0).
template <bool STAGED, int NS>
__device__ __forceinline__ void bwd_sm90_softmax(float (&s)[NS], const float *lse, int lse0, float sl2, int m0, int key,
                                                 int N, int t) {
  const bool key_ok[2] = {key < N, key + 8 < N};
#pragma unroll
  for (int c = 0; c < NS / 4; ++c)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int m = m0 + 8 * c + 2 * t + u;
      const bool ok = STAGED || m < N;
      const float l2 = ok ? lse[m - lse0] * kLog2e : 0.f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = 4 * c + 2 * r + u;
        s[i] = ok && key_ok[r] ? exp2f(fmaf(s[i], sl2, -l2)) : 0.f;
      }
    }
}

// dSᵀ/scale = Pᵀ ∘ (dPᵀ − delta) in place (dp -> dSᵀ/scale), from bwd_sm90_softmax's Pᵀ; delta read once per query,
// at delta[m - lse0] as lse (STAGED: zero past N, no check). softmax_scale is applied once at the end instead of to
// every element, as FlashAttention-2 does: to dK as it is stored, to dQ by the dq kernel (p.dq_scale).
template <bool STAGED, int NS>
__device__ __forceinline__ void bwd_sm90_grad(const float (&s)[NS], float (&dp)[NS], const float *delta, int lse0,
                                              int m0, int N, int t) {
#pragma unroll
  for (int c = 0; c < NS / 4; ++c)
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int m = m0 + 8 * c + 2 * t + u;
      const float dl = STAGED || m < N ? delta[m - lse0] : 0.f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = 4 * c + 2 * r + u;
        dp[i] = s[i] * (dp[i] - dl);
      }
    }
}

// dSᵀ (this warpgroup's 64 keys x BM queries) into shared memory, rows = keys, in blocks of 64 queries: block j holds
// all 128 keys' queries 64j..64j+63 (block stride 128 rows x 128 B), 128-byte rows with the 128B swizzle (16-byte
// chunk c of row r at chunk c ^ (r % 8)) that the MN-major descriptor expects. dSw: this warpgroup's first row.
// Input: the packed A fragments sa[kk] (kk = 16-query step; e = 0..3: rows g, g+8 of n8-tile 2kk, then
// of tile 2kk+1), so n8-tile i, row half r is sa[i / 2][2 (i % 2) + r].
template <int NK>
__device__ __forceinline__ void bwd_sm90_store_ds(void *dSw, const uint32_t (&sa)[NK][4], int warp, int g, int t) {
  unsigned char *base = static_cast<unsigned char *>(dSw);
#pragma unroll
  for (int i = 0; i < 2 * NK; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 16 * warp + g + 8 * r, chunk = i % 8;
      *reinterpret_cast<uint32_t *>(base + (i / 8) * 128 * 128 + row * 128 + ((chunk ^ (row & 7)) << 4) + 4 * t) =
          sa[i / 2][2 * (i % 2) + r];
    }
}

// dQ_w (this warpgroup's 64 query rows x 2·NQ columns, the float32 accumulator fragments: element 4j + 2r + u at
// row 16·warp + g + 8r, column 8j + 2t + u) in the staging boxes TMA reads: 32-column blocks of 64 rows x 128 B,
// 16-byte chunk c of row r at chunk c ^ (r % 8) (CU_TENSOR_MAP_SWIZZLE_128B). A warp's float2 stores go out as two
// half-warps, whose rows g and g ^ 1 land on one pair of chunks: 4 wavefronts a store where 2 would do (ncu source
// page, H100: benchmarks/results/h100_20261207b.md). Offset (floats) of elements 4j + 2r and 4j + 2r + 1:
__device__ __forceinline__ int dq_box_offset(int j, int r, int warp, int g, int t) {
  const int row = warp * 16 + g + 8 * r, col = 8 * j + 2 * t, lc = col % 32;
  return (col / 32) * 64 * 32 + row * 32 + (((lc / 4) ^ (row % 8)) * 4) + lc % 4;
}
template <int NQ> __device__ __forceinline__ void bwd_sm90_store_dq(float *dQw, const float (&dqw)[NQ], int warp, int g,
                                                                    int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int j = 0; j < NQ / 4; ++j)
      *reinterpret_cast<float2 *>(dQw + dq_box_offset(j, r, warp, g, t)) =
          make_float2(dqw[4 * j + 2 * r], dqw[4 * j + 2 * r + 1]);
}
// dqw += what bwd_sm90_store_dq left in the box (kDqSum: consumer 1 adds consumer 0's dQ_w, element for element).
template <int NQ> __device__ __forceinline__ void bwd_sm90_add_dq(const float *dQw, float (&dqw)[NQ], int warp, int g,
                                                                  int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int j = 0; j < NQ / 4; ++j) {
      const float2 o = *reinterpret_cast<const float2 *>(dQw + dq_box_offset(j, r, warp, g, t));
      dqw[4 * j + 2 * r] += o.x;
      dqw[4 * j + 2 * r + 1] += o.y;
    }
}

// A consumer's dK and dV (its 64 keys x D, the float32 accumulator fragments: element 4j + 2r + u at key `key` + 8r,
// column 8j + 2t + u) into the strided (B, H, N, d) outputs, e.g. views of a packed (B, N, 3, H, d) gradient; dK
// times softmax_scale (bwd_sm90_grad leaves it out of dSᵀ).
template <int DTYPE, int NO>
__device__ __forceinline__ void bwd_sm90_store_dkdv(const BwdParams &p, const float (&dk)[NO], const float (&dv)[NO],
                                                    int key, int t, int h, int b) {
  using T = typename Elem<DTYPE>::T;
  T *dk_out = static_cast<T *>(p.dk) + b * p.dk_st.batch + h * p.dk_st.head;
  T *dv_out = static_cast<T *>(p.dv) + b * p.dv_st.batch + h * p.dv_st.head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int n = key + 8 * r;
    if (n >= p.N) continue;
#pragma unroll
    for (int j = 0; j < NO / 4; ++j) {
      const int c = 8 * j + 2 * t;
      *reinterpret_cast<uint32_t *>(dk_out + n * p.dk_st.row + c) =
          Elem<DTYPE>::pack(dk[4 * j + 2 * r] * p.softmax_scale, dk[4 * j + 2 * r + 1] * p.softmax_scale);
      *reinterpret_cast<uint32_t *>(dv_out + n * p.dv_st.row + c) = Elem<DTYPE>::pack(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
    }
  }
}

// A step's lse and delta (queries m0.., zero past N) into this warpgroup's shared-memory copy lsd_w (BM floats each,
// one or two per thread), loaded under the step's first products for the softmax to read: read from global memory
// where the softmax uses them, the 128-query step spilled 40-44 bytes (ptxas 13.0) and the head_dim-128 ping-pong
// kernel's exponentials waited on those loads in about a quarter of its stall samples (ncu source page, H100).
template <int BM>
__device__ __forceinline__ void bwd_sm90_stage_lsd(float *lsd_w, const float *lse, const float *delta, int m0, int tid,
                                                   int N) {
#pragma unroll
  for (int i = tid; i < 2 * BM; i += 128) {
    const int q = m0 + i % BM;
    lsd_w[i] = q < N ? (i < BM ? lse : delta)[q] : 0.f;
  }
}

// dQ_w (64 rows x NQ columns, the accumulator fragments) added to dq ((N, D) float32) at rows row0.., columns col0..
// by float32 atomics, two floats each (REDG.F32x2); rows past N are skipped.
template <int D, int NQ>
__device__ __forceinline__ void bwd_sm90_atomic_dq(float *dq, const float (&dqw)[NQ], int row0, int col0, int N, int warp,
                                                   int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // dQ rows row0 + 16·warp + g + 8r
    const int m = row0 + warp * 16 + g + 8 * r;
    if (m >= N) continue;
#pragma unroll
    for (int j = 0; j < NQ / 4; ++j)
      atomicAdd(reinterpret_cast<float2 *>(dq + (int64_t)m * D + col0 + 8 * j + 2 * t),
                make_float2(dqw[4 * j + 2 * r], dqw[4 * j + 2 * r + 1]));
  }
}

// The thread of a warpgroup that issues its bulk copies, read from threadIdx each time (a register kept for it
// through the loop spilled at head_dim 128).
__device__ __forceinline__ bool warpgroup_leader() { return (threadIdx.x & 127) == 0; }

// Named barrier 1 + w: the 128 threads of consumer warpgroup w (a constant id keeps it out of a register).
__device__ __forceinline__ void warpgroup_sync(int w) {
  if (w == 0) named_barrier_sync<1, 128>();
  else named_barrier_sync<2, 128>();
}

// dQ_w into dq_accum by TMA reduce-add: the fragments into this warpgroup's staging boxes, then one thread adds each
// 32-column box at rows row0.. (those past N are dropped by TMA), columns col0 + 32c, where `any` (rows below N).
// SPLITS: into dq_accum slice blockIdx.x (the map's batch axis spans (slices, B)).
template <int NQ, bool SPLITS = false>
__device__ __forceinline__ void bwd_sm90_reduce_dq(const CUtensorMap *tm_dq, float *dQw, const float (&dqw)[NQ], int w,
                                                   int row0, int col0, bool any, int warp, int g, int t) {
  bwd_sm90_store_dq(dQw, dqw, warp, g, t);
  fence_proxy_async_shared();  // the stores, before the async proxy (TMA) reads them
  warpgroup_sync(w);
  if (warpgroup_leader() && any) {
#pragma unroll
    for (int c = 0; c < NQ / 16; ++c)
      tma_reduce_add_4d(tm_dq, dQw + c * 64 * 32, col0 + 32 * c, row0, blockIdx.y,
                        SPLITS ? blockIdx.x * gridDim.z + blockIdx.z : blockIdx.z);
    bulk_commit();
  }
}

template <int DTYPE, int D> __device__ __forceinline__ void wgmma_rs_d(float (&acc)[D / 2], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (D == 64) wgmma_rs_n64<DTYPE>(acc, a, b, 1);
  else wgmma_rs_n128<DTYPE>(acc, a, b, 1);
}
template <int DTYPE, int BM> __device__ __forceinline__ void wgmma_ss_bm(float (&acc)[BM / 2], uint64_t a, uint64_t b, int scale_d) {
  if constexpr (BM == 64) wgmma_ss_n64<DTYPE, 0, 0>(acc, a, b, scale_d);
  else wgmma_ss_n128<DTYPE, 0, 0>(acc, a, b, scale_d);
}
template <int DTYPE, int D> __device__ __forceinline__ void wgmma_ss_tt_d(float (&acc)[D / 2], uint64_t a, uint64_t b, int scale_d) {
  if constexpr (D == 64) wgmma_ss_n64<DTYPE, 1, 1>(acc, a, b, scale_d);
  else wgmma_ss_n128<DTYPE, 1, 1>(acc, a, b, scale_d);
}

// acc (BM/2 floats: a 64 x BM tile) += A_w Bᵀ over head columns 16kk..16kk+15: A_w this warpgroup's 64 keys of K or V
// (column blocks of BN rows), B a Q or dO stage (column blocks of BM rows), both K-major in shared memory.
template <int DTYPE, int BN, int BM, typename T>
__device__ __forceinline__ void bwd_sm90_issue_kt(float (&acc)[BM / 2], const T *Aw, const T *B, int kk) {
  const int blk = kk / 4, col = (kk % 4) * 16;
  wgmma_ss_bm<DTYPE, BM>(acc, make_desc_k(Aw + blk * BN * 64 + col), make_desc_k(B + blk * BM * 64 + col), kk > 0);
}

// Sᵀ = K_w Qᵀ and dPᵀ = V_w dOᵀ for one step, issued as two commit groups, so that a wait for the first
// (wgmma_wait<1>) leaves dPᵀ running under Pᵀ's exponentials (the overlapped, ordered and ping-pong consumers).
template <int DTYPE, int D, int BN, int BM, typename T>
__device__ __forceinline__ void bwd_sm90_issue_s_dp(float (&s)[BM / 2], float (&dp)[BM / 2], const T *Kw, const T *Vw,
                                                    const T *Qb, const T *dOb) {
  fence_operands(s);
  fence_operands(dp);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) bwd_sm90_issue_kt<DTYPE, BN, BM>(s, Kw, Qb, kk);  // Sᵀ = K_w Qᵀ
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) bwd_sm90_issue_kt<DTYPE, BN, BM>(dp, Vw, dOb, kk);  // dPᵀ = V_w dOᵀ
  wgmma_commit();
}

// Pᵀ and dSᵀ (float32 accumulator fragments) packed two to a register as the A fragments of the dV and dK products.
template <int DTYPE, int NS>
__device__ __forceinline__ void bwd_sm90_pack(const float (&s)[NS], const float (&dp)[NS], uint32_t (&pa)[NS / 8][4],
                                              uint32_t (&sa)[NS / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < NS / 8; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      pa[kk][e] = Elem<DTYPE>::pack(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
      sa[kk][e] = Elem<DTYPE>::pack(dp[8 * kk + 2 * e], dp[8 * kk + 2 * e + 1]);
    }
}

// dV += Pᵀ dO and dK += dSᵀ Q for one step (this warpgroup's 64 keys x D): A from registers (pa, sa, as
// bwd_sm90_pack leaves them, one per 16-query k-step), B the step's dO and Q stages, MN-major in shared memory.
template <int DTYPE, int D, int KS, typename T>
__device__ __forceinline__ void bwd_sm90_issue_dkdv(float (&dv)[D / 2], float (&dk)[D / 2], const uint32_t (&pa)[KS][4],
                                                    const uint32_t (&sa)[KS][4], const T *Qb, const T *dOb) {
  constexpr int BM = 16 * KS;  // query rows a step
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {  // queries 16kk..16kk+15: 2048 bytes further on in Q and dO
    wgmma_rs_d<DTYPE, D>(dv, pa[kk], make_desc_mn(dOb + kk * 16 * 64, BM * 128));
    wgmma_rs_d<DTYPE, D>(dk, sa[kk], make_desc_mn(Qb + kk * 16 * 64, BM * 128));
  }
}

// After bwd_sm90_issue_s_dp, with the step's lse and delta staged in lsd_w (bwd_sm90_stage_lsd): wait for Sᵀ, Pᵀ's
// exponentials while dPᵀ runs, wait for dPᵀ, dSᵀ/scale, both packed into pa and sa (the ordered and ping-pong consumers).
// A block boundary (a branch never taken: N > 0) keeps ptxas 13.0 from hoisting the wait for dPᵀ above the
// exponentials: at head_dim 128 all 32 then run under dPᵀ (22 in the ordered step, 9-11 in the ping-pong one without
// it), no spills. brkpt, not trap: with trap, placed after the EXIT, ptxas spilled 540-804 bytes. At head_dim 64
// brkpt spilled 16 bytes (ordered) and 28 (ping-pong), and 50-58 and 34-36 of 64 run under dPᵀ without it.
template <int DTYPE, int D, int BM>
__device__ __forceinline__ void bwd_sm90_ds_under_dp(float (&s)[BM / 2], float (&dp)[BM / 2], uint32_t (&pa)[BM / 16][4],
                                                     uint32_t (&sa)[BM / 16][4], const float *lsd_w, float sl2, int m0,
                                                     int key, int N, int t) {
  wgmma_wait<1>();  // Sᵀ done, dPᵀ still running under the exponentials
  fence_operands(s);
  bwd_sm90_softmax<true>(s, lsd_w, m0, sl2, m0, key, N, t);
  if constexpr (D == 128) {
    if (N < 0) asm volatile("brkpt;");
  }
  wgmma_wait<0>();
  fence_operands(dp);
  bwd_sm90_grad<true>(s, dp, lsd_w + BM, m0, m0, N, t);
  bwd_sm90_pack<DTYPE>(s, dp, pa, sa);
}

// acc += A B for one step's dV (A = Pᵀ, B = dO) or dK (A = dSᵀ, B = Q) alone: bwd_sm90_issue_dkdv's products one at
// a time, each in its own order of k-steps as there, for the ordered consumer (bwd_sm90_ordered_step).
template <int DTYPE, int D, int KS, typename T>
__device__ __forceinline__ void bwd_sm90_issue_rs(float (&acc)[D / 2], const uint32_t (&a)[KS][4], const T *B) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) wgmma_rs_d<DTYPE, D>(acc, a[kk], make_desc_mn(B + kk * 16 * 64, KS * 16 * 128));
}

// dQ_w = dS K for one step, both operands MN-major in shared memory (dS: the step's dSᵀ, BM/64 blocks of 128 key
// rows x 64 queries; Ks: K, D/64 column blocks of 128 rows): kDqCols, this warpgroup's 64 of dQ's columns over all
// 128 keys (all of dSᵀ, K's column block w); kDqRows, its 64 query rows over all 128 keys (dSᵀ's query block w, all
// of K); otherwise all D columns over its own 64 keys (its rows of dSᵀ and of K).
template <int DTYPE, int D, int DQ, int NQ, typename T>
__device__ __forceinline__ void bwd_sm90_issue_dq(float (&dqw)[NQ], const T *dS, const T *Ks, int w) {
  constexpr int BN = 128;
  if constexpr (DQ == kDqCols) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      wgmma_ss_n64<DTYPE, 1, 1>(dqw, make_desc_mn(dS + kk * 16 * 64, 64 * 128),
                                make_desc_mn(Ks + w * BN * 64 + kk * 16 * 64, BN * 128), kk > 0);
  } else if constexpr (DQ == kDqRows) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      wgmma_ss_n64<DTYPE, 1, 1>(dqw, make_desc_mn(dS + w * BN * 64 + kk * 16 * 64, BN * 128),
                                make_desc_mn(Ks + kk * 16 * 64, BN * 128), kk > 0);
  } else {
    const T *dSw = dS + w * 64 * 64, *Kw = Ks + w * 64 * 64;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)  // keys 16kk..: 2048 bytes further on in dSᵀ and K_w
      wgmma_ss_tt_d<DTYPE, D>(dqw, make_desc_mn(dSw + kk * 16 * 64, 64 * 128),
                              make_desc_mn(Kw + kk * 16 * 64, BN * 128), kk > 0);
  }
}

// The barrier around dSᵀ in shared memory: this warpgroup's (it reads only its own dSᵀ), or both
// consumers' (kDqCols: each reads all of dSᵀ; kDqSum: the second also orders the dQ staging box between them; its
// first could be this warpgroup's, but then the TMA + overlap kernel spilled 16 bytes, ptxas 13.0).
template <int DQ> __device__ __forceinline__ void ds_sync(int w) {
  if constexpr (DQ != kDqOwn) named_barrier_sync<3, 256>();
  else warpgroup_sync(w);
}

// One step of the sequential consumer with a split, TMA-added dQ (rows-tma at head_dim 64: auto's backward there;
// columns-tma at 128; and their deterministic and persistent kernels) in FlashAttention-3's order (hopper/
// mainloop_bwd_sm90_tma_gmma_ws.hpp, whose head_dim-64 tile rows-tma is): Sᵀ and dPᵀ go out as two groups and the
// exponentials run under dPᵀ (ptxas 13.0 places 50-58 of 64, or 22-24 of 32, before the wait for it); dV goes out
// before the dSᵀ barrier, then dQ and dK, and dQ is staged and added while dK runs. dSᵀ is double-buffered (step r
// in buffer r % 2), so a step has one dSᵀ barrier, not two: a consumer writes buffer r % 2 after the barrier of step
// r - 1, which both passed once their dQ products of step r - 2 (the buffer's last readers) had completed. Each
// element's arithmetic and each product's k-step order are as in the other order, so dk, dv and dq_accum's adds are
// the same numbers.
template <int DTYPE, int D, int DQ, bool SPLITS, typename T>
__device__ __forceinline__ void bwd_sm90_ordered_step(const BwdParams &p, const CUtensorMap *tm_dq, const T *Ks,
                                                      const T *Kw, const T *Vw, const T *Qb, const T *dOb, T *dSs,
                                                      float *dQw, float *lsd_w, const float *lse, const float *delta,
                                                      float (&dk)[D / 2], float (&dv)[D / 2], unsigned r, int m0,
                                                      int key, int w, int tid) {
  static_assert((D == 64 && DQ == kDqRows) || (D == 128 && DQ == kDqCols), "rows-tma at 64, columns-tma at 128");
  using Tr = BwdSm90TraitsOf<D, DQ>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, NQ = 32;  // dQ_w: 64 x 64 either way
  const int dq_row0 = DQ == kDqRows ? 64 * w : 0, dq_col0 = DQ == kDqCols ? 64 * w : 0;  // this warpgroup's part
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4, N = p.N;
  T *dS = dSs + (r & 1) * BN * BM;  // this step's dSᵀ, (BM/64, BN, 64)
  float s[BM / 2] = {}, dp[BM / 2] = {}, dqw[NQ] = {};
  uint32_t pa[BM / 16][4], sa[BM / 16][4];
  bwd_sm90_issue_s_dp<DTYPE, D, BN, BM>(s, dp, Kw, Vw, Qb, dOb);
  bwd_sm90_stage_lsd<BM>(lsd_w, lse, delta, m0, tid, N);  // under the products
  warpgroup_sync(w);  // (the previous step's reads ended before its dSᵀ barrier)
  bwd_sm90_ds_under_dp<DTYPE, D, BM>(s, dp, pa, sa, lsd_w, p.softmax_scale * kLog2e, m0, key, N, t);
  bwd_sm90_store_ds(dS + w * 64 * 64, sa, warp, g, t);
  fence_proxy_async_shared();
  fence_operands(dv);
  fence_operands(pa);
  wgmma_fence();
  bwd_sm90_issue_rs<DTYPE, D>(dv, pa, dOb);  // dV += Pᵀ dO
  wgmma_commit();
  ds_sync<DQ>(w);  // both halves of this step's dSᵀ are in shared memory
  fence_operands(dqw);
  fence_operands(dk);
  fence_operands(sa);
  wgmma_fence();
  bwd_sm90_issue_dq<DTYPE, D, DQ>(dqw, dS, Ks, w);  // dQ_w = dS K, this warpgroup's 64 query rows or columns
  wgmma_commit();
  bwd_sm90_issue_rs<DTYPE, D>(dk, sa, Qb);  // dK += dSᵀ Q, running while dQ_w is staged and added
  wgmma_commit();
  if (warpgroup_leader()) bulk_wait_read<0>();  // the previous step's reduce-add has read the staging boxes
  wgmma_wait<1>();                              // dV and dQ_w done
  fence_operands(dv);
  fence_operands(pa);
  fence_operands(dqw);
  warpgroup_sync(w);  // the boxes are free before any thread of the warpgroup writes them
  bwd_sm90_reduce_dq<NQ, SPLITS>(tm_dq, dQw, dqw, w, m0 + dq_row0, dq_col0, m0 + dq_row0 < N, warp, g, t);
  wgmma_wait<0>();
  fence_operands(dk);
  fence_operands(sa);
}

// One key tile (n0..n0 + 127) of the sequential consumer w; `tile` as bwd_sm90_produce's. SPLITS (the deterministic
// mode, with DQ_TMA and a split dQ): dQ into this CTA's own dq_accum slice, and at the tile's end K, V released to the
// producer and this warpgroup's reduce-adds waited for until they are done (not only read), so the next tile's adds
// to the same rows come after them: each slice element sums its key tiles in one order every run. PERSIST (CTAs walking
// key tiles, with DQ_TMA): K, V released at the tile's end too, dQ into the one dq_accum.
template <int DTYPE, int D, int DQ, bool DQ_TMA, bool OVERLAP, bool SPLITS = false, bool PERSIST = false>
__device__ __forceinline__ void bwd_sm90_consume(const BwdParams &p, const typename Elem<DTYPE>::T *Ks,
                                                 const typename Elem<DTYPE>::T *Vs, const typename Elem<DTYPE>::T *Qs,
                                                 const typename Elem<DTYPE>::T *dOs, typename Elem<DTYPE>::T *dSs,
                                                 float *dQs, float *lsd, const CUtensorMap *tm_dq,
                                                 BwdSm90Barriers<BwdSm90Traits<D>::kStages> &bar, int w, int tid,
                                                 int n0, int h, int b, int m_blocks, int tile = 0) {
  using T = typename Elem<DTYPE>::T;
  using Tr = BwdSm90TraitsOf<D, DQ>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, S = Tr::kStages, NO = D / 2;
  static_assert(DQ != kDqCols || D == 128, "the column split of dQ needs two 64-column blocks");
  static_assert(DQ != kDqSum || D == 64, "the summed dQ is built for head_dim 64 (128 has the column split)");
  constexpr bool DQ_COLS = DQ == kDqCols, DQ_ROWS = DQ == kDqRows;
  constexpr bool ORDERED = bwd_sm90_ordered(DQ, DQ_TMA, OVERLAP);
  static_assert(!OVERLAP || (D == 64 && !DQ_ROWS), "the overlapped consumer: head_dim 64, 64 query rows a step");
  static_assert(!SPLITS || (DQ_TMA && !OVERLAP && (DQ_COLS || DQ_ROWS)), "dq slices: one TMA add per element a tile");
  static_assert(!PERSIST || (DQ_TMA && !OVERLAP && !SPLITS), "persistent CTAs: the sequential consumer, TMA dQ");
  constexpr int NQ = DQ_COLS ? 32 : NO;  // dQ accumulator: 64 x 64 (DQ_COLS, DQ_ROWS at head_dim 64) or 64 x D
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4, N = p.N;
  const int64_t bh = (int64_t)b * p.H + h;
  const float *lse = p.lse + bh * N, *delta = p.delta + bh * N;
  float *dq = p.dq_accum + bh * N * D;
  const float sl2 = p.softmax_scale * kLog2e;
  const T *Kw = Ks + w * 64 * 64, *Vw = Vs + w * 64 * 64;  // this warpgroup's keys in each column block
  T *dSw = dSs + w * 64 * 64;  // this warpgroup's first dSᵀ row (bwd_sm90_store_ds)
  float *dQw = DQ == kDqSum ? dQs : dQs + w * 64 * 2 * NQ;  // this warpgroup's staging boxes (kDqSum: shared)
  const int dq_row0 = DQ_ROWS ? 64 * w : 0, dq_col0 = DQ_COLS ? 64 * w : 0;  // this warpgroup's part of dQ's tile
  float *lsd_w = lsd + w * 2 * BM;  // this warpgroup's copy of a step's lse (BM floats), then delta (not OVERLAP)
  const int key = n0 + w * 64 + warp * 16 + g;              // this thread's first key row
  float dk[NO], dv[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) dk[i] = dv[i] = 0.f;

  mbar_wait(&bar.kv_full, tile & 1);
  for (int i = 0; i < m_blocks; ++i) {
    const unsigned r = (unsigned)tile * m_blocks + i, st = r % S;  // r: the Q/dO ring's step (bwd_sm90_produce)
    const int m0 = i * BM;
    const T *Qb = Qs + st * BM * D, *dOb = dOs + st * BM * D;
    if constexpr (ORDERED) {
      mbar_wait(&bar.qd_full[st], (r / S) & 1);
      bwd_sm90_ordered_step<DTYPE, D, DQ, SPLITS>(p, tm_dq, Ks, Kw, Vw, Qb, dOb, dSs, dQw, lsd_w, lse, delta, dk, dv,
                                                  r, m0, key, w, tid);
      mbar_arrive(&bar.qd_empty[st]);  // Q and dO of this stage are no longer read
      continue;
    }
    // Fresh each step (the first wgmma of each product overwrites them): kept across the loop, the
    // wgmma's read-write operands would hold 64 + D/2 registers through the whole step.
    float s[BM / 2] = {}, dp[BM / 2] = {}, dqw[NQ] = {};
    uint32_t pa[BM / 16][4], sa[BM / 16][4];
    mbar_wait(&bar.qd_full[st], (r / S) & 1);
    if constexpr (OVERLAP) {
      bwd_sm90_issue_s_dp<DTYPE, D, BN, BM>(s, dp, Kw, Vw, Qb, dOb);
      wgmma_wait<1>();  // Sᵀ done, dPᵀ still running under the exponentials
      fence_operands(s);
      bwd_sm90_softmax<false>(s, lse, 0, sl2, m0, key, N, t);
      if (p.N < 0) asm volatile("trap;");  // never taken: a block boundary keeps ptxas from hoisting the next wait
      wgmma_wait<0>();
      fence_operands(dp);
    } else {
      fence_operands(s);
      fence_operands(dp);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {  // Sᵀ += K_w Qᵀ, dPᵀ += V_w dOᵀ, one group
        bwd_sm90_issue_kt<DTYPE, BN, BM>(s, Kw, Qb, kk);
        bwd_sm90_issue_kt<DTYPE, BN, BM>(dp, Vw, dOb, kk);
      }
      wgmma_commit();
      bwd_sm90_stage_lsd<BM>(lsd_w, lse, delta, m0, tid, N);  // under the products
      wgmma_wait<0>();
      fence_operands(s);
      fence_operands(dp);
      warpgroup_sync(w);  // (the previous step's reads ended before its dSᵀ barriers)
      bwd_sm90_softmax<true>(s, lsd_w, m0, sl2, m0, key, N, t);
    }
    bwd_sm90_grad<!OVERLAP>(s, dp, OVERLAP ? delta : lsd_w + BM, OVERLAP ? 0 : m0, m0, N, t);
    bwd_sm90_pack<DTYPE>(s, dp, pa, sa);
    ds_sync<DQ>(w);  // the previous step's dQ wgmma has finished reading dSᵀ
    bwd_sm90_store_ds(dSw, sa, warp, g, t);
    fence_proxy_async_shared();

    fence_operands(dv);
    fence_operands(dk);
    fence_operands(pa);
    fence_operands(sa);
    wgmma_fence();
    bwd_sm90_issue_dkdv<DTYPE, D>(dv, dk, pa, sa, Qb, dOb);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(dv);
    fence_operands(dk);
    fence_operands(pa);
    fence_operands(sa);
    mbar_arrive(&bar.qd_empty[st]);  // Q and dO of this stage are no longer read

    if constexpr (DQ_TMA)  // the staging boxes are written after the next barrier
      if (warpgroup_leader()) bulk_wait_read<0>();  // the previous step's reduce-add has read them
    ds_sync<DQ>(w);  // all of dSᵀ is in shared memory (kDqSum: and consumer 1 has read the staging box)
    fence_operands(dqw);
    wgmma_fence();
    bwd_sm90_issue_dq<DTYPE, D, DQ>(dqw, dSs, Ks, w);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(dqw);

    auto add_to_accum = [&] {  // dqw into dq_accum: by TMA reduce-add from the staging box, or atomics
      if constexpr (DQ_TMA) {  // DQ_ROWS: a last step's second half may be empty
        bwd_sm90_reduce_dq<NQ, SPLITS>(tm_dq, dQw, dqw, w, m0 + dq_row0, dq_col0, !DQ_ROWS || m0 + dq_row0 < N, warp,
                                       g, t);
      } else {
        bwd_sm90_atomic_dq<D>(dq, dqw, m0 + dq_row0, dq_col0, N, warp, g, t);
      }
    };
    if constexpr (DQ == kDqSum) {  // consumer 0 hands its dQ_w to consumer 1 through the staging box
      if (w == 0) bwd_sm90_store_dq(dQw, dqw, warp, g, t);
      named_barrier_sync<4, 256>();  // consumer 0's dQ_w is in shared memory
      if (w == 1) {
        bwd_sm90_add_dq(dQw, dqw, warp, g, t);  // same thread, same elements: dqw = consumer 1's + consumer 0's
        add_to_accum();
      }
    } else {
      add_to_accum();
    }
  }

  if constexpr (SPLITS || PERSIST) mbar_arrive(&bar.kv_empty);  // the last dQ product has read K
  bwd_sm90_store_dkdv<DTYPE>(p, dk, dv, key, t, h, b);
  if constexpr (SPLITS) {
    if (warpgroup_leader()) bulk_wait<0>();  // this tile's reduce-adds are done, before the next tile's are issued
  } else if constexpr (DQ_TMA) {  // the last reduce-adds have read the staging boxes before the CTA's shared memory goes
    if (warpgroup_leader()) bulk_wait_read<0>();
  }
}

// The ping-pong consumer (VIT_CUDA_BWD_SM90=pingpong; TMA dQ with the row split at head_dim 64, the column split at
// 128): the sequential consumer's arithmetic in its order, scheduled as FlashAttention-3 schedules its forward (§3.1).
// The sequential consumers run each phase together (both issue Sᵀ and dPᵀ, both take their exponentials, both issue
// dV, dK, both wait at the dSᵀ barrier, both issue dQ), so the tensor cores idle while both compute the softmax. Here
// a step has two batches of products, [Sᵀ_i, dPᵀ_i] and [dQ_{i-1}, dV_i, dK_i], and two named barriers (TURN) make
// the consumers issue their batches in turn: 0's first, 1's first, 0's second, 1's second, ... so one consumer's
// exponentials and dQ staging run while the other's products do. Within a batch, as bwd_sm90_ordered_step: the
// exponentials under dPᵀ (all 32 at head_dim 128 behind the brkpt block boundary, 9-11 without it; 34-36 of 64 at
// 64), dQ's staging under dV and dK. dQ of step i is issued one step late, in step
// i + 1's second batch, so no consumer waits for the other's half of dSᵀ within a step: dSᵀ is double-buffered in
// shared memory, READY(i, writer) says that writer's half of step i's dSᵀ is stored, FREE(i, reader) that reader's dQ
// of step i has read it (the writer's step i + 2 may overwrite it). Each named barrier pairs 128 arriving with 128
// syncing threads, and every id is used once per two steps, so no consumer arrives twice before the other syncs
// (argued at each wait).
template <int DTYPE, int D>
__device__ __forceinline__ void bwd_sm90_consume_pp(const BwdParams &p, const typename Elem<DTYPE>::T *Ks,
                                                    const typename Elem<DTYPE>::T *Vs, const typename Elem<DTYPE>::T *Qs,
                                                    const typename Elem<DTYPE>::T *dOs, typename Elem<DTYPE>::T *dSs,
                                                    float *dQs, float *lsd, const CUtensorMap *tm_dq,
                                                    BwdSm90Barriers<BwdSm90Traits<64>::kStages> &bar, int w, int tid,
                                                    int n0, int h, int b, int m_blocks) {
  using T = typename Elem<DTYPE>::T;
  constexpr bool ROWS = D == 64;  // the row split (128 query rows a step) at 64, the column split at 128
  using Tr = BwdSm90TraitsOf<D, ROWS ? kDqRows : kDqCols>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, S = Tr::kStages, NO = D / 2, NQ = 32, kBoth = 256;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4, N = p.N;
  const int64_t bh = (int64_t)b * p.H + h;
  const float *lse = p.lse + bh * N, *delta = p.delta + bh * N;
  const float sl2 = p.softmax_scale * kLog2e;
  const T *Kw = Ks + w * 64 * 64, *Vw = Vs + w * 64 * 64;  // this warpgroup's keys in each column block
  float *dQw = dQs + w * 64 * 2 * NQ;                       // this warpgroup's dQ staging boxes
  float *lsd_w = lsd + w * 2 * BM;                          // this warpgroup's copy of a step's lse, then delta
  const int key = n0 + w * 64 + warp * 16 + g;              // this thread's first key row
  const int turn_mine = 5 + w, turn_theirs = 6 - w;         // named barriers 5, 6 (1-4: the other consumers')
  auto ready = [](int i, int writer) { return 7 + 2 * (i & 1) + writer; };  // 7-10
  auto freed = [](int i, int reader) { return 11 + 2 * (i & 1) + reader; };  // 11-14
  auto ds_buf = [dSs](int i) { return dSs + (i & 1) * BN * BM; };           // step i's dSᵀ, (BM/64, BN, 64)
  float dk[NO], dv[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) dk[i] = dv[i] = 0.f;

  auto issue_dq = [&](float (&dqw)[NQ], int i) {  // this warpgroup's 64 x 64 of step i's dQ, over all 128 keys
    bwd_sm90_issue_dq<DTYPE, D, ROWS ? kDqRows : kDqCols>(dqw, ds_buf(i), Ks, w);
  };
  auto add_dq = [&](const float (&dqw)[NQ], int i) {  // into dq_accum by TMA reduce-add from the staging boxes
    if (warpgroup_leader()) bulk_wait_read<0>();  // the previous reduce-add has read the boxes
    warpgroup_sync(w);
    const int row0 = i * BM + (ROWS ? 64 * w : 0);  // ROWS: a last step's second half may be empty
    bwd_sm90_reduce_dq(tm_dq, dQw, dqw, w, row0, ROWS ? 0 : 64 * w, row0 < N, warp, g, t);
  };

  mbar_wait(&bar.kv_full, 0);
  if (w == 1) named_barrier_arrive(turn_theirs, kBoth);  // consumer 0 issues first
  // One step; HAS_DQ (every step but the first) adds the previous step's dQ to the second batch. A run-time branch
  // around that dQ made ptxas inject warpgroup.arrive around the batch (C7519) and spill 60 bytes.
  auto step = [&](int i, auto has_dq) {
    constexpr bool HAS_DQ = decltype(has_dq)::value;
    const int st = i % S, m0 = i * BM;
    const T *Qb = Qs + st * BM * D, *dOb = dOs + st * BM * D;
    float s[BM / 2] = {}, dp[BM / 2] = {}, dqw[NQ] = {};
    uint32_t pa[BM / 16][4], sa[BM / 16][4];
    mbar_wait(&bar.qd_full[st], (i / S) & 1);
    named_barrier_sync(turn_mine, kBoth);
    bwd_sm90_issue_s_dp<DTYPE, D, BN, BM>(s, dp, Kw, Vw, Qb, dOb);
    named_barrier_arrive(turn_theirs, kBoth);
    bwd_sm90_stage_lsd<BM>(lsd_w, lse, delta, m0, tid, N);  // under the products
    warpgroup_sync(w);  // lsd_w is written (its previous reads ended before this step's barriers)
    bwd_sm90_ds_under_dp<DTYPE, D, BM>(s, dp, pa, sa, lsd_w, sl2, m0, key, N, t);
    // The other consumer arrived at FREE(i - 2) after its dQ of step i - 2 completed, in its step i - 1, after its
    // READY(i - 2) sync, which needed this consumer's READY(i - 2) arrival: so its next FREE arrival on this id
    // (step i + 1) follows this sync.
    if (i >= 2) named_barrier_sync(freed(i - 2, 1 - w), kBoth);
    bwd_sm90_store_ds(ds_buf(i) + w * 64 * 64, sa, warp, g, t);
    fence_proxy_async_shared();
    named_barrier_arrive(ready(i, w), kBoth);
    // The other consumer stored its half of step i - 1's dSᵀ before its second batch of step i - 1, which came
    // before this consumer's first batch of step i: this wait has already been met unless that store is late.
    if constexpr (HAS_DQ) named_barrier_sync(ready(i - 1, 1 - w), kBoth);
    named_barrier_sync(turn_mine, kBoth);
    fence_operands(dv);
    fence_operands(dk);
    fence_operands(pa);
    fence_operands(sa);
    fence_operands(dqw);
    wgmma_fence();
    if constexpr (HAS_DQ) {  // dQ first, as its own group: staged and added while dV and dK run
      issue_dq(dqw, i - 1);
      wgmma_commit();
    }
    bwd_sm90_issue_dkdv<DTYPE, D>(dv, dk, pa, sa, Qb, dOb);
    wgmma_commit();
    named_barrier_arrive(turn_theirs, kBoth);
    if constexpr (HAS_DQ) {
      wgmma_wait<1>();
      fence_operands(dqw);
      named_barrier_arrive(freed(i - 1, w), kBoth);  // this consumer's dQ of step i - 1 has read both halves
      add_dq(dqw, i - 1);
    }
    wgmma_wait<0>();
    fence_operands(dv);
    fence_operands(dk);
    fence_operands(pa);
    fence_operands(sa);
    mbar_arrive(&bar.qd_empty[st]);  // Q and dO of this stage are no longer read
  };
  step(0, std::false_type{});
  for (int i = 1; i < m_blocks; ++i) step(i, std::true_type{});
  {  // the last step's dQ (m_blocks >= 1: N >= 1)
    const int i = m_blocks - 1;
    float dqw[NQ] = {};
    named_barrier_sync(ready(i, 1 - w), kBoth);
    named_barrier_sync(turn_mine, kBoth);
    fence_operands(dqw);
    wgmma_fence();
    issue_dq(dqw, i);
    wgmma_commit();
    named_barrier_arrive(turn_theirs, kBoth);
    wgmma_wait<0>();
    fence_operands(dqw);
    named_barrier_arrive(freed(i, w), kBoth);
    add_dq(dqw, i);
  }
  for (int j = m_blocks >= 2 ? m_blocks - 2 : 0; j < m_blocks; ++j)  // the FREE arrivals no later store waited for
    named_barrier_sync(freed(j, 1 - w), kBoth);
  if (w == 0) named_barrier_sync(turn_mine, kBoth);  // consumer 1's last arrival

  bwd_sm90_store_dkdv<DTYPE>(p, dk, dv, key, t, h, b);
  if (warpgroup_leader()) bulk_wait_read<0>();  // the last reduce-adds have read the staging boxes
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Grid (key tiles, H, B): one 128-key tile per CTA. SPLITS (p.dq_splits = s > 0, the deterministic mode): grid
// (s, H, B), CTA j walks key tiles j, j + s, ... with dQ into dq_accum slice j (bwd_sm90_consume). PERSIST
// (VIT_CUDA_BWD_SM90=persistent): grid (p.key_ctas, H, B), the same walk with dQ into the one dq_accum, so that a
// tile's last step and dK/dV stores run while the next tile's first Q/dO stages load, and fewer CTAs start and drain
// (cuDNN's Hopper backward runs one persistent CTA an SM: benchmarks/results/h100_20261207.md). The head and batch
// stay the grid's: a walk over (key tile, head, batch) held them in registers and spilled (ptxas 13.0, 8-24 bytes).
template <int DTYPE, int D, int DQ, bool DQ_TMA, bool OVERLAP, bool SPLITS = false, bool PERSIST = false>
__global__ void __launch_bounds__(BwdSm90TraitsOf<D, DQ>::kThreads, 1)
    bwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                    const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                    const __grid_constant__ CUtensorMap tm_dq, const BwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename Elem<DTYPE>::T;
  using Tr = BwdSm90TraitsOf<D, DQ>;
  constexpr bool PP = OVERLAP && (DQ == kDqRows || DQ == kDqCols);  // OVERLAP with a split dQ: the ping-pong consumer
  using V = BwdSm90Variant<D, DQ, DQ_TMA, PP>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ BwdSm90Barriers<Tr::kStages> bar;
  T *Ks = reinterpret_cast<T *>(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));  // (D/64, BN, 64)
  T *Vs = Ks + Tr::kBlockN * D;
  T *Qs = Vs + Tr::kBlockN * D;                 // (kStages, D/64, BM, 64)
  T *dOs = Qs + Tr::kStages * Tr::kBlockM * D;
  T *dSs = dOs + Tr::kStages * Tr::kBlockM * D;  // (kDsBuffers, BM/64, BN, 64): dSᵀ, swizzled
  float *dQs = reinterpret_cast<float *>(dSs + V::kDsBuffers * Tr::kBlockN * Tr::kBlockM);  // DQ_TMA: (consumers, cols/32, 64, 32)
  float *lsd = dQs + V::kBoxFloats;  // (consumers, 2, BM)
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int n0 = blockIdx.x * Tr::kBlockN, h = blockIdx.y, b = blockIdx.z;
  // query tiles; read from the parameters after setmaxnreg in each branch: formed before it, it lived across the
  // register reallocation and was spilled (the DQ_TMA kernels at head_dim 128, ptxas 13.0)
  const auto m_blocks = [&p] { return (p.N + Tr::kBlockM - 1) / Tr::kBlockM; };
  // SPLITS (PERSIST): f(n, j) for this CTA's key tiles n = n0, n0 + s·128 (key_ctas·128), ..., j the tiles before it
  // (producer and consumers walk the same ones)
  const auto each_tile = [&p, n0](auto &&f) {
    for (int n = n0, j = 0; n < p.N; n += (PERSIST ? p.key_ctas : p.dq_splits) * Tr::kBlockN, ++j) f(n, j);
  };
  if (threadIdx.x == 0) {
    tma_prefetch_descriptor(&tm_q), tma_prefetch_descriptor(&tm_k);
    tma_prefetch_descriptor(&tm_v), tma_prefetch_descriptor(&tm_do);
    if constexpr (DQ_TMA) tma_prefetch_descriptor(&tm_dq);
    mbar_init(&bar.kv_full, 1);
    mbar_init(&bar.kv_empty, 128 * Tr::kConsumers);
    for (int s = 0; s < Tr::kStages; ++s) {
      mbar_init(&bar.qd_full[s], 1);
      mbar_init(&bar.qd_empty[s], 128 * Tr::kConsumers);
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (wg == 0) {
    setmaxnreg_dec<V::kProducerRegs>();
    if constexpr (SPLITS || PERSIST) {
      if (tid == 0)
        each_tile([&](int n, int j) {
          bwd_sm90_produce<Tr>(&tm_q, &tm_k, &tm_v, &tm_do, Ks, Vs, Qs, dOs, bar, n, h, b, m_blocks(), j);
        });
    } else if (tid == 0) {
      bwd_sm90_produce<Tr>(&tm_q, &tm_k, &tm_v, &tm_do, Ks, Vs, Qs, dOs, bar, n0, h, b, m_blocks());
    }
  } else {
    setmaxnreg_inc<V::kConsumerRegs>();
    if constexpr (PERSIST)
      each_tile([&](int n, int j) {
        bwd_sm90_consume<DTYPE, D, DQ, true, false, false, true>(p, Ks, Vs, Qs, dOs, dSs, dQs, lsd, &tm_dq, bar, wg - 1,
                                                                 tid, n, h, b, m_blocks(), j);
      });
    else if constexpr (SPLITS)
      each_tile([&](int n, int j) {
        bwd_sm90_consume<DTYPE, D, DQ, true, false, true>(p, Ks, Vs, Qs, dOs, dSs, dQs, lsd, &tm_dq, bar, wg - 1, tid,
                                                          n, h, b, m_blocks(), j);
      });
    else if constexpr (PP)
      bwd_sm90_consume_pp<DTYPE, D>(p, Ks, Vs, Qs, dOs, dSs, dQs, lsd, &tm_dq, bar, wg - 1, tid, n0, h, b, m_blocks());
    else
      bwd_sm90_consume<DTYPE, D, DQ, DQ_TMA, OVERLAP>(p, Ks, Vs, Qs, dOs, dSs, dQs, lsd, &tm_dq, bar, wg - 1, tid, n0,
                                                      h, b, m_blocks());
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for an architecture without wgmma/TMA: the host never launches this
#endif
}

template <int DTYPE, int D, int DQ, bool DQ_TMA, bool OVERLAP, bool SPLITS = false, bool PERSIST = false>
cudaError_t launch_bwd_sm90(const CUtensorMap (&tm)[5], const BwdParams &p, cudaStream_t stream, const char **what) {
  using Tr = BwdSm90TraitsOf<D, DQ>;
  constexpr int smem = BwdSm90Variant<D, DQ, DQ_TMA, OVERLAP && (DQ == kDqRows || DQ == kDqCols)>::kSmemBytes;
  // ops.sm90_dq_splits counts one CTA per SM for the slices: true while one takes over half of the 228 KiB
  static_assert(!(SPLITS || PERSIST) || 2 * smem > 228 * 1024, "dq slices, persistent CTAs: one CTA an SM");
  *what = "setting the sm90 backward's shared memory size";
  cudaError_t err = set_smem_once<bwd_sm90_kernel<DTYPE, D, DQ, DQ_TMA, OVERLAP, SPLITS, PERSIST>>(smem);
  if (err != cudaSuccess) return err;
  *what = "the sm90 backward launch";
  dim3 grid(SPLITS ? p.dq_splits : PERSIST ? p.key_ctas : (p.N + Tr::kBlockN - 1) / Tr::kBlockN, p.H, p.B);
  bwd_sm90_kernel<DTYPE, D, DQ, DQ_TMA, OVERLAP, SPLITS, PERSIST><<<grid, Tr::kThreads, smem, stream>>>(
      tm[0], tm[1], tm[2], tm[3], tm[4], p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  *what = "the backward's dq kernel";
  return run_bwd_dq<DTYPE, D>(p, stream);
}

template <int DTYPE, int D>
cudaError_t run_bwd_sm90(const BwdParams &p, cudaStream_t stream, const char **what, const BwdSm90Options &opt) {
  using Tr = BwdSm90Traits<D>;
  if (tensor_map_encoder() == nullptr) {
    *what = "cuTensorMapEncodeTiled is missing from the CUDA driver (needs a CUDA 12+ driver)";
    return cudaErrorNotSupported;
  }
  if (opt.dq_cols && D != 128) {
    *what = "the column split of dQ (head_dim 128 only)";
    return cudaErrorInvalidValue;
  }
  if (opt.overlap && D != 64 && !opt.dq_cols) {
    *what = "the overlapped consumer (head_dim 64 only; at 128 the ping-pong one needs the column-split dQ)";
    return cudaErrorInvalidValue;
  }
  if (opt.dq_cols && opt.overlap && !opt.dq_tma) {
    *what = "the ping-pong consumer (the column-split dQ with overlap) adds dQ by TMA only";
    return cudaErrorInvalidValue;
  }
  if (opt.dq_sum && D != 64) {  // (with the column split: rejected above, at head_dim 64)
    *what = "the summed dQ (head_dim 64 only)";
    return cudaErrorInvalidValue;
  }
  if (opt.dq_rows && (D != 64 || opt.dq_sum)) {
    *what = "the row-split dQ (head_dim 64 only, not with the summed dQ)";
    return cudaErrorInvalidValue;
  }
  if (opt.dq_rows && opt.overlap && !opt.dq_tma) {
    *what = "the ping-pong consumer (the row-split dQ with overlap) adds dQ by TMA only";
    return cudaErrorInvalidValue;
  }
  const bool splits = p.dq_splits > 0;  // the deterministic mode: the sequential consumer, TMA dQ split by rows (64)
  if (splits && ((D == 64 ? !opt.dq_rows : !opt.dq_cols) || !opt.dq_tma || opt.overlap)) {  // or columns (128)
    *what = "the deterministic sm90 backward (dq slices: rows-tma at head_dim 64, columns-tma at 128, sequential)";
    return cudaErrorInvalidValue;
  }
  if (opt.persistent && (splits || (D == 64 ? !opt.dq_rows : !opt.dq_cols) || !opt.dq_tma || opt.overlap ||
                         p.key_ctas < 1 || p.key_ctas > (p.N + Tr::kBlockN - 1) / Tr::kBlockN)) {
    *what = "the persistent sm90 backward (rows-tma at head_dim 64, columns-tma at 128, sequential, not deterministic; "
            "key_ctas in 1..key tiles of 128)";
    return cudaErrorInvalidValue;
  }
  if (p.dq_splits < 0 || p.dq_splits > (p.N + Tr::kBlockN - 1) / Tr::kBlockN) {
    *what = "the deterministic sm90 backward (dq_splits must be in 0..key tiles of 128)";
    return cudaErrorInvalidValue;
  }
  // the Q, dO boxes' rows: BwdSm90TraitsOf<64, kDqRows>::kBlockM (named only where it exists: D = 64)
  const int block_m = opt.dq_rows ? BwdSm90TraitsOf<64, kDqRows>::kBlockM : Tr::kBlockM;
  const int64_t rows = (int64_t)p.B * p.H * p.N;
  constexpr int RPB = 256 / (D / 8);
  *what = "the backward's delta kernel";
  bwd_delta_kernel<DTYPE, D><<<(unsigned)((rows + RPB - 1) / RPB), 256, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  CUtensorMap tm[5] = {};  // q, k, v, dout; the float32 dQ accumulator (read by the DQ_TMA kernels only)
  const bool bf16 = DTYPE == kBFloat16;
  *what = "cuTensorMapEncodeTiled (q, k, v or dout: strides must be multiples of 16 bytes)";
  if (!encode_tensor_map(&tm[0], p.q, p.q_st, p.B, p.H, p.N, D, block_m, bf16) ||
      !encode_tensor_map(&tm[1], p.k, p.k_st, p.B, p.H, p.N, D, Tr::kBlockN, bf16) ||
      !encode_tensor_map(&tm[2], p.v, p.v_st, p.B, p.H, p.N, D, Tr::kBlockN, bf16) ||
      !encode_tensor_map(&tm[3], p.dout, p.dout_st, p.B, p.H, p.N, D, block_m, bf16))
    return cudaErrorInvalidValue;
  *what = "cuTensorMapEncodeTiled (the float32 dQ accumulator)";
  const int slices = splits ? p.dq_splits : 1;  // dq_accum (slices, B, H, N, D): a map of slices·B batches
  if (opt.dq_tma && !encode_dq_tensor_map(&tm[4], p.dq_accum, slices * p.B, p.H, p.N, D)) return cudaErrorInvalidValue;
  // one kernel per (dQ mode, DQ_TMA, OVERLAP): kDqCols at head_dim 128, kDqSum, kDqRows and OVERLAP at 64
  auto pick = [&](auto dq) {
    constexpr int M = decltype(dq)::value;
    // OVERLAP kernels: at head_dim 64 the overlapped consumer, or with the row split the ping-pong one; at 128 the
    // ping-pong consumer with the column split. The ping-pong consumer adds dQ by TMA only (checked above).
    constexpr bool PP = M == kDqRows || M == kDqCols, OV = D == 64 || M == kDqCols;
    if (opt.overlap)
      return opt.dq_tma ? launch_bwd_sm90<DTYPE, D, M, true, OV>(tm, p, stream, what)
                        : launch_bwd_sm90<DTYPE, D, M, false, OV && !PP>(tm, p, stream, what);
    return opt.dq_tma ? launch_bwd_sm90<DTYPE, D, M, true, false>(tm, p, stream, what)
                      : launch_bwd_sm90<DTYPE, D, M, false, false>(tm, p, stream, what);
  };
  if (splits) return launch_bwd_sm90<DTYPE, D, D == 64 ? kDqRows : kDqCols, true, false, true>(tm, p, stream, what);
  if (opt.persistent)
    return launch_bwd_sm90<DTYPE, D, D == 64 ? kDqRows : kDqCols, true, false, false, true>(tm, p, stream, what);
  if constexpr (D == 128) {
    if (opt.dq_cols) return pick(std::integral_constant<int, kDqCols>{});
  } else {
    if (opt.dq_sum) return pick(std::integral_constant<int, kDqSum>{});
    if (opt.dq_rows) return pick(std::integral_constant<int, kDqRows>{});
  }
  return pick(std::integral_constant<int, kDqOwn>{});
}

}  // namespace vitk

#define VITK_INSTANTIATE_BWD_SM90(DTYPE, D)                                                    \
  template cudaError_t vitk::run_bwd_sm90<vitk::DTYPE, D>(const vitk::BwdParams &, cudaStream_t, \
                                                          const char **, const vitk::BwdSm90Options &);

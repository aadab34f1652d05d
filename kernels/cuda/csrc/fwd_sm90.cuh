// Hopper forward (sm_90a) after FlashAttention-3 (Shah et al., 2024, "FlashAttention-3: Fast and
// Accurate Attention with Asynchrony and Low-precision", Algorithm 1): TMA loads, wgmma from shared
// memory, a producer warpgroup and consumer warpgroups synchronised by mbarriers. Two consumer schedules:
//   sequential (fwd_sm90_consume): each consumer runs S = Q·Kᵀ, the online softmax and O += P·V in turn;
//   pingpong (fwd_sm90_consume_pp, FA-3 §3.1-3.2): two named barriers make the consumers issue their products
//     in turn, so that one's softmax runs under the other's products (ping-pong); a consumer issues
//     S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1} together and waits only for S_j before softmax(S_j), so that the
//     softmax runs under the second product (intra-warpgroup overlap). That holds in the SASS at head_dim 64
//     and 128 (test_sm90_pingpong_softmax_overlaps_pv).
//
// CTA = 3 warpgroups (384 threads), one CTA per SM:
//   warpgroup 0, producer: gives registers back (setmaxnreg 40); one thread issues TMA loads of the
//     Q tile once, then of K and V tiles into a kStages-deep ring, each stage guarded by k_full/v_full
//     (TMA completes their transaction bytes) and k_empty/v_empty (every consumer thread arrives when the
//     product that read the stage's K, or V, has finished).
//   warpgroups 1..kConsumers, consumers (setmaxnreg 232): 64 query rows each. Per key tile:
//     wait k_full -> S = Q Kᵀ (wgmma m64n128k16, both operands from shared memory, D/16 steps) ->
//     mask keys >= N, online softmax in base 2 in registers (the sm_80 kernel's arithmetic) ->
//     P to 16 bits in registers -> wait v_full -> O += P V (wgmma m64nDk16, A = P from registers,
//     B = V from shared memory, transposed by the descriptor) -> arrive k_empty and v_empty.
// Out-of-range rows and keys: TMA fills rows >= N with zeros; keys >= N are set to -inf before the
// softmax; rows >= N are never written. Outputs: out (16-bit, normalised) and lse (float32, ln).
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <algorithm>
#include "common.cuh"
#include "sm90.cuh"

namespace vitk {

// C consumer warpgroups: 2, or 3 at head_dim 64 (FlashAttention-3's head_dim-64 forward tile, 192 query rows a CTA:
// a third warpgroup's softmax or products fill the tensor pipe while the other two wait; 24/160 registers, as FA-3
// splits four warpgroups).
// BN: keys per tile, 128, or 208 in the short schedule (head_dim 64, two consumers: one tile for N <= 208).
template <int D, int C = 2, int BN = 128> struct FwdSm90Traits {
  static_assert(D == 64 || D == 128, "the sm90 forward has kernels for head_dim 64 and 128");
  static_assert(C == 2 || (C == 3 && D == 64), "three consumers: head_dim 64 only (registers)");
  static_assert(BN == 128 || (BN == 208 && D == 64 && C == 2), "208-key tiles: head_dim 64, two consumers");
  static constexpr int kConsumers = C;                 // consumer warpgroups, 64 query rows each
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kBlockM = 64 * kConsumers;      // query rows per CTA (shares each K/V tile)
  // keys per tile: S is m64n{BN} per consumer. 176 at head_dim 128 (FlashAttention-3's tile) measured about 1 %
  // faster at (8, 16, 4096, 128) and 10-14 % slower at (256, 12, 197, 128) (H100, benchmarks/results/h100_20261207e.md).
  static constexpr int kBlockN = BN;
  static constexpr int kStages = 2;                    // K/V ring depth
  static constexpr int kColBlocks = D / 64;            // 128-byte swizzle blocks per row
  static constexpr int kQBytes = kBlockM * D * 2;
  static constexpr int kTileBytes = kBlockN * D * 2;   // one K or one V stage
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kTileBytes + 1024;  // + 1024-B alignment slack
  static constexpr int kProducerRegs = C == 3 ? 24 : 40, kConsumerRegs = C == 3 ? 160 : 232;
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 65536, "register file");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

// The forward's consumer schedules (run_fwd_sm90's `schedule`, api.cpp's fwd_sm90 / _pingpong / _wide).
// kFwdWide: sequential, three consumers. kFwdShort: sequential, 208-key tiles, persistent CTAs only (head_dim 64).
enum : int { kFwdSequential = 0, kFwdPingpong = 1, kFwdWide = 2, kFwdShort = 3 };
template <int SCHEDULE> constexpr int kFwdConsumers = SCHEDULE == kFwdWide ? 3 : 2;
template <int SCHEDULE> constexpr int kFwdKeys = SCHEDULE == kFwdShort ? 208 : 128;

template <int STAGES> struct FwdSm90Barriers {
  uint64_t q_full, k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES];
  uint64_t q_empty;  // the persistent kernels' only: the consumers are done with the Q tile
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int N> __device__ __forceinline__ void fence_operands(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

// Producer of one Q tile: Q once, then K_j, V_j for every key tile j into stage (it0 + j) % kStages. `it0`: the K/V
// ring steps of the CTA's earlier Q tiles, `local` their count (unsigned: S divides 2^32, so stage and parity wrap
// consistently). PERSIST: Q is reloaded once the consumers release the previous tile's (q_empty); the first K/V stage
// goes out before that wait (the ring's own empty barriers guard it), so it loads under the previous tile's last step.
template <typename Tr, bool PERSIST = false, typename T>
__device__ __forceinline__ void fwd_sm90_produce(const CUtensorMap *tm_q, const CUtensorMap *tm_k,
                                                 const CUtensorMap *tm_v, T *Qs, T *Ks, T *Vs,
                                                 FwdSm90Barriers<Tr::kStages> &bar, int m0, int h, int b,
                                                 int n_blocks, uint32_t it0 = 0, uint32_t local = 0) {
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, D = Tr::kColBlocks * 64, S = Tr::kStages;
  auto load_kv = [&](int j) {
    const uint32_t s = (it0 + j) % S;
    const uint32_t parity = (((it0 + j) / S) & 1) ^ 1;
    T *Kb = Ks + s * BN * D, *Vb = Vs + s * BN * D;
    mbar_wait(&bar.k_empty[s], parity);
    mbar_arrive_expect_tx(&bar.k_full[s], Tr::kTileBytes);
#pragma unroll
    for (int c = 0; c < Tr::kColBlocks; ++c) tma_load_4d(Kb + c * BN * 64, tm_k, &bar.k_full[s], 64 * c, j * BN, h, b);
    mbar_wait(&bar.v_empty[s], parity);
    mbar_arrive_expect_tx(&bar.v_full[s], Tr::kTileBytes);
#pragma unroll
    for (int c = 0; c < Tr::kColBlocks; ++c) tma_load_4d(Vb + c * BN * 64, tm_v, &bar.v_full[s], 64 * c, j * BN, h, b);
  };
  if constexpr (PERSIST) {
    load_kv(0);  // n_blocks >= 1: N >= 1 here
    mbar_wait(&bar.q_empty, (local & 1) ^ 1);
  }
  mbar_arrive_expect_tx(&bar.q_full, Tr::kQBytes);
#pragma unroll
  for (int c = 0; c < Tr::kColBlocks; ++c) tma_load_4d(Qs + c * BM * 64, tm_q, &bar.q_full, 64 * c, m0, h, b);
  for (int j = PERSIST ? 1 : 0; j < n_blocks; ++j) load_kv(j);
}

// Online softmax of one S tile (64 x 128 per warpgroup; this thread: rows g, g+8 of its warp, 32
// columns each), as in fwd.cuh: mask keys >= N, update the running max (log2 units) and sum, leave P in s
// and return in `alpha` the factor O must be rescaled by (rescale_o); pack_p then packs P into the m16n8k16
// A fragments of the 8 k-steps of P·V.
template <int NO> __device__ __forceinline__ void rescale_o(float (&o)[NO], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] *= alpha[(i >> 1) & 1];
}

template <int DTYPE, int NS>
__device__ __forceinline__ void pack_p(const float (&s)[NS], uint32_t (&pa)[NS / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < NS / 8; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) pa[kk][e] = Elem<DTYPE>::pack(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
}

template <int NS>
__device__ __forceinline__ void fwd_sm90_softmax(float (&s)[NS], float (&alpha)[2], float (&row_max)[2],
                                                 float (&row_sum)[2], float sl2, int key0, int N, int t) {
  if (key0 + 2 * NS > N) {
#pragma unroll
    for (int i = 0; i < NS; ++i)
      if (key0 + 8 * (i / 4) + 2 * t + (i & 1) >= N) s[i] = -INFINITY;
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < NS; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
  float neg_m[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(row_max[r], quad_max(mx[r]) * sl2);  // finite: every tile has a key < N
    alpha[r] = exp2f(row_max[r] - m_new);
    row_max[r] = m_new;
    neg_m[r] = -m_new;
  }
  float ls[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    s[i] = exp2f(fmaf(s[i], sl2, neg_m[(i >> 1) & 1]));
    ls[(i >> 1) & 1] += s[i];
  }
  row_sum[0] = row_sum[0] * alpha[0] + ls[0];
  row_sum[1] = row_sum[1] * alpha[1] + ls[1];
}

// Epilogue of a consumer: normalise O and store it straight from the accumulators (4-byte stores), and lse;
// this thread's rows are row0 and row0 + 8 (rows >= N skipped).
template <int DTYPE, int D, int NO>
__device__ __forceinline__ void fwd_sm90_store(const FwdParams &p, const float (&o)[NO], const float (&row_max)[2],
                                               const float (&row_sum)[2], int row0, int t, int h, int b) {
  using T = typename Elem<DTYPE>::T;
  const int N = p.N;
  T *out = static_cast<T *>(p.out) + b * p.out_st.batch + h * p.out_st.head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(row_sum[r]), inv = 1.f / l;
    const int row = row0 + 8 * r;
    if (row >= N) continue;
    if (t == 0) p.lse[((int64_t)b * p.H + h) * N + row] = (row_max[r] + log2f(l)) * kLn2;
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      *reinterpret_cast<uint32_t *>(out + (int64_t)row * p.out_st.row + 8 * i + 2 * t) =
          Elem<DTYPE>::pack(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
  }
}

// S = Q Kᵀ for this warpgroup's 64 rows (Qw) and the K tile at Kb, issued and committed as one wgmma group.
template <int DTYPE, int D, int BM = FwdSm90Traits<D>::kBlockM, int NS, typename T>
__device__ __forceinline__ void issue_qk(float (&s)[NS], const T *Qw, const T *Kb) {
  constexpr int BN = 2 * NS;  // the key tile: S holds half its columns in each thread
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {  // k-step kk: 64-column block kk/4, 32 bytes per step inside it
    const int blk = kk / 4, col = (kk % 4) * 16;
    const uint64_t qd = make_desc_k(Qw + blk * BM * 64 + col), kd = make_desc_k(Kb + blk * BN * 64 + col);
    if constexpr (BN == 208) wgmma_ss_n208<DTYPE, 0, 0>(s, qd, kd, kk > 0);
    else wgmma_ss_n128<DTYPE, 0, 0>(s, qd, kd, kk > 0);
  }
  wgmma_commit();
}

// O += P V for the V tile at Vb (P from registers), issued and committed as one wgmma group.
template <int DTYPE, int D, int NO, int KS, typename T>
__device__ __forceinline__ void issue_pv(float (&o)[NO], const uint32_t (&pa)[KS][4], const T *Vb) {
  constexpr int BN = 16 * KS;  // the key tile: one k-step of 16 keys per P fragment
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {  // keys 16kk..16kk+15: two 8-row groups, 2048 bytes further on
    const uint64_t vd = make_desc_mn(Vb + kk * 16 * 64, BN * 128);
    if constexpr (D == 64) wgmma_rs_n64<DTYPE>(o, pa[kk], vd, 1);
    else wgmma_rs_n128<DTYPE>(o, pa[kk], vd, 1);
  }
  wgmma_commit();
}

// Consumer warpgroup `w` of C: rows m0 + 64w .. m0 + 64w + 63 of the Q tile; `it0`, `local`: as the producer's
// (PERSIST: release the Q tile, q_empty, once its last products are done, before the epilogue).
template <int DTYPE, int D, int C, bool PERSIST = false, int BN_ = 128>
__device__ __forceinline__ void fwd_sm90_consume(const FwdParams &p, const typename Elem<DTYPE>::T *Qs,
                                                 const typename Elem<DTYPE>::T *Ks,
                                                 const typename Elem<DTYPE>::T *Vs,
                                                 FwdSm90Barriers<FwdSm90Traits<D, C>::kStages> &bar, int w, int tid,
                                                 int m0, int h, int b, int n_blocks, uint32_t it0 = 0,
                                                 uint32_t local = 0) {
  using T = typename Elem<DTYPE>::T;
  using Tr = FwdSm90Traits<D, C, BN_>;
  constexpr int BN = Tr::kBlockN, S = Tr::kStages, NS = BN / 2, NO = D / 2;
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const T *Qw = Qs + w * 64 * 64;  // this warpgroup's rows inside every 64-column block
  const float sl2 = p.softmax_scale * kLog2e;
  float o[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  uint32_t pa[NS / 8][4];

  mbar_wait(&bar.q_full, local & 1);
  for (int j = 0; j < n_blocks; ++j) {
    const uint32_t st = (it0 + j) % S;
    const uint32_t parity = ((it0 + j) / S) & 1;
    const T *Kb = Ks + st * BN * D, *Vb = Vs + st * BN * D;
    float s[NS] = {};  // fresh each tile: kept across the loop it would stay live through P·V
    mbar_wait(&bar.k_full[st], parity);
    fence_operands(s);
    wgmma_fence();
    issue_qk<DTYPE, D, Tr::kBlockM>(s, Qw, Kb);
    wgmma_wait<0>();
    fence_operands(s);

    float alpha[2];
    fwd_sm90_softmax(s, alpha, row_max, row_sum, sl2, j * BN, p.N, t);
    rescale_o(o, alpha);
    pack_p<DTYPE>(s, pa);

    mbar_wait(&bar.v_full[st], parity);
    fence_operands(o);
    fence_operands(pa);
    wgmma_fence();
    issue_pv<DTYPE, D>(o, pa, Vb);
    wgmma_wait<0>();
    fence_operands(o);
    fence_operands(pa);
    mbar_arrive(&bar.k_empty[st]);
    mbar_arrive(&bar.v_empty[st]);
  }
  if constexpr (PERSIST) mbar_arrive(&bar.q_empty);

  fwd_sm90_store<DTYPE, D>(p, o, row_max, row_sum, m0 + w * 64 + warp * 16 + g, t, h, b);
}

// Pipelined consumer `w` (the pingpong schedule, see the top of the file): per key tile j ≥ 1,
//   wait K_j and V_{j-1}; sync named barrier 1 + w (the other consumer has issued its products);
//   issue S_j = Q K_jᵀ, then O += P_{j-1} V_{j-1}; arrive at the other consumer's barrier 2 - w;
//   wait for S_j alone (wgmma_wait<1>) -> softmax(S_j), in s, while P_{j-1} V_{j-1} runs;
//   (K_j's stage is released once S_j is done, so the producer can refill it a tile ahead)
//   wait for the product -> release V_{j-1}'s stage, rescale O by softmax(S_j)'s factor, pack P_j.
// Tile 0 issues S_0 alone, and a last round issues P_{n-1} V_{n-1} alone. Barrier accounting (n tiles): each
// consumer syncs its barrier n + 1 times and arrives at the other's n + 1 times; consumer 1 arrives at barrier 1
// once first (consumer 0 goes first) and consumer 0 syncs it once last, so both barriers end balanced.
template <int DTYPE, int D, bool PERSIST = false>
__device__ __forceinline__ void fwd_sm90_consume_pp(const FwdParams &p, const typename Elem<DTYPE>::T *Qs,
                                                    const typename Elem<DTYPE>::T *Ks,
                                                    const typename Elem<DTYPE>::T *Vs,
                                                    FwdSm90Barriers<FwdSm90Traits<D>::kStages> &bar, int w, int tid,
                                                    int m0, int h, int b, int n_blocks, uint32_t it0 = 0,
                                                    uint32_t local = 0, bool first = true, bool last = true) {
  using T = typename Elem<DTYPE>::T;
  using Tr = FwdSm90Traits<D>;
  constexpr int BN = Tr::kBlockN, S = Tr::kStages, NS = BN / 2, NO = D / 2;
  constexpr int kBoth = 128 * Tr::kConsumers;  // threads of one named barrier: both consumers
  static_assert(Tr::kConsumers == 2, "ping-pong alternates two consumer warpgroups");
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int mine = 1 + w, theirs = 2 - w;  // named barriers 1 and 2 (0 is __syncthreads')
  const T *Qw = Qs + w * 64 * 64;
  const float sl2 = p.softmax_scale * kLog2e;
  float o[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, alpha[2];
  uint32_t pa[NS / 8][4];  // P of the tile whose P·V is issued next

  // Key tile j's K/V ring stage and phase: ring step it0 + j (PERSIST: the CTA's earlier Q tiles' steps counted on,
  // unsigned as fwd_sm90_produce counts them), else j.
  auto stage = [it0](int j) -> int {
    if constexpr (PERSIST) return (int)((it0 + j) % S);
    else return j % S;
  };
  auto phase = [it0](int j) -> int {
    if constexpr (PERSIST) return (int)(((it0 + j) / S) & 1);
    else return (j / S) & 1;
  };
  mbar_wait(&bar.q_full, local & 1);
  if (w == 1 && first) named_barrier_arrive(1, kBoth);
  {
    float s[NS] = {};
    mbar_wait(&bar.k_full[stage(0)], phase(0));
    named_barrier_sync(mine, kBoth);
    fence_operands(s);
    wgmma_fence();
    issue_qk<DTYPE, D>(s, Qw, Ks + stage(0) * BN * D);
    named_barrier_arrive(theirs, kBoth);
    wgmma_wait<0>();
    fence_operands(s);
    mbar_arrive(&bar.k_empty[stage(0)]);
    fwd_sm90_softmax(s, alpha, row_max, row_sum, sl2, 0, p.N, t);  // O is 0: nothing to rescale
    pack_p<DTYPE>(s, pa);
  }
  for (int j = 1; j < n_blocks; ++j) {
    const int st = stage(j), sp = stage(j - 1);
    float s[NS] = {};
    mbar_wait(&bar.k_full[st], phase(j));
    mbar_wait(&bar.v_full[sp], phase(j - 1));
    named_barrier_sync(mine, kBoth);
    fence_operands(s);
    fence_operands(o);
    fence_operands(pa);
    wgmma_fence();
    issue_qk<DTYPE, D>(s, Qw, Ks + st * BN * D);
    issue_pv<DTYPE, D>(o, pa, Vs + sp * BN * D);
    named_barrier_arrive(theirs, kBoth);
    wgmma_wait<1>();  // S_j is done; P_{j-1} V_{j-1} may still run, and reads pa and writes o
    fence_operands(s);
    mbar_arrive(&bar.k_empty[st]);
    fwd_sm90_softmax(s, alpha, row_max, row_sum, sl2, j * BN, p.N, t);
    // A block boundary (a branch never taken: N > 0) keeps ptxas 13.0 from hoisting the next wait above the softmax:
    // in the SASS all 66 MUFU.EX2 then run under P·V, at D = 64 and 128, without spills. PERSIST: ptxas moved 65 of
    // the 66 past a branch on N; one on the row sums (never negative, NaN compares false) comes after all of them.
    // brkpt, not trap: both are BPT.TRAP in the SASS, but with trap (which ptxas placed after the EXIT) ptxas
    // serialised every wgmma at D = 128 (C7512; 200 B of spills, 284 persistent, at 232 or 240 registers), and with
    // exit it added a wait for P·V on that path (C7517).
    if (PERSIST ? row_sum[0] + row_sum[1] < 0.f : p.N < 0) asm volatile("brkpt;");
    wgmma_wait<0>();
    fence_operands(o);
    fence_operands(pa);
    mbar_arrive(&bar.v_empty[sp]);
    rescale_o(o, alpha);
    pack_p<DTYPE>(s, pa);  // after the product: packing while it ran serialised every wgmma (ptxas C7513)
  }
  {
    const int sp = stage(n_blocks - 1);
    mbar_wait(&bar.v_full[sp], phase(n_blocks - 1));
    named_barrier_sync(mine, kBoth);
    fence_operands(o);
    fence_operands(pa);
    wgmma_fence();
    issue_pv<DTYPE, D>(o, pa, Vs + sp * BN * D);
    named_barrier_arrive(theirs, kBoth);
    wgmma_wait<0>();
    fence_operands(o);
    fence_operands(pa);
    mbar_arrive(&bar.v_empty[sp]);
  }
  if constexpr (PERSIST) mbar_arrive(&bar.q_empty);
  if (w == 0 && last) named_barrier_sync(1, kBoth);
  fwd_sm90_store<DTYPE, D>(p, o, row_max, row_sum, m0 + w * 64 + warp * 16 + g, t, h, b);
}

// Persistent CTAs (PERSIST, the two sequential consumers): gridDim.x CTAs, CTA c runs Q tiles c, c + gridDim.x, ...
// in the order of the one-CTA-a-tile grid (m blocks fastest, then heads, then batches), so that the CTAs at work at
// once share heads' K/V in L2, and each tile's epilogue runs while the producer loads the next tile's Q, K and V
// (cuDNN's Hopper kernels run one persistent CTA an SM: benchmarks/results/h100_20261207.md).
// PRODUCER: the producer thread's loop, else consumer warpgroup w's; called apart, each after its setmaxnreg (a loop
// that branches on the warpgroup inside makes ptxas ignore setmaxnreg: C7507).
template <typename Tr, int DTYPE, int D, int C, int SCHEDULE, bool PRODUCER, typename T>
__device__ __forceinline__ void fwd_sm90_persist(const CUtensorMap *tm_q, const CUtensorMap *tm_k,
                                                 const CUtensorMap *tm_v, const FwdParams &p, T *Qs, T *Ks, T *Vs,
                                                 FwdSm90Barriers<Tr::kStages> &bar, int w, int tid, int n_blocks) {
  const int m_blocks = (p.N + Tr::kBlockM - 1) / Tr::kBlockM, tiles = m_blocks * p.H * p.B;  // <= 2^30: the launcher
  uint32_t it = 0, local = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, it += n_blocks, ++local) {
    const int m0 = tile % m_blocks * Tr::kBlockM, h = tile / m_blocks % p.H, b = tile / m_blocks / p.H;
    if constexpr (PRODUCER)
      fwd_sm90_produce<Tr, true>(tm_q, tm_k, tm_v, Qs, Ks, Vs, bar, m0, h, b, n_blocks, it, local);
    else if constexpr (SCHEDULE == kFwdPingpong)  // the turns run on across tiles: first / last balance them
      fwd_sm90_consume_pp<DTYPE, D, true>(p, Qs, Ks, Vs, bar, w, tid, m0, h, b, n_blocks, it, local, local == 0,
                                          tile + (int)gridDim.x >= tiles);
    else fwd_sm90_consume<DTYPE, D, C, true, Tr::kBlockN>(p, Qs, Ks, Vs, bar, w, tid, m0, h, b, n_blocks, it, local);
  }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int DTYPE, int D, int SCHEDULE, int C = kFwdConsumers<SCHEDULE>, bool PERSIST = false>
__global__ void __launch_bounds__(FwdSm90Traits<D, C>::kThreads, 1)
    fwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                    const __grid_constant__ CUtensorMap tm_v, const FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename Elem<DTYPE>::T;
  using Tr = FwdSm90Traits<D, C, kFwdKeys<SCHEDULE>>;
  extern __shared__ unsigned char smem_raw[];
  __shared__ FwdSm90Barriers<Tr::kStages> bar;
  // 128B-swizzled TMA tiles must start on 1024-byte boundaries of the shared window.
  T *Qs = reinterpret_cast<T *>(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));  // (D/64, BM, 64)
  T *Ks = Qs + Tr::kBlockM * D;             // (kStages, D/64, BN, 64)
  T *Vs = Ks + Tr::kStages * Tr::kBlockN * D;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int m0 = blockIdx.x * Tr::kBlockM, h = blockIdx.y, b = blockIdx.z;
  const int n_blocks = (p.N + Tr::kBlockN - 1) / Tr::kBlockN;
  if (threadIdx.x == 0) {
    tma_prefetch_descriptor(&tm_q), tma_prefetch_descriptor(&tm_k), tma_prefetch_descriptor(&tm_v);
    mbar_init(&bar.q_full, 1);
    for (int s = 0; s < Tr::kStages; ++s) {
      mbar_init(&bar.k_full[s], 1);
      mbar_init(&bar.v_full[s], 1);
      mbar_init(&bar.k_empty[s], 128 * Tr::kConsumers);
      mbar_init(&bar.v_empty[s], 128 * Tr::kConsumers);
    }
    if constexpr (PERSIST) mbar_init(&bar.q_empty, 128 * Tr::kConsumers);
    mbar_fence_init();
  }
  __syncthreads();
  static_assert(!PERSIST || SCHEDULE != kFwdWide, "persistent CTAs: two consumers, sequential or ping-pong");
  static_assert(PERSIST || SCHEDULE != kFwdShort, "the short schedule: persistent CTAs only");
  if constexpr (PERSIST) {
    if (wg == 0) {
      setmaxnreg_dec<Tr::kProducerRegs>();
      if (tid == 0)
        fwd_sm90_persist<Tr, DTYPE, D, C, SCHEDULE, true>(&tm_q, &tm_k, &tm_v, p, Qs, Ks, Vs, bar, 0, tid, n_blocks);
    } else {
      setmaxnreg_inc<Tr::kConsumerRegs>();
      fwd_sm90_persist<Tr, DTYPE, D, C, SCHEDULE, false>(&tm_q, &tm_k, &tm_v, p, Qs, Ks, Vs, bar, wg - 1, tid,
                                                         n_blocks);
    }
  } else if (wg == 0) {
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0) fwd_sm90_produce<Tr>(&tm_q, &tm_k, &tm_v, Qs, Ks, Vs, bar, m0, h, b, n_blocks);
  } else {
    setmaxnreg_inc<Tr::kConsumerRegs>();
    if constexpr (SCHEDULE == kFwdPingpong)
      fwd_sm90_consume_pp<DTYPE, D>(p, Qs, Ks, Vs, bar, wg - 1, tid, m0, h, b, n_blocks);
    else fwd_sm90_consume<DTYPE, D, C, false, Tr::kBlockN>(p, Qs, Ks, Vs, bar, wg - 1, tid, m0, h, b, n_blocks);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for an architecture without wgmma/TMA: the host never launches this
#endif
}

// cuTensorMapEncodeTiled from the driver, found at run time (no -lcuda at link time).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *ptr = nullptr;
    cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &ptr, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) ptr = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// 4-D map (head_dim, N, H, B) of a (B, H, N, head_dim) tensor; boxes of 64 columns x `rows` rows,
// 128-byte swizzle, zero fill past N. Strides in bytes must be multiples of 16 (api.cpp's tma_ready
// ensures it); a size-1 dimension's stride is never used and may be anything in torch, so it is 16 here.
inline bool encode_tensor_map(CUtensorMap *map, const void *ptr, const Strides &st, int B, int H, int N, int D,
                              int rows, bool bf16) {
  auto bytes = [](int64_t stride, int size) { return static_cast<cuuint64_t>(size > 1 ? stride * 2 : 16); };
  const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)N, (cuuint64_t)H, (cuuint64_t)B};
  const cuuint64_t strides[3] = {bytes(st.row, N), bytes(st.head, H), bytes(st.batch, B)};
  const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1}, unit[4] = {1, 1, 1, 1};
  return tensor_map_encoder()(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                              const_cast<void *>(ptr), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The backward's float32 dQ accumulator, a contiguous (B, H, N, D): boxes of 64 rows x 32 columns (128 B, the
// widest row SWIZZLE_128B allows), for TMA reduce-add from 128B-swizzled shared memory.
inline bool encode_dq_tensor_map(CUtensorMap *map, float *ptr, int B, int H, int N, int D) {
  const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)N, (cuuint64_t)H, (cuuint64_t)B};
  const cuuint64_t row = (cuuint64_t)D * 4, strides[3] = {row, row * N, row * N * H};
  const cuuint32_t box[4] = {32, 64, 1, 1}, unit[4] = {1, 1, 1, 1};
  return tensor_map_encoder()(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, ptr, dims, strides, box, unit,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Streaming multiprocessors of the current device into *count (read once per device), or the query's error.
inline cudaError_t sm_count(int *count) {
  static int counts[64] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < 0 || dev >= 64) return cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, dev);
  if (counts[dev] == 0) err = cudaDeviceGetAttribute(&counts[dev], cudaDevAttrMultiProcessorCount, dev);
  *count = counts[dev];
  return err;
}

template <int DTYPE, int D, int SCHEDULE, bool PERSIST = false>
cudaError_t launch_fwd_sm90(const FwdParams &p, cudaStream_t stream, const char **what) {
  constexpr int C = kFwdConsumers<SCHEDULE>;
  using Tr = FwdSm90Traits<D, C, kFwdKeys<SCHEDULE>>;
  CUtensorMap tm_q, tm_k, tm_v;
  const bool bf16 = DTYPE == kBFloat16;
  *what = "cuTensorMapEncodeTiled (q, k or v: strides must be multiples of 16 bytes)";
  if (!encode_tensor_map(&tm_q, p.q, p.q_st, p.B, p.H, p.N, D, Tr::kBlockM, bf16) ||
      !encode_tensor_map(&tm_k, p.k, p.k_st, p.B, p.H, p.N, D, Tr::kBlockN, bf16) ||
      !encode_tensor_map(&tm_v, p.v, p.v_st, p.B, p.H, p.N, D, Tr::kBlockN, bf16))
    return cudaErrorInvalidValue;
  *what = "setting the sm90 forward's shared memory size";
  cudaError_t err = set_smem_once<fwd_sm90_kernel<DTYPE, D, SCHEDULE, C, PERSIST>>(Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  *what = "the sm90 forward launch";
  const int m_blocks = (p.N + Tr::kBlockM - 1) / Tr::kBlockM;
  dim3 grid(m_blocks, p.H, p.B);
  if constexpr (PERSIST) {
    const int64_t tiles = (int64_t)m_blocks * p.H * p.B;
    *what = "the persistent sm90 forward (at most 2^30 Q tiles of B x H x N)";
    if (tiles > (1 << 30)) return cudaErrorInvalidValue;  // tile + gridDim.x stays below 2^31
    int sms = 0;
    *what = "reading the GPU's SM count (the persistent sm90 forward's grid)";
    if ((err = sm_count(&sms)) != cudaSuccess) return err;
    grid = dim3((unsigned)std::min<int64_t>(tiles, sms));
    *what = "the sm90 forward launch";
  }
  fwd_sm90_kernel<DTYPE, D, SCHEDULE, C, PERSIST><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(tm_q, tm_k, tm_v, p);
  return cudaGetLastError();
}

// `schedule`: kFwdSequential, kFwdPingpong or kFwdWide (head_dim 64 only; an error at 128); `persistent`: one CTA an
// SM looping over the Q tiles (kFwdSequential or kFwdPingpong; an error with kFwdWide: with three consumers, capped at
// 128 registers by its 512 threads, ptxas 13.0 spilled 24-68 bytes in the key loop).
template <int DTYPE, int D>
cudaError_t run_fwd_sm90(const FwdParams &p, cudaStream_t stream, const char **what, int schedule, bool persistent) {
  if (tensor_map_encoder() == nullptr) {
    *what = "cuTensorMapEncodeTiled is missing from the CUDA driver (needs a CUDA 12+ driver)";
    return cudaErrorNotSupported;
  }
  if (schedule == kFwdPingpong)
    return persistent ? launch_fwd_sm90<DTYPE, D, kFwdPingpong, true>(p, stream, what)
                      : launch_fwd_sm90<DTYPE, D, kFwdPingpong>(p, stream, what);
  if (schedule == kFwdSequential)
    return persistent ? launch_fwd_sm90<DTYPE, D, kFwdSequential, true>(p, stream, what)
                      : launch_fwd_sm90<DTYPE, D, kFwdSequential>(p, stream, what);
  if constexpr (D == 64) {
    if (schedule == kFwdWide && !persistent) return launch_fwd_sm90<DTYPE, D, kFwdWide>(p, stream, what);
    if (schedule == kFwdShort && persistent) return launch_fwd_sm90<DTYPE, D, kFwdShort, true>(p, stream, what);
  }
  *what = "this sm90 forward schedule (wide: head_dim 64 only; short: head_dim 64, persistent; persistent: "
          "sequential, pingpong or short)";
  return cudaErrorInvalidValue;
}

}  // namespace vitk

#define VITK_INSTANTIATE_FWD_SM90(DTYPE, D)                                                    \
  template cudaError_t vitk::run_fwd_sm90<vitk::DTYPE, D>(const vitk::FwdParams &, cudaStream_t, \
                                                          const char **, int, bool);

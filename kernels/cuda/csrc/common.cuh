// Device helpers: cp.async, ldmatrix and mma.sync m16n8k16 (PTX ISA, "Warp-level matrix
// instructions"), and the element types. Fragment layouts for m16n8k16 with lane = 4*g + t:
//   A (16x16, row):  a0a1 = (g, 2t..2t+1)   a2a3 = (g+8, 2t..)   a4a5 = (g, 8+2t..)   a6a7 = (g+8, 8+2t..)
//   B (16x8,  col):  b0b1 = (k=2t..2t+1, n=g)                    b2b3 = (k=8+2t.., n=g)
//   C (16x8,  f32):  c0c1 = (g, 2t..2t+1)   c2c3 = (g+8, 2t..2t+1)
// so an accumulator pair of n-tiles is already the A fragment of the next product (FA-2's P·V trick).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <atomic>
#include <cstdint>
#include "params.h"

namespace vitk {

template <int DTYPE> struct Elem;
template <> struct Elem<kFloat16> {
  using T = __half;
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
  }
  static __device__ __forceinline__ float to_float(T x) { return __half2float(x); }
};
template <> struct Elem<kBFloat16> {
  using T = __nv_bfloat16;
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
  }
  static __device__ __forceinline__ float to_float(T x) { return __bfloat162float(x); }
};

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy; pred=false writes zeros (src-size 0) and reads nothing.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(pred ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c += a (16x16) * b (16x8), fp32 accumulate.
template <int DTYPE>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (DTYPE == kBFloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Lane offsets for ldmatrix.x4 (row, col) inside a 16x16 block, by what the four 8x8 matrices feed:
// A operand stored row-major [m][k]:            row = lane%16,                 col = (lane/16)*8
// B operand stored [n][k] (non-trans, 2 n-tiles): row = lane%8 + (lane/16)*8,   col = ((lane/8)%2)*8
// B operand stored [k][n] (trans, 2 n-tiles):     row = lane%8 + ((lane/8)%2)*8, col = (lane/16)*8
// A operand stored [k][m] (trans):               row = lane%8 + (lane/16)*8,   col = ((lane/8)%2)*8
__device__ __forceinline__ int a_row(int lane) { return lane % 16; }
__device__ __forceinline__ int a_col(int lane) { return (lane / 16) * 8; }
__device__ __forceinline__ int bn_row(int lane) { return lane % 8 + (lane / 16) * 8; }
__device__ __forceinline__ int bn_col(int lane) { return ((lane / 8) % 2) * 8; }
__device__ __forceinline__ int bt_row(int lane) { return lane % 8 + ((lane / 8) % 2) * 8; }
__device__ __forceinline__ int bt_col(int lane) { return (lane / 16) * 8; }

// Copy ROWS x D elements (rows row0.. of a tensor with row stride `stride`) into shared memory with
// row pitch SROW; rows >= N are zero-filled. Every thread of the CTA takes part.
template <typename T, int ROWS, int D, int SROW, int NTHREADS>
__device__ __forceinline__ void load_tile(T *s, const T *g, int64_t stride, int row0, int N) {
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  static_assert((ROWS * CPR) % NTHREADS == 0, "tile must split evenly over the CTA");
#pragma unroll
  for (int it = 0; it < ROWS * CPR / NTHREADS; ++it) {
    const int i = it * NTHREADS + threadIdx.x;
    const int r = i / CPR, c = (i % CPR) * 8;
    const bool ok = row0 + r < N;
    cp_async16(s + r * SROW + c, g + (ok ? (int64_t)(row0 + r) * stride : 0) + c, ok);
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// cudaFuncSetAttribute(Kernel, MaxDynamicSharedMemorySize, bytes) once per kernel and device (the attribute stays
// set): each call cost about 3 us of host CPU (H200 host, torch.profiler, benchmarks.launch_overhead --profile).
template <auto Kernel> cudaError_t set_smem_once(int bytes) {
  static std::atomic<uint64_t> done{0};  // bit i: set on device i (< 64; others set it every call)
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit & done.load(std::memory_order_relaxed)) return cudaSuccess;
  err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) done.fetch_or(bit, std::memory_order_relaxed);
  return err;
}

}  // namespace vitk

// Device helpers shared by the CUDA kernels: state row addressing, PTX wrappers for cp.async,
// ldmatrix and mma.sync m16n8k16, and the swizzled shared-memory tile layout. The state
// arithmetic (merge weights, online softmax, lse) is core/state.hpp, shared with the CPU.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/params.hpp"

namespace ringattn::cuda {

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

__device__ __forceinline__ float* state_o_row(const StateView& s, int64_t b, int64_t h, int64_t t) {
  return s.o + b * s.o_stride_b + h * s.o_stride_h + t * s.o_stride_t;
}
__device__ __forceinline__ float* state_lse_at(const StateView& s, int64_t b, int64_t h, int64_t t) {
  return s.lse + b * s.lse_stride_b + h * s.lse_stride_h + t;
}
__device__ __forceinline__ int64_t view_offset(const TensorView& v, int64_t b, int64_t h, int64_t t) {
  return b * v.stride_b + h * v.stride_h + t * v.stride_t;
}

// ---- Programmatic dependent launch (compute capability 9.0+) ----
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled
// before the kernel ahead of it in the stream has finished. It must call pdl_wait_for_prior_grid
// before touching memory that kernel writes: the wait returns once that kernel has completed and
// its writes are visible (at once when the launch was an ordinary one). The PTX exists only from
// sm_90; on older GPUs the launch attribute is not set (merge.cu) and these compile to nothing.
__device__ __forceinline__ void pdl_wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}
// Lets the dependent kernel be scheduled once every CTA of this grid has called it or exited: a
// hint for early scheduling only, it orders no memory (the dependent's wait does).
__device__ __forceinline__ void pdl_allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// ---- 16-bit element types on tensor cores ----

template <typename T>
struct Half16;
template <>
struct Half16<__nv_bfloat16> {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  // c += a * b, m16n8k16, fp32 accumulators.
  __device__ __forceinline__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct Half16<__half> {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  __device__ __forceinline__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// ---- asynchronous copies and matrix loads ----

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1. When !valid nothing is read and the 16 bytes are
// zero-filled: rows past the end of a tensor become zeros, never stale values (a stale NaN
// times a zero probability would still be NaN).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Shared-memory byte addresses as 32-bit values, so that the unrolled loops below fold their
// constant offsets into the instruction instead of holding a 64-bit pointer per fragment.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem))
               : "memory");
}

// Reductions over the 4 lanes of a quad (lanes 4g..4g+3), which share the rows of an mma/wgmma
// accumulator fragment.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// fast_exp2 as a function object, for the state helpers (core/state.hpp) in log2 units.
struct FastExp2 {
  __device__ __forceinline__ float operator()(float x) const { return fast_exp2(x); }
};

// A tile of `rows` x D 16-bit values in shared memory, rows of D * 2 bytes cut into 16-byte
// chunks. Chunk c of row r is stored at chunk c ^ (r & 7): the 8 row addresses that one
// ldmatrix phase reads (8 rows, same logical chunk) then fall in 8 different bank groups
// instead of one, for D = 64, 128 and 256 (128-, 256- and 512-byte rows).
template <int D>
struct SwizzledTile {
  static constexpr int kChunks = D / 8;
  __device__ __forceinline__ static int offset(int row, int chunk) {
    return row * D + ((chunk ^ (row & 7)) << 3);
  }
  // ldmatrix.x4 over a 16 x 16 block: lane supplies row base + lane_row (lane_row & 7 ==
  // lane & 7 for every block, since blocks start at multiples of 8) and chunk 2 * kk + lane_chunk.
  // As kk runs over 0..D/16-1, (2 kk + lane_chunk) ^ (lane & 7) takes only four distinct low-bit
  // patterns plus a constant multiple of 8 chunks: lane_offsets returns those four byte offsets,
  // and fragment_offset adds the constant part.
  __device__ __forceinline__ static void lane_offsets(uint32_t (&off)[4], int lane_row, int lane_chunk, int lane) {
#pragma unroll
    for (int c = 0; c < 4; ++c) off[c] = uint32_t(lane_row * D + (((c * 2 + lane_chunk) ^ (lane & 7)) << 3)) * 2u;
  }
  // Byte offset of the fragment at block row `row16` (a multiple of 16) and k-step kk.
  __device__ __forceinline__ static uint32_t fragment_offset(const uint32_t (&off)[4], int row16, int kk) {
    return uint32_t(row16 * D * 2 + (kk >> 2) * 128) + off[kk & 3];
  }
};

// Copies rows [row0, row0 + ROWS) of one (b, h) of `x` into a swizzled tile with all threads of
// the CTA; rows at or past `len` are zero-filled. A thread always copies the same chunk column
// (THREADS is a multiple of the chunks per row) of rows kRowStep apart; with kRowStep a multiple
// of 8 its swizzled destination moves by a constant, so one source pointer and one predicate per
// copy are all it keeps live. With kRowStep = 4 (D = 256 on 128 threads: 32 chunks a row, r0 < 4)
// the rows' swizzle (row & 7) alternates between r0 and r0 + 4: two destination bases.
template <int D, int ROWS, int THREADS, typename T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* base, int64_t stride_t, int64_t row0, int64_t len,
                                                int tid) {
  constexpr int kChunks = D / 8;
  constexpr int kRowStep = THREADS / kChunks;
  static_assert(THREADS % kChunks == 0 && ROWS % kRowStep == 0, "every thread copies the same number of chunks");
  static_assert(kRowStep % 8 == 0 || kRowStep == 4, "the swizzle pattern must repeat every one or two of a thread's rows");
  constexpr bool kAlternates = kRowStep % 8 != 0;
  const int r0 = tid / kChunks, c = tid % kChunks;
  T* dst = tile + SwizzledTile<D>::offset(r0, c);
  // The base of the odd iterations, shifted back by one step (only used when kAlternates).
  T* dst_odd = tile + SwizzledTile<D>::offset(r0 + kRowStep, c) - kRowStep * D;
  const T* src = base + (row0 + r0) * stride_t + c * 8;
  const int64_t rows_left = len - row0 - r0;  // this thread's rows it with it * kRowStep < rows_left exist
#pragma unroll
  for (int it = 0; it < ROWS / kRowStep; ++it) {
    const bool valid = it * kRowStep < rows_left;
    T* d = (kAlternates && (it & 1)) ? dst_odd : dst;
    cp_async_16(d + it * kRowStep * D, valid ? src + it * kRowStep * stride_t : base, valid);
  }
}

}  // namespace ringattn::cuda

/* The C ABI of ringattn's attention op (ARCHITECTURE.md, "The C ABI and the Python package"):
 * forward and backward of one attention call over tensors described as DLPack describes them,
 * for hosts that are not C++ (Python through ctypes, and any other FFI). Nothing here throws:
 * every function returns a status and, on failure, writes one line of text naming the argument,
 * its value and what is allowed into the caller's buffer.
 *
 * Layouts (FlashAttention's): q [batch, q_len, q_heads, dim], k and v [batch, kv_len, kv_heads,
 * dim], out like q, lse fp32 [batch, q_heads, q_len]. With cu_seqlens (packed documents,
 * self-attention): q, k, v and out [total_tokens, heads, dim], lse [q_heads, total_tokens].
 * Any strides in elements (the head dim's must be 1; lse's token axis too). The backward writes
 * dq, dk, dv in the inputs' dtype, dk and dv summed over each query-head group (GQA). */
#ifndef RINGATTN_C_H
#define RINGATTN_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(RINGATTN_C_BUILDING)
#define RINGATTN_C_API __attribute__((visibility("default")))
#else
#define RINGATTN_C_API
#endif

/* Bumped when a struct below changes; callers put it into ringattn_attention_args.abi_version. */
#define RINGATTN_C_ABI_VERSION 1

/* Status codes. */
#define RINGATTN_OK 0
#define RINGATTN_INVALID_ARGUMENT 1 /* bad input: nothing was computed or written */
#define RINGATTN_RUNTIME_ERROR 2    /* a failure while running (allocation, device) */

/* DLPack's DLDevice, DLDataType and DLTensor, field for field (so a DLTensor* may be passed). */
typedef struct {
  int32_t device_type; /* 1: CPU (kDLCPU), 2: CUDA (kDLCUDA) */
  int32_t device_id;
} ringattn_device;

typedef struct {
  uint8_t code; /* 2: float (kDLFloat), 4: bfloat (kDLBfloat), 0: int (kDLInt) */
  uint8_t bits;
  uint16_t lanes; /* 1 */
} ringattn_dtype;

typedef struct {
  void* data;
  ringattn_device device;
  int32_t ndim;
  ringattn_dtype dtype;
  const int64_t* shape;
  const int64_t* strides; /* in elements; NULL: compact row-major */
  uint64_t byte_offset;
} ringattn_tensor;

/* Scratch memory (the fp32 state of the forward, the fp32 gradients of the backward, the
 * backward's per-row terms) from the caller's allocator, on the call's device, ordered on the
 * call's stream: deallocate may come before the queued work that uses the memory has run (as
 * torch's caching allocator and cudaFreeAsync allow). NULL in the args: for CUDA tensors the
 * driver's stream-ordered pool (cudaMallocAsync on the stream), for CPU tensors the heap. */
typedef struct {
  void* ctx;
  void* (*allocate)(void* ctx, size_t bytes, void* stream); /* NULL on failure */
  void (*deallocate)(void* ctx, void* ptr, size_t bytes, void* stream);
} ringattn_allocator;

typedef struct {
  int32_t abi_version;         /* RINGATTN_C_ABI_VERSION */
  int32_t causal;              /* 0 or 1 */
  int64_t window_left;         /* FlashAttention's window_size: -1 unbounded, else >= 0 tokens */
  int64_t window_right;        /* with causal: 0 or -1 */
  int32_t has_softmax_scale;   /* 0: 1/sqrt(dim) */
  double softmax_scale;
  const ringattn_tensor* cu_seqlens; /* NULL: batched; else int32/int64 [docs + 1] in host memory */
  int64_t max_seqlen;          /* with cu_seqlens: 0 (not given) or >= the longest document */
  int32_t deterministic;       /* bitwise reproducible gradients (the CPU engine always is) */
  void* stream;                /* CUDA tensors: the cudaStream_t to queue on (NULL: the legacy default
                                  stream); a call returns once its work is queued, with no host
                                  synchronization, and leaves the calling thread's current device as
                                  it found it */
  const ringattn_allocator* allocator;
} ringattn_attention_args;

/* The ABI version this library was built with. */
RINGATTN_C_API int32_t ringattn_c_abi_version(void);

/* out := attention(q, k, v), lse := its log-sum-exp (natural log, scale included; -inf for a
 * row that sees no key, whose out is 0). */
RINGATTN_C_API int32_t ringattn_attention_fwd(const ringattn_attention_args* args, const ringattn_tensor* q,
                                              const ringattn_tensor* k, const ringattn_tensor* v,
                                              const ringattn_tensor* out, const ringattn_tensor* lse, char* error,
                                              size_t error_size);

/* dq, dk, dv of sum(dout * out) for the forward above (out and lse as it returned them). */
RINGATTN_C_API int32_t ringattn_attention_bwd(const ringattn_attention_args* args, const ringattn_tensor* dout,
                                              const ringattn_tensor* q, const ringattn_tensor* k,
                                              const ringattn_tensor* v, const ringattn_tensor* out,
                                              const ringattn_tensor* lse, const ringattn_tensor* dq,
                                              const ringattn_tensor* dk, const ringattn_tensor* dv, char* error,
                                              size_t error_size);

#ifdef __cplusplus
}
#endif

#endif /* RINGATTN_C_H */

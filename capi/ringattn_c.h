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
#define RINGATTN_C_ABI_VERSION 3

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

/* What this library was built with: RINGATTN_FEATURE_* bits. */
#define RINGATTN_FEATURE_CUDA 1 /* CUDA tensors */
#define RINGATTN_FEATURE_NCCL 2 /* ringattn_nccl_create (NCCL communicators of its own) */
RINGATTN_C_API int32_t ringattn_c_features(void);

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

/* ---- Ring attention over the caller's communicator ------------------------------------------
 * Each rank of a communicator the caller already runs (torch.distributed's process group under
 * torchrun) holds a shard of every sequence, the rows of one layout (ringattn_shard_positions),
 * and calls ringattn_ring_fwd / ringattn_ring_bwd with its local tensors: the same layouts as
 * above with the local tokens in place of seq_len (packed: [local_tokens, heads, dim] and the
 * global cu_seqlens in args), lse compact fp32 [batch, q_heads, local_tokens] ([q_heads,
 * local_tokens] packed). The ranks' local checks are agreed before any exchange: when a rank
 * refuses its call, every rank returns RINGATTN_INVALID_ARGUMENT with the same text, "ranks
 * stopped before the first hop: rank R: ...", and a rank that passes another shape, mask, scale,
 * dtype, document list or layout is named the same way. CPU or CUDA tensors: the exchanges move
 * host memory (a CUDA tensor's blocks staged through it), or GPU memory over ring.nccl. */

/* The caller's communicator; every function returns 0, or writes one line into error and returns
 * non-zero. post sends send_bytes from send to rank `to` and receives recv_bytes from rank `from`
 * into recv (a side of 0 bytes posts nothing) and returns without waiting; wait completes the
 * channel's posted exchange, bounded by the caller's timeout. Messages of one channel (0: K/V,
 * 1: the backward's dK/dV) must never match another's. allgather: recv[r * n, (r + 1) * n) :=
 * rank r's send. size 1 needs no functions. */
typedef struct {
  void* ctx;
  int32_t rank;
  int32_t size;
  int32_t (*post)(void* ctx, int32_t channel, int32_t to, const void* send, size_t send_bytes, int32_t from,
                  void* recv, size_t recv_bytes, char* error, size_t error_size);
  int32_t (*wait)(void* ctx, int32_t channel, char* error, size_t error_size);
  int32_t (*allgather)(void* ctx, const void* send, void* recv, size_t bytes_per_rank, char* error,
                       size_t error_size);
} ringattn_communicator;

/* How the global sequence is split over the ranks (the CLI's --shard). */
#define RINGATTN_LAYOUT_AUTO (-1) /* the best balanced for the mask and documents (the CLI's rule) */
#define RINGATTN_LAYOUT_CONTIGUOUS 0
#define RINGATTN_LAYOUT_ZIGZAG 1
#define RINGATTN_LAYOUT_STRIPED 2
#define RINGATTN_LAYOUT_DOC_ZIGZAG 3

/* An NCCL communicator of ringattn's own over the ranks of a ringattn_communicator, for ring calls
 * on CUDA tensors: K/V blocks and dK/dV accumulators then move GPU to GPU (ncclSend/ncclRecv on a
 * stream of its own, ordered after the call's stream by events) instead of through host memory;
 * the ranks' agreement and the other host collectives still go over the call's communicator. */
typedef struct ringattn_nccl ringattn_nccl;

typedef struct {
  int32_t layout;                    /* RINGATTN_LAYOUT_* */
  const ringattn_communicator* comm; /* required */
  const char* caller_error;          /* non-NULL: this rank's own refusal of the call, raised on every
                                        rank like the library's (nothing else of the call is read) */
  ringattn_nccl* nccl;               /* NULL: exchanges over comm (CUDA tensors staged through host
                                        memory); else made by ringattn_nccl_create over the same ranks
                                        on the tensors' device, passed by every rank or by none */
} ringattn_ring_args;

/* Makes *out, an NCCL communicator of comm's ranks on CUDA device `device` (collective over comm:
 * rank 0's unique id reaches the others by comm->allgather). Every rank's checks (NCCL built in,
 * the device exists, no two ranks on one GPU, which NCCL cannot run) are agreed first, so a refusal
 * is returned by every rank with the same text, "ranks stopped before the first hop: rank R: ...".
 * timeout_s bounds every wait of its exchanges (> 0; the first exchange, which pays the
 * connections, and the set-up wait three times as long). One ring call at a time may use it. */
RINGATTN_C_API int32_t ringattn_nccl_create(const ringattn_communicator* comm, int32_t device, double timeout_s,
                                            ringattn_nccl** out, char* error, size_t error_size);

/* Ends the communicator (bounded by its timeout; aborted when a call failed on it) and frees it.
 * NULL is a no-op. Not collective, but every rank should destroy its own. */
RINGATTN_C_API int32_t ringattn_nccl_destroy(ringattn_nccl* nccl, char* error, size_t error_size);

/* The global positions of rank `rank`'s local rows, in local order, under `layout` for a
 * sequence of seq_len tokens over `world` ranks (args: the mask and, packed, the global
 * cu_seqlens, which doc-zigzag and auto read). *count := the number of rows; positions may be
 * NULL (the count alone), else it has room for capacity rows. *chosen (may be NULL) := the
 * layout taken (auto's pick). No communication. */
RINGATTN_C_API int32_t ringattn_shard_positions(const ringattn_attention_args* args, int32_t layout, int64_t seq_len,
                                                int32_t rank, int32_t world, int64_t* positions, int64_t capacity,
                                                int64_t* count, int32_t* chosen, char* error, size_t error_size);

/* out and lse of this rank's rows of ring attention over the ranks (collective). */
RINGATTN_C_API int32_t ringattn_ring_fwd(const ringattn_attention_args* args, const ringattn_ring_args* ring,
                                         const ringattn_tensor* q, const ringattn_tensor* k, const ringattn_tensor* v,
                                         const ringattn_tensor* out, const ringattn_tensor* lse, char* error,
                                         size_t error_size);

/* dq, dk, dv (float32, shapes of q and k) of this rank's rows for the global loss sum(dout * out)
 * after ringattn_ring_fwd (out and lse as it returned them); collective. */
RINGATTN_C_API int32_t ringattn_ring_bwd(const ringattn_attention_args* args, const ringattn_ring_args* ring,
                                         const ringattn_tensor* dout, const ringattn_tensor* q,
                                         const ringattn_tensor* k, const ringattn_tensor* v,
                                         const ringattn_tensor* out, const ringattn_tensor* lse,
                                         const ringattn_tensor* dq, const ringattn_tensor* dk,
                                         const ringattn_tensor* dv, char* error, size_t error_size);

#ifdef __cplusplus
}
#endif

#endif /* RINGATTN_C_H */

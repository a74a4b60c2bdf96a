// The runs: ring attention and the KV-sharded distributed decode, written once against Backend
// and Transport (ARCHITECTURE.md, "Data flow"): nothing here knows CPU or GPU, MPI or NCCL.
#pragma once

#include <cstdint>

#include "comm/transport.hpp"
#include "core/types.hpp"
#include "kernels/backend.hpp"
#include "runner/problem/problem.hpp"
#include "runner/ring/stats.hpp"

namespace ringattn {

class FlightRecorder;  // runner/diagnostics/flight_recorder.hpp

class RingPlan;  // runner/ring/ring_plan.hpp

// ---------------------------------------------------------------------------------------------
// The runs. Tensors live in the backend's memory (Backend::device_memory), any strides.

struct LocalTensors {
  // Ring: q, k, v hold this rank's shard, rows in shard_layout order, len = layout.tokens().
  // Decode: q holds all q_len queries (replicated), k and v this rank's kv_shard rows.
  TensorView q, k, v;
  TensorView out;            // same shape as q, dtype of the problem; written once at the end
  float* lse = nullptr;      // optional fp32 [batch, q_heads, q rows] contiguous, backend memory
};

// The ring backward's own tensors beside LocalTensors (whose out and lse are then the forward's
// results, inputs here): dO in the shape and dtype of out, and the fp32 gradients, any strides:
// dq in the shape of q, dk and dv in the shape of k. Every element of dq, dk and dv is written.
struct BackwardTensors {
  TensorView dout;
  TensorView dq, dk, dv;
};

struct RunOptions {
  int tile_q = 0, tile_k = 0;  // CPU tile sizes: 0 (default) or 1..kMaxTile (kernels/params.hpp)
  bool deterministic = false;  // backward: bitwise reproducible dq (BackwardParams::deterministic)
  int decode_splits = 0;       // split-KV chunks inside a rank for decode (0: default)
  bool check_agreement = true; // run agree_on_problem first (collective: all ranks or none)
  // Where the run records its hop events (posted, completed, failed): the caller's own (a library
  // call's, so that threads and calls share no recorder), or null for the process's
  // flight_recorder(), which the CLI prints on a failure and the fault decorators follow.
  FlightRecorder* recorder = nullptr;
};

// Throws InvalidArgument naming the flag (--tile-q, --tile-k) and the allowed range. The runs
// call it before allocating or communicating anything.
void validate_run_options(const RunOptions& opt);

// Ring attention of a self-attention problem (p.is_ring()) with the ring plan `plan`, made once
// for this problem over t.size() ranks keeping rank t.rank()'s calls (ring_plan for p.sharding,
// or RingPlan from any layouts; x holds this rank's rows of plan.layout(t.rank())), which the run
// follows and does not rebuild. Without it the run makes ring_plan(p, t.size(), t.rank()).
// Collective over `t`.
RankStats run_ring_attention(const GlobalProblem& p, const RingPlan& plan, const LocalTensors& x, Backend& b,
                             Transport& t, const RunOptions& opt = {});
RankStats run_ring_attention(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& t,
                             const RunOptions& opt = {});

// KV-sharded decode / chunked prefill: every rank attends all queries to its KV shard, then the
// partial states are allgathered and merged in rank order (bitwise identical on every rank).
// Collective over `t`.
RankStats run_distributed_decode(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& t,
                                 const RunOptions& opt = {});

// run_ring_attention when p.is_ring(), run_distributed_decode otherwise.
RankStats run_attention(const GlobalProblem& p, const LocalTensors& x, Backend& b, Transport& t,
                        const RunOptions& opt = {});

// The gradients of ring attention (p.is_ring()) for the loss whose gradient with respect to the
// output is g.dout, after the forward (run_attention) wrote x.out and x.lse (required). Each rank
// keeps its Q, O, LSE and dO and accumulates dQ; K and V travel around the ring over `t` as in the
// forward (same schedule and routes), and their fp32 dK/dV accumulators travel over `grad_t`
// one hop behind and come home at the end (ARCHITECTURE.md, "A second ring"). `grad_t` is a
// second transport over the same ranks (MPI: another make_mpi_transport on the communicator; a
// transport carries one exchange at a time); in a world of one it may be `t` itself. Ranks agree
// on running a backward before the first hop (a rank running the forward disagrees by name).
// Collective over both transports. The stats count the bytes of both rings (RingPlan::
// backward_bytes). With `plan`, the forward's (run_ring_attention), which both rings follow.
RankStats run_attention_backward(const GlobalProblem& p, const RingPlan& plan, const LocalTensors& x,
                                 const BackwardTensors& g, Backend& b, Transport& t, Transport& grad_t,
                                 const RunOptions& opt = {});
RankStats run_attention_backward(const GlobalProblem& p, const LocalTensors& x, const BackwardTensors& g, Backend& b,
                                 Transport& t, Transport& grad_t, const RunOptions& opt = {});

}  // namespace ringattn

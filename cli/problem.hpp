// The global problem a command runs, where its inputs come from (the seed or .npy files), and
// this rank's share of them in backend memory.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/file_layout.hpp"
#include "cli/options.hpp"
#include "kernels/backend.hpp"
#include "runner/problem/inputs.hpp"
#include "runner/io/npy.hpp"
#include "runner/ring/ring.hpp"

namespace ringattn::cli {

// Produces rows of the global Q, K or V, whatever this rank holds: from (seed, indices) or from
// the files. Every rank can rebuild any row, which is what the reference check needs.
class InputSource {
 public:
  // Seeded inputs.
  explicit InputSource(uint64_t seed) : seed_(seed) {}
  // Files (headers already validated against the problem), each holding its tensor in `layout`
  // (cli/file_layout.hpp): [batch, heads, len, dim], [batch, len, heads, dim] or the packed
  // [total_tokens, heads, dim] of varlen users (batch 1).
  InputSource(const std::string& q, const std::string& k, const std::string& v,
              FileLayout layout = FileLayout::Bhsd);

  bool from_files() const { return !readers_.empty(); }
  // Writes global rows [t0, t0 + n) of head h of batch b of `which` into `dst` (contiguous
  // [n, dim] in `dtype`). `heads`, `len`, `dim` describe the global tensor.
  void rows(InputTensor which, int64_t b, int64_t h, int64_t t0, int64_t n, int64_t heads, int64_t len, int64_t dim,
            void* dst, DType dtype);
  // Fills the local view `x` (rows in `layout` order) from head/batch/global positions.
  void fill(InputTensor which, const TensorView& x, const ShardLayout& layout, int64_t global_len);

 private:
  uint64_t seed_ = 0;
  FileLayout layout_ = FileLayout::Bhsd;
  std::vector<std::unique_ptr<NpyReader>> readers_;  // q, k, v
};

// The problem from the flags, or from the files' headers (which fix the shapes and the default
// dtype), and the source of its inputs. Throws InvalidArgument naming the file or flag at fault.
struct ProblemSetup {
  GlobalProblem problem;
  std::unique_ptr<InputSource> source;
  // How the files map to the problem's elements: --layout, or thd for three-dimensional inputs.
  // --out/--lse and the backward's --do/--dq/--dk/--dv use it too.
  FileLayout layout = FileLayout::Bhsd;
  // The ring plan of a ring problem over the world, keeping this rank's calls (plan_ring), made
  // once and passed to everything that follows it; none for a decode and for --cp groups.
  std::optional<RingPlan> ring;
  // --cp's ranks per all-to-all group (cli/context_parallel.hpp): 1 for the ring; above 1 the rows
  // of every rank are hybrid_layout's and the run builds its ring over the groups itself.
  int cp_group = 1;
};
ProblemSetup setup_problem(const ProblemOptions& o);

// The problem as the fp64 oracle sees it: one part per packed document, each a problem of its own
// (rows and keys [start, start + len), its own mask), or the whole sequence under p.mask().
struct OraclePart {
  int64_t start, len;
  MaskSpec mask;
};
std::vector<OraclePart> oracle_parts(const GlobalProblem& p);

// The ring plan of `p` over `world` ranks, keeping rank `rank`'s calls, with --shard auto (the
// default) resolved into p.sharding: a ring problem takes the best balanced sharding for its
// mask and documents (best_of over candidate_plans, whose pick becomes the plan: each candidate
// is built once); an explicit --shard is kept, and refused for a decode (which shards only its
// keys, contiguously), whose plan is none. Call after validate_problem. Every rank resolves the
// same.
std::optional<RingPlan> plan_ring(const ProblemOptions& o, GlobalProblem& p, int world, int rank);
// The plan of an optional one, or null.
inline const RingPlan* ring_of(const std::optional<RingPlan>& ring) { return ring ? &*ring : nullptr; }

struct CpTransports;

// This rank's tensors, in backend memory, with the poisoned output buffers.
struct LocalProblem {
  ShardLayout q_layout, kv_layout;  // local rows of q and of k/v as global positions
  const RingPlan* ring = nullptr;   // a ring problem's plan (its layouts); null for a decode
  int cp_group = 1;                 // --cp's group size (ProblemSetup::cp_group)
  const CpTransports* cp = nullptr;  // its transports, set once split (cp_group > 1)
  DeviceBuffer q, k, v, out, lse;
  LocalTensors views;
};

// Which global rows this rank holds: the ring plan's layout for self-attention (`ring`, which a
// ring problem needs), hybrid_layout's with --cp groups of cp_group > 1 ranks, all queries and the
// kv_shard for decode (ARCHITECTURE.md "Sharding"; runner/problem/sharding.hpp).
void layouts_for(const GlobalProblem& p, const RingPlan* ring, int rank, int world, ShardLayout& q_layout,
                 ShardLayout& kv_layout, int cp_group = 1);

// Allocates and fills this rank's q, k, v and poisons out and lse with NaN, so that anything the
// run does not write shows up in the check. `ring`: as for layouts_for (kept in LocalProblem).
LocalProblem load_local(const GlobalProblem& p, const RingPlan* ring, InputSource& src, Backend& b, int rank,
                        int world, int cp_group = 1);

// The forward on this rank's tensors: the ring along local.ring, the hybrid over local.cp (--cp
// groups; refused while they are not split), or the distributed decode.
RankStats run_forward(const GlobalProblem& p, const LocalProblem& local, Backend& b, Transport& t,
                      const ringattn::RunOptions& ro);

// Query-key pairs of the global problem (the causal mask applied): 4 * dim * pairs * batch * heads
// is the flop count of a run.
double visible_pairs(const GlobalProblem& p);

// The window of --window "LEFT,RIGHT" (empty: none): two decimal integers, each -1 (unbounded)
// or >= 0. Throws InvalidArgument naming the text; validate_problem checks the window against
// the mask.
Window parse_window(const std::string& text);
// "1000,3000,517": the lengths of --doc-lens (empty text: none). Throws InvalidArgument naming the
// bad item.
std::vector<int64_t> parse_doc_lens(const std::string& text);

// Document lengths for a sequence of n tokens from `spec` (bench --docs): "uniform:MAX" draws
// lengths uniformly in [1, MAX] from `seed` until the sequence is full, "fixed:L" repeats L; the
// last document is cut to fit. Every rank draws the same list. Throws InvalidArgument naming a
// bad spec.
std::vector<int64_t> generate_documents(const std::string& spec, int64_t n, uint64_t seed);
double attention_flops(const GlobalProblem& p);

// Refuses an input that is not a regular file before it is opened: opening a FIFO for reading
// blocks until a writer appears, past every --timeout. Names `flag` and the path.
void expect_regular_file(const char* flag, const std::string& path);

// The ordinary dtype for a device when neither --dtype nor files say otherwise.
DType default_dtype(const ProblemOptions& o);

}  // namespace ringattn::cli

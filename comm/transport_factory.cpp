#include "comm/transport_factory.hpp"

#include <array>

#ifdef RINGATTN_HAVE_NCCL
#include "comm/nccl_mpi.hpp"
#endif

namespace ringattn {
namespace {

std::unique_ptr<Transport> make_local(const TransportRequest&) { return make_local_transport(); }

std::unique_ptr<Transport> make_mpi(const TransportRequest& r) {
  return make_mpi_transport(r.comm, r.progress, r.timeout_s);
}

#ifdef RINGATTN_HAVE_NCCL
constexpr bool kNccl = true;
// The first hop also pays connection set-up: three times the bound.
std::unique_ptr<Transport> make_nccl(const TransportRequest& r) {
  return make_nccl_transport(r.comm, NcclOptions{r.timeout_s, 3 * r.timeout_s});
}
constexpr auto kNcclGpu = &select_local_gpu;
constexpr auto kNcclMake = &make_nccl;
#else
constexpr bool kNccl = false;
constexpr int (*kNcclGpu)(MPI_Comm) = nullptr;
constexpr std::unique_ptr<Transport> (*kNcclMake)(const TransportRequest&) = nullptr;
#endif

const std::array<TransportKind, 3> kKinds = {{
    {.name = "mpi", .library = "MPI", .needs_mpi = true, .needs_cuda = false, .world_of_one = false,
     .reads_progress = true, .built = true, .select_gpu = nullptr, .make = &make_mpi},
    {.name = "nccl", .library = "NCCL", .needs_mpi = true, .needs_cuda = true, .world_of_one = false,
     .reads_progress = false, .built = kNccl, .select_gpu = kNcclGpu, .make = kNcclMake},
    {.name = "local", .library = "local", .needs_mpi = false, .needs_cuda = false, .world_of_one = true,
     .reads_progress = false, .built = true, .select_gpu = nullptr, .make = &make_local},
}};

}  // namespace

std::span<const TransportKind> transport_kinds() { return kKinds; }

const TransportKind* find_transport_kind(std::string_view name) {
  for (const TransportKind& k : kKinds)
    if (name == k.name) return &k;
  return nullptr;
}

std::vector<const char*> transport_choices() {
  std::vector<const char*> c = {"auto"};
  for (const TransportKind& k : kKinds) c.push_back(k.name);
  return c;
}

const TransportKind& auto_transport_kind(MPI_Comm comm, bool cuda) {
  if (comm == MPI_COMM_NULL) return *find_transport_kind("local");
#ifdef RINGATTN_HAVE_NCCL
  // NCCL when every rank has a GPU of its own; ranks that share a GPU fall back to MPI.
  if (cuda && every_rank_has_own_gpu(comm)) return *find_transport_kind("nccl");
#else
  (void)cuda;
#endif
  return *find_transport_kind("mpi");
}

}  // namespace ringattn

// The public API of the distributed runtime, in five parts: the global problem every rank agrees
// on (problem.hpp), how a sequence is sharded over ranks (sharding.hpp), the ring plan made from
// the problem and the ranks' layouts (ring_plan.hpp), the per-rank statistics (stats.hpp) and the
// runners (runner.hpp, and hybrid.hpp: all-to-all inside groups of ranks, the ring across them).
// Written once against Backend and Transport (ARCHITECTURE.md): nothing here knows CPU or GPU, MPI
// or NCCL. The MPI transport's factory is in
// comm/mpi_transport.hpp, the only public header that includes <mpi.h>.
#pragma once

#include "runner/problem/problem.hpp"
#include "runner/ring/hybrid.hpp"
#include "runner/ring/ring_plan.hpp"
#include "runner/ring/runner.hpp"
#include "runner/problem/sharding.hpp"
#include "runner/ring/stats.hpp"

#include "cli/input_agreement.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "cli/world.hpp"
#include "core/error.hpp"
#include "runner/problem/agree.hpp"

namespace ringattn::cli {
namespace {

void fnv(uint64_t& h, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
}

// The value most ranks hold (ties: the lowest rank's), so that one odd rank is the one named.
size_t majority(const std::vector<int64_t>& v) {
  size_t ref = 0, best = 0;
  for (size_t r = 0; r < v.size(); ++r) {
    size_t votes = 0;
    for (int64_t x : v) votes += x == v[r] ? 1 : 0;
    if (votes > best) best = votes, ref = r;
  }
  return ref;
}

}  // namespace

uint64_t sampled_file_hash(const std::string& flag, const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) fail_arg("{} {}: cannot be read: {}", flag, path, std::strerror(errno));
  if (std::fseek(f.get(), 0, SEEK_END) != 0) fail_arg("{} {}: cannot seek: {}", flag, path, std::strerror(errno));
  const long size = std::ftell(f.get());
  if (size < 0) fail_arg("{} {}: cannot tell its size: {}", flag, path, std::strerror(errno));
  uint64_t h = 1469598103934665603ull;
  const uint64_t n = uint64_t(size);
  fnv(h, reinterpret_cast<const unsigned char*>(&n), sizeof(n));
  constexpr uint64_t kEdge = 64 << 10, kPiece = 4 << 10;
  std::vector<std::pair<uint64_t, uint64_t>> pieces = {{0, std::min(n, kEdge)}};  // (offset, bytes)
  if (n > kEdge) pieces.push_back({n - std::min(n - kEdge, kEdge), std::min(n - kEdge, kEdge)});
  for (uint64_t i = 1; i <= 16 && n > 2 * kEdge; ++i)
    pieces.push_back({std::min(n - kPiece, n * i / 17), kPiece});
  std::vector<unsigned char> buf(kEdge);
  for (const auto& [off, bytes] : pieces) {
    if (std::fseek(f.get(), long(off), SEEK_SET) != 0 || std::fread(buf.data(), 1, bytes, f.get()) != bytes)
      fail_arg("{} {}: reading {} bytes at offset {} failed", flag, path, bytes, off);
    fnv(h, buf.data(), bytes);
  }
  return h;
}

InputFiles input_files_of(const RunOptions& o) {
  InputFiles f = {{"--q", o.problem.q_file}, {"--k", o.problem.k_file}, {"--v", o.problem.v_file}};
  if (o.backward) f.emplace_back("--do", o.do_file);
  return f;
}

void agree_on_loaded_inputs(const GlobalProblem& p, const InputFiles& files, Transport& t) {
  try {
    agree_on_problem(p, t);
    for (const auto& [flag, path] : files) {
      if (path.empty()) continue;
      std::string error;
      uint64_t h = 0;
      try {
        h = sampled_file_hash(flag, path);
      } catch (const InvalidArgument& e) {
        error = e.what();
      }
      const std::vector<int64_t> all = agree_on_local_step(t, error, int64_t(h));
      const size_t ref = majority(all);
      std::string differ;
      for (size_t r = 0; r < all.size(); ++r)
        if (all[r] != all[ref]) differ += fmt::format(" rank {}: {:#018x};", r, uint64_t(all[r]));
      if (!differ.empty())
        fail_arg("ranks read different contents from {} (a sampled hash of each rank's file; rank {} has {:#018x}):{} "
                 "every rank must read the same file", flag, ref, uint64_t(all[ref]), differ);
    }
  } catch (const InvalidArgument& e) {
    throw CollectiveError(e.what());  // every rank evaluated the same gathered values
  }
}

}  // namespace ringattn::cli

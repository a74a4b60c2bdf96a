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

uint64_t file_hash(const std::string& flag, const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) fail_arg("{} {}: cannot be read: {}", flag, path, std::strerror(errno));
  // Eight bytes a step (FNV's multiply on words, then a shift to bring the high bits down): about
  // as fast as the disk; the size goes in last, so that a trailing zero byte changes the hash.
  uint64_t h = 1469598103934665603ull, size = 0;
  auto mix = [&h](uint64_t w) {
    h = (h ^ w) * 1099511628211ull;
    h ^= h >> 29;
  };
  std::vector<unsigned char> buf(size_t(1) << 20);
  for (;;) {
    const size_t got = std::fread(buf.data(), 1, buf.size(), f.get());
    if (got < buf.size() && std::ferror(f.get()))
      fail_arg("{} {}: reading at offset {} failed: {}", flag, path, size, std::strerror(errno));
    size_t i = 0;
    for (; i + 8 <= got; i += 8) {
      uint64_t w;
      std::memcpy(&w, buf.data() + i, 8);
      mix(w);
    }
    if (i < got) {
      uint64_t w = 0;
      std::memcpy(&w, buf.data() + i, got - i);
      mix(w);
    }
    size += got;
    if (got < buf.size()) break;
  }
  mix(size);
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
        h = file_hash(flag, path);
      } catch (const InvalidArgument& e) {
        error = e.what();
      }
      const std::vector<int64_t> all = agree_on_local_step(t, error, int64_t(h));
      const size_t ref = majority(all);
      std::string differ;
      for (size_t r = 0; r < all.size(); ++r)
        if (all[r] != all[ref]) differ += fmt::format(" rank {}: {:#018x};", r, uint64_t(all[r]));
      if (!differ.empty())
        fail_arg("ranks read different contents from {} (a hash of each rank's whole file; rank {} has {:#018x}):{} "
                 "every rank must read the same file", flag, ref, uint64_t(all[ref]), differ);
    }
  } catch (const InvalidArgument& e) {
    throw CollectiveError(e.what());  // every rank evaluated the same gathered values
  }
}

}  // namespace ringattn::cli

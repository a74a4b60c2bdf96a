#include "runner/diagnostics/log.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/error.hpp"
#include "core/host.hpp"
#include "runner/diagnostics/flight_recorder.hpp"

namespace ringattn {

spdlog::level::level_enum parse_log_level(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (s == "trace") return spdlog::level::trace;
  if (s == "debug") return spdlog::level::debug;
  if (s == "info") return spdlog::level::info;
  if (s == "warn" || s == "warning") return spdlog::level::warn;
  if (s == "error" || s == "err") return spdlog::level::err;
  if (s == "critical") return spdlog::level::critical;
  if (s == "off") return spdlog::level::off;
  fail_arg("unknown log level '{}': allowed are trace, debug, info, warn, error, critical, off", name);
}

std::string resolve_log_level(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("RINGATTN_LOG_LEVEL"); env && *env) return env;
  return "info";
}

void log_flight_recorder() {
  std::string events = flight_recorder().dump();
  if (events.empty()) return;
  if (events.back() == '\n') events.pop_back();
  spdlog::error("recent hop events of this rank (flight recorder, oldest first):\n{}", events);
}

void init_logging(int rank, int size, const std::string& level) {
  auto lvl = parse_log_level(level);
  core::set_identity(rank);
  // Progress is rank 0's job; the others would only repeat it P times.
  if (rank != 0 && lvl < spdlog::level::warn) lvl = spdlog::level::warn;
  spdlog::drop("ringattn");
  auto logger = spdlog::stderr_color_mt("ringattn");
  // The rank/host prefix is fixed text in the pattern; '%' in a host name would break it.
  std::string host = host_name();
  std::replace(host.begin(), host.end(), '%', '_');
  logger->set_pattern(fmt::format("[%H:%M:%S.%e] [%^%l%$] [rank {}/{} {}] %v", rank, size, host));
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::err);
  spdlog::set_default_logger(logger);
}

}  // namespace ringattn

#include "runner/diagnostics/log.hpp"

#include <unistd.h>

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/error.hpp"
#include "core/host.hpp"
#include "core/settings.hpp"
#include "runner/diagnostics/flight_recorder.hpp"

namespace ringattn {

spdlog::level::level_enum parse_log_level(const std::string& name) {
  const std::optional<LogLevel> l = log_level_from_name(name);
  if (!l) fail_arg("unknown log level '{}': allowed are {}", name, log_level_names());
  switch (*l) {
    case LogLevel::Trace: return spdlog::level::trace;
    case LogLevel::Debug: return spdlog::level::debug;
    case LogLevel::Info: return spdlog::level::info;
    case LogLevel::Warn: return spdlog::level::warn;
    case LogLevel::Error: return spdlog::level::err;
    case LogLevel::Critical: return spdlog::level::critical;
    case LogLevel::Off: return spdlog::level::off;
  }
  return spdlog::level::info;
}

std::string resolve_log_level(const std::string& flag, const Setting<std::optional<LogLevel>>& env) {
  if (!flag.empty()) return flag;
  if (const std::optional<LogLevel> l = env.get()) return log_level_name(*l);
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

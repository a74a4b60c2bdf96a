// Logging through spdlog. Every line carries rank/size and host so that interleaved output from
// several ranks stays readable; progress goes out on rank 0 only, warnings and errors on all.
#pragma once

#include <optional>
#include <string>

#include <spdlog/spdlog.h>

#include "core/settings.hpp"

namespace ringattn {

// Parses a level name (log_level_from_name, core/settings.hpp: trace, debug, info, warn, error,
// critical, off, any case); throws InvalidArgument otherwise.
spdlog::level::level_enum parse_log_level(const std::string& name);

// The level to use: `flag` when non-empty, else `env` (RINGATTN_LOG_LEVEL of a Settings; its
// refusal throws), else "info".
std::string resolve_log_level(const std::string& flag, const Setting<std::optional<LogLevel>>& env);

// Creates (or re-creates) the default logger: stderr, pattern
// "[time] [level] [rank r/P host] message", flushed on every error. Ranks other than 0 log
// warnings and errors only, whatever `level` asks for below that.
void init_logging(int rank, int size, const std::string& level);

// Logs this rank's flight recorder (its last hop events, oldest first) at error level, so that
// the message that ends a job says what the rank was doing; nothing when no hop was recorded.
void log_flight_recorder();

}  // namespace ringattn

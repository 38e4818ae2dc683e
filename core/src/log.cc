#include "log.h"

#include <unistd.h>

#include <cerrno>

#include "kolo/core/errors.h"

namespace kolo::detail {

LogLevel parse_log_level(const std::string& name) {
  if (name == "error") return LogLevel::kError;
  if (name == "warning") return LogLevel::kWarning;
  if (name == "info") return LogLevel::kInfo;
  if (name == "debug") return LogLevel::kDebug;
  throw ContractError("kolo log: unknown level '" + name +
                      "'; expected error, warning, info or debug");
}

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "?";
}

Logger Logger::from_config(const Config& config, int rank) {
  return Logger(parse_log_level(config.get_string("KOLO_LOG_LEVEL")), rank);
}

void Logger::log(LogLevel level, const std::string& message) const {
  if (!enabled(level)) return;
  std::string line = rank_ >= 0 ? "kolo[rank " + std::to_string(rank_) + "] " : "kolo ";
  line += log_level_name(level);
  line += ": ";
  line += message;
  line += '\n';
  size_t done = 0;
  while (done < line.size()) {
    ssize_t wrote = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return;  // stderr closed: nothing sensible left to do
    done += static_cast<size_t>(wrote);
  }
}

}  // namespace kolo::detail

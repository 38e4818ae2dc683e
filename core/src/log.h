// Tiny leveled logger to stderr (internal).
//
// Lines look like `kolo[rank 3] warning: ...` (`kolo warning: ...` before the
// rank is known). The level comes from KOLO_LOG_LEVEL and lives in the Logger
// object, not in process state: whoever owns a Config builds a Logger from it.
#pragma once

#include <string>

#include "kolo/core/config.h"

namespace kolo::detail {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

// "error", "warning", "info" or "debug" (the KOLO_LOG_LEVEL choices).
LogLevel parse_log_level(const std::string& name);
const char* log_level_name(LogLevel level);

class Logger {
 public:
  explicit Logger(LogLevel level = LogLevel::kWarning, int rank = -1)
      : level_(level), rank_(rank) {}
  // Level from KOLO_LOG_LEVEL of `config`; rank < 0 when not known yet.
  static Logger from_config(const Config& config, int rank = -1);

  bool enabled(LogLevel level) const { return level <= level_; }
  // Writes one whole line with a single write(2), so lines of concurrent
  // threads and processes do not interleave.
  void log(LogLevel level, const std::string& message) const;
  void error(const std::string& message) const { log(LogLevel::kError, message); }
  void warning(const std::string& message) const { log(LogLevel::kWarning, message); }
  void info(const std::string& message) const { log(LogLevel::kInfo, message); }
  void debug(const std::string& message) const { log(LogLevel::kDebug, message); }

 private:
  LogLevel level_;
  int rank_;
};

}  // namespace kolo::detail

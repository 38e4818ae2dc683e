// The launcher's error for a bad command line.
#pragma once

#include <stdexcept>
#include <string>

namespace kolo::launcher {

// A mistake on kolorun's command line. The message is one line that names the
// argument, the value and how to fix it; main() prints it as "kolorun: <message>"
// and exits non-zero before anything is spawned.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace kolo::launcher

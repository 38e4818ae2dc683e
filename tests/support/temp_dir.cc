#include "temp_dir.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace kolo::testing {

TempDir::TempDir(const std::string& prefix, const std::string& parent) {
  std::string pattern = parent + "/" + prefix + "-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr)
    throw std::runtime_error("TempDir: mkdtemp(" + pattern + ") failed: " + std::strerror(errno));
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string only_file_like(const std::string& dir, const std::string& prefix,
                           const std::string& suffix) {
  std::string found;
  int count = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() >= prefix.size() + suffix.size() && name.rfind(prefix, 0) == 0 &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      found = entry.path().string();
      ++count;
    }
  }
  return count == 1 ? found : "";
}

}  // namespace kolo::testing

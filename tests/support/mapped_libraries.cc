#include "mapped_libraries.h"

#include <fstream>

namespace kolo::testing {

std::map<std::string, std::set<std::string>> mapped_libraries() {
  std::ifstream maps("/proc/self/maps");
  std::map<std::string, std::set<std::string>> libraries;
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string file = path.substr(path.rfind('/') + 1);
    const size_t so = file.find(".so");
    if (so == std::string::npos) continue;
    libraries[file.substr(0, so)].insert(path);
  }
  return libraries;
}

}  // namespace kolo::testing

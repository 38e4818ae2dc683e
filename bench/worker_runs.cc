// Starting kolo-bench's own workers (worker_runs.h).
#include "worker_runs.h"

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "kolo/core/errors.h"

namespace kolo::bench {

namespace fs = std::filesystem;

std::string self_path(const std::string& mode) {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec)
    throw RuntimeFault("kolo-bench " + mode + ": cannot read /proc/self/exe: " + ec.message());
  return p.string();
}

std::string kolorun_path(const std::string& given, const std::string& mode) {
  if (!given.empty()) return given;
  return (fs::path(self_path(mode)).parent_path().parent_path() / "launcher" / "kolorun").string();
}

std::pair<std::string, int> run_command(const std::string& command, const std::string& mode) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw RuntimeFault("kolo-bench " + mode + ": cannot run " + command);
  std::string out;
  char buffer[4096];
  size_t got;
  while ((got = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, got);
  const int status = pclose(pipe);
  return {out, status};
}

std::vector<nlohmann::json> json_rows(const std::string& out, const std::string& key) {
  std::vector<nlohmann::json> rows;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const size_t brace = line.find('{');
    if (brace == std::string::npos) continue;
    nlohmann::json row = nlohmann::json::parse(line.substr(brace), nullptr, false);
    if (!row.is_discarded() && row.is_object() && row.contains(key)) rows.push_back(row);
  }
  return rows;
}

}  // namespace kolo::bench

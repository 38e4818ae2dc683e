// Starting kolo-bench's own workers (worker_runs.h).
#include "worker_runs.h"

#include <cstdio>
#include <cstdlib>
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

bool python_runs(const std::string& python, const std::string& code,
                 const std::string& python_path) {
  std::string quoted = "'";
  for (char c : code) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  const std::string env = python_path.empty() ? "" : "PYTHONPATH='" + python_path + "' ";
  const std::string check = "cd / && " + env + "'" + python + "' -c " + quoted + " >/dev/null 2>&1";
  return std::system(check.c_str()) == 0;
}

bool torchrun_works(const std::string& python) {
  return python_runs(python,
                     "import sys, torch.distributed.run, torch; "
                     "sys.exit(tuple(int(p) for p in torch.__version__.split('.')[:2]) < (2, 4))");
}

std::vector<std::string> torchrun_argv(const std::string& python, int nproc) {
  return {python,
          "-m",
          "torch.distributed.run",
          "--standalone",
          "--nproc-per-node",
          std::to_string(nproc)};
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

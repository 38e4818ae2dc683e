// kolorun --check-build across hosts (remote_check.h).
#include "remote_check.h"

#include <sys/wait.h>

#include <sstream>
#include <system_error>

#include "hosts.h"
#include "spawn.h"
#include "ssh_command.h"
#include "worker_env.h"

namespace kolo::launcher {
namespace {

std::string indented(const std::string& text) {
  std::string out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) out += "    " + line + "\n";
  return out;
}

std::string last_line(const std::string& text) {
  std::string last;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) last = line;
  }
  return last;
}

}  // namespace

int check_build_on_hosts(const LaunchOptions& options, const RemoteCheckOptions& check,
                         std::ostream& out) {
  out << check.local_report;
  const std::string self = this_hostname();
  const std::string path = process_parent_env()("PATH").value_or("/usr/bin:/bin");
  int code = 0;
  out << "\n";
  for (const auto& host : parse_host_list(options.hosts)) {
    if (is_local_host(host.name, self)) continue;
    SpawnRequest request;
    std::istringstream words(options.ssh_command);
    for (std::string word; words >> word;) request.argv.push_back(word);
    request.argv.insert(request.argv.end(), {"-o", "BatchMode=yes", host.name,
                                             shell_quote(check.kolorun_path) + " --check-build"});
    request.path = find_executable(request.argv.front(), path);
    request.env = current_environ();
    out << "kolorun --check-build on " << host.name << ": ";
    if (request.path.empty()) {
      out << "not checked: '" << request.argv.front() << "' is not an executable in PATH\n";
      code = 1;
      continue;
    }
    CapturedRun run;
    try {
      run = run_captured(request, check.timeout);
    } catch (const std::system_error& e) {
      out << "not checked: " << e.what() << "\n";
      code = 1;
      continue;
    }
    if (run.timed_out) {
      out << "no answer within " << check.timeout.count() / 1000 << " s\n";
      code = 1;
    } else if (!WIFEXITED(run.status) || WEXITSTATUS(run.status) != 0) {
      const std::string last = last_line(run.err);
      const bool missing =
          WIFEXITED(run.status) && WEXITSTATUS(run.status) >= 126 && WEXITSTATUS(run.status) <= 127;
      out << "failed (" << options.ssh_command << " exited with "
          << (WIFEXITED(run.status) ? "code " + std::to_string(WEXITSTATUS(run.status))
                                    : signal_name(WTERMSIG(run.status)))
          << (last.empty() ? "" : "; its last stderr line: " + last) << ")"
          << (missing ? "; workers there need the same build at " + check.kolorun_path : "")
          << "\n";
      code = 1;
    } else if (run.out == check.local_report) {
      out << "the same as this host\n";
    } else {
      out << "DIFFERS from this host:\n" << indented(run.out);
      code = 1;
    }
  }
  return code;
}

}  // namespace kolo::launcher

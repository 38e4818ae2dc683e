// Remote worker command construction (see ssh_command.h for the protocol).
#include "ssh_command.h"

#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace kolo::launcher {

std::string shell_quote(const std::string& text) {
  if (text.empty()) return "''";
  bool safe = true;
  for (char c : text) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
              c == '/' || c == ':' || c == ',' || c == '+' || c == '@' || c == '%' || c == '=';
    if (!ok) {
      safe = false;
      break;
    }
  }
  if (safe) return text;
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string remote_script(const RemoteWorker& worker) {
  std::ostringstream s;
  s << "cd " << shell_quote(worker.working_dir) << " && ";
  // `read` takes exactly one line from a pipe (shells read it byte by byte),
  // so the watcher below still sees the rest of the stream.
  if (worker.secret_on_stdin) s << "IFS= read -r KOLO_JOB_SECRET && export KOLO_JOB_SECRET && ";
  // The watcher reads the original stdin through fd 3: an asynchronous list's
  // own stdin is /dev/null in a non-interactive shell.
  s << "exec 3<&0 && ";
  std::map<std::string, std::string> given;
  for (const auto& [name, value] : worker.variables) given.emplace(name, value);
  bool remote_threads = false;
  if (worker.threads_divisor > 0) {
    for (const auto& name : thread_variables()) {
      if (given.count(name) == 0) remote_threads = true;
    }
  }
  // A thread count the user gave (-x) wins over the remote host's share.
  const std::optional<std::string> chosen =
      chosen_thread_count([&given](const std::string& name) -> std::optional<std::string> {
        const auto it = given.find(name);
        if (it == given.end()) return std::nullopt;
        return it->second;
      });
  if (remote_threads && !chosen) {
    s << "kolo_threads=$(( $(nproc 2>/dev/null || echo 1) / " << worker.threads_divisor
      << " )); [ \"$kolo_threads\" -ge 1 ] || kolo_threads=1; ";
  }
  s << "{ env";
  for (const auto& [name, value] : worker.variables) s << " " << shell_quote(name + "=" + value);
  if (remote_threads) {
    for (const auto& name : thread_variables()) {
      if (given.count(name) != 0) continue;
      s << " " << (chosen ? shell_quote(name + "=" + *chosen) : name + "=$kolo_threads");
    }
  }
  s << " " << shell_quote(worker.program);
  for (const auto& arg : worker.args) s << " " << shell_quote(arg);
  long grace = std::lround(std::ceil(worker.grace_seconds));
  s << " </dev/null 3<&- & kolo_pid=$!; "
    << "{ cat <&3 >/dev/null 2>&1; kill -TERM $kolo_pid 2>/dev/null; sleep " << grace
    << "; kill -KILL $kolo_pid 2>/dev/null; } >/dev/null 2>&1 & kolo_watch=$!; "
    << "exec 3<&-; wait $kolo_pid; kolo_rc=$?; kill $kolo_watch 2>/dev/null; exit $kolo_rc; }";
  return s.str();
}

std::vector<std::string> remote_command(const std::string& ssh_command,
                                        const RemoteWorker& worker) {
  std::vector<std::string> argv;
  std::istringstream words(ssh_command);
  std::string word;
  while (words >> word) argv.push_back(word);
  argv.insert(argv.end(), {"-o", "BatchMode=yes", worker.host, remote_script(worker)});
  return argv;
}

}  // namespace kolo::launcher

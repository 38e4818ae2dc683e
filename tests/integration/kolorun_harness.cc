// Test harness for kolorun (kolorun_harness.h).
#include "kolorun_harness.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "proc_stat.h"  // core/src: header-only

extern char** environ;

namespace kolo::kolorun_test {

std::string kolorun_path() { return std::string(KOLO_BINARY_DIR) + "/launcher/kolorun"; }
std::string bench_path() { return std::string(KOLO_BINARY_DIR) + "/bench/kolo-bench"; }
std::string torch_tests_path() { return std::string(KOLO_BINARY_DIR) + "/tests/kolo_torch_tests"; }

std::pair<std::string, int> run_shell(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  while (pipe && fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  const int status = pipe ? pclose(pipe) : -1;
  return {out, status};
}

std::string worker_path(const std::string& name) {
  return std::string(KOLO_BINARY_DIR) + "/tests/" + name;
}

std::vector<std::string> RunResult::err_lines() const {
  std::vector<std::string> lines;
  std::istringstream in(err);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

KolorunProcess::KolorunProcess(const std::vector<std::string>& args,
                               const std::vector<std::string>& extra_env,
                               const std::string& program) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string e = *entry;
    std::string name = e.substr(0, e.find('='));
    bool replaced = false;
    for (const auto& extra : extra_env)
      replaced = replaced || extra.substr(0, extra.find('=')) == name;
    if (!replaced) env.push_back(e);
  }
  for (const auto& extra : extra_env) {
    if (extra.find('=') != std::string::npos) env.push_back(extra);
  }
  std::vector<std::string> argv = {program};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> argv_p, env_p;
  for (auto& a : argv) argv_p.push_back(a.data());
  argv_p.push_back(nullptr);
  for (auto& e : env) env_p.push_back(e.data());
  env_p.push_back(nullptr);

  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) std::abort();
  pid_ = fork();
  if (pid_ == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    execve(argv_p[0], argv_p.data(), env_p.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
}

KolorunProcess::~KolorunProcess() {
  if (!reaped_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (err_fd_ >= 0) close(err_fd_);
}

void KolorunProcess::pump(std::chrono::milliseconds max_wait) {
  std::vector<pollfd> fds;
  if (out_fd_ >= 0) fds.push_back({out_fd_, POLLIN, 0});
  if (err_fd_ >= 0) fds.push_back({err_fd_, POLLIN, 0});
  if (fds.empty()) {
    std::this_thread::sleep_for(std::min(max_wait, std::chrono::milliseconds(5)));
    return;
  }
  if (poll(fds.data(), fds.size(), static_cast<int>(max_wait.count())) <= 0) return;
  for (const auto& p : fds) {
    if (p.revents == 0) continue;
    char buffer[65536];
    ssize_t n = read(p.fd, buffer, sizeof(buffer));
    bool is_out = p.fd == out_fd_;
    if (n > 0) {
      (is_out ? result_.out : result_.err).append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
      close(p.fd);
      (is_out ? out_fd_ : err_fd_) = -1;
    }
  }
}

bool KolorunProcess::try_reap() {
  if (reaped_) return true;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
  reaped_ = true;
  if (WIFEXITED(status)) result_.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result_.term_signal = WTERMSIG(status);
  return true;
}

bool KolorunProcess::wait_for_stdout(const std::function<bool(const std::string&)>& done,
                                     std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done(result_.out)) {
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline || (out_fd_ < 0 && try_reap())) return done(result_.out);
    pump(std::min(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now),
                  std::chrono::milliseconds(50)));
  }
  return true;
}

RunResult KolorunProcess::wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!(try_reap() && out_fd_ < 0 && err_fd_ < 0)) {
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      result_.timed_out = true;
      if (!reaped_) {
        kill(pid_, SIGKILL);
        int status = 0;
        waitpid(pid_, &status, 0);
        reaped_ = true;
        result_.term_signal = SIGKILL;
      }
      break;
    }
    pump(std::min(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now),
                  std::chrono::milliseconds(20)));
  }
  return result_;
}

RunResult run_kolorun(const std::vector<std::string>& args, std::chrono::milliseconds timeout,
                      const std::vector<std::string>& extra_env) {
  KolorunProcess process(args, extra_env);
  return process.wait(timeout);
}

RunResult run_program(const std::string& program, const std::vector<std::string>& args,
                      std::chrono::milliseconds timeout,
                      const std::vector<std::string>& extra_env) {
  KolorunProcess process(args, extra_env, program);
  return process.wait(timeout);
}

bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  const std::optional<detail::ProcStat> stat = detail::read_proc_stat(pid);
  return !stat || stat->state == 'Z';
}

bool wait_gone(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!process_gone(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

std::vector<int> int_values(const std::string& output, const std::string& key) {
  std::vector<int> values;
  size_t at = 0;
  const std::string needle = key + "=";
  while ((at = output.find(needle, at)) != std::string::npos) {
    bool word_start =
        at == 0 || output[at - 1] == ' ' || output[at - 1] == '\n' || output[at - 1] == ':';
    at += needle.size();
    if (word_start) values.push_back(std::atoi(output.c_str() + at));
  }
  return values;
}

std::vector<std::string> tagged_lines(const std::string& output, int rank,
                                      const std::string& stream) {
  const std::string tag = "[1," + std::to_string(rank) + "]<" + stream + ">:";
  std::vector<std::string> lines;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(tag, 0) == 0) lines.push_back(line.substr(tag.size()));
  }
  return lines;
}

int usable_cores_here() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return 1;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

pid_t child_with_env(pid_t parent, const std::string& variable) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    const std::optional<detail::ProcStat> stat = detail::read_proc_stat(pid);
    if (!stat || stat->ppid != parent) continue;
    // read(2), not a stream: the process may exit mid-read (proc_stat.h).
    const int fd = ::open(("/proc/" + name + "/environ").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    std::string env;
    char buffer[4096];
    for (ssize_t n; (n = ::read(fd, buffer, sizeof(buffer))) > 0;) env.append(buffer, n);
    ::close(fd);
    for (size_t begin = 0; begin < env.size();) {
      const size_t end = std::min(env.find('\0', begin), env.size());
      if (env.compare(begin, end - begin, variable) == 0) return pid;
      begin = end + 1;
    }
  }
  return -1;
}

std::vector<double> numbers_after(const std::string& output, const std::string& prefix) {
  std::vector<double> values;
  const std::regex pattern(
      std::regex_replace(prefix, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") + "([0-9.]+)");
  for (std::sregex_iterator it(output.begin(), output.end(), pattern), end; it != end; ++it) {
    values.push_back(std::stod((*it)[1].str()));
  }
  return values;
}

std::string flag_pairs_name(const std::vector<std::string>& flags) {
  std::string name;
  for (size_t i = 0; i + 1 < flags.size(); i += 2) name += flags[i].substr(2) + flags[i + 1];
  return name;
}

}  // namespace kolo::kolorun_test

// Driving a kolorun job from a benchmark (job_driver.h).
#include "job_driver.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kolo/core/errors.h"
#include "worker_runs.h"

extern char** environ;

namespace kolo::bench {

double seconds_between(DriverClock::time_point a, DriverClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

JobPrograms find_job_programs(const std::string& mode, const std::string& kolorun,
                              const std::string& example) {
  const std::filesystem::path build =
      std::filesystem::path(self_path(mode)).parent_path().parent_path();
  JobPrograms programs;
  programs.kolorun = kolorun_path(kolorun, mode);
  programs.example =
      example.empty() ? (build / "examples" / "fashion_mnist" / "fashion_mnist").string() : example;
  for (const std::string& path : {programs.kolorun, programs.example}) {
    if (access(path.c_str(), X_OK) != 0) {
      throw ContractError("kolo-bench " + mode + ": " + path +
                          " is not an executable; build it (cmake --build <dir> --target kolorun "
                          "fashion_mnist) or pass --kolorun / --example");
    }
  }
  return programs;
}

Job start_job(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  int out[2], err[2];
  if (pipe(out) != 0 || pipe(err) != 0) {
    throw RuntimeFault(std::string("kolo-bench: pipe: ") + std::strerror(errno));
  }
  // Built before fork: the child only execs.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(env.begin(), env.end(), [&](const std::string& x) {
      return x.substr(0, x.find('=')) == name;
    });
    if (!replaced) environment.push_back(entry);
  }
  environment.insert(environment.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (const std::string& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw RuntimeFault(std::string("kolo-bench: fork: ") + std::strerror(errno));
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    setpgid(0, 0);
    execve(args[0], args.data(), envp.data());
    std::fprintf(stderr, "kolo-bench: cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  setpgid(pid, pid);
  Job job;
  job.pid = pid;
  job.fds[0] = out[0];
  job.fds[1] = err[0];
  return job;
}

std::vector<Line> read_lines(Job& job, int wait_ms, bool* eof) {
  std::vector<Line> lines;
  std::vector<pollfd> fds;
  std::vector<int> which;
  for (int s = 0; s < 2; ++s) {
    if (job.fds[s] < 0) continue;
    fds.push_back({job.fds[s], POLLIN, 0});
    which.push_back(s);
  }
  if (fds.empty()) {
    *eof = true;
    return lines;
  }
  if (poll(fds.data(), fds.size(), wait_ms) <= 0) return lines;
  const DriverClock::time_point now = DriverClock::now();
  for (size_t k = 0; k < fds.size(); ++k) {
    if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    const int s = which[k];
    char buffer[65536];
    const ssize_t got = read(job.fds[s], buffer, sizeof buffer);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      close(job.fds[s]);
      job.fds[s] = -1;
      continue;
    }
    job.partial[s].append(buffer, static_cast<size_t>(got));
    size_t newline;
    while ((newline = job.partial[s].find('\n')) != std::string::npos) {
      lines.push_back({s, job.partial[s].substr(0, newline), now});
      job.partial[s].erase(0, newline + 1);
    }
  }
  return lines;
}

namespace {

// Parent pid of `pid` from /proc/<pid>/stat, -1 if unreadable.
pid_t parent_of(const std::string& pid) {
  std::ifstream stat("/proc/" + pid + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(text.substr(paren + 1));
  char state;
  pid_t ppid = -1;
  fields >> state >> ppid;
  return ppid;
}

template <typename Visit>
void for_each_child(pid_t parent, Visit&& visit) {
  DIR* proc = opendir("/proc");
  if (!proc) return;
  while (dirent* entry = readdir(proc)) {
    const std::string name = entry->d_name;
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    if (parent_of(name) == parent) visit(name);
  }
  closedir(proc);
}

}  // namespace

pid_t worker_pid(pid_t kolorun, int worker_id) {
  const std::string wanted = "KOLO_WORKER_ID=" + std::to_string(worker_id);
  pid_t found = -1;
  for_each_child(kolorun, [&](const std::string& name) {
    std::ifstream env("/proc/" + name + "/environ", std::ios::binary);
    std::string variable;
    while (std::getline(env, variable, '\0')) {
      if (variable == wanted) found = static_cast<pid_t>(std::stol(name));
    }
  });
  return found;
}

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> pids;
  for_each_child(parent, [&](const std::string& name) {
    pids.push_back(static_cast<pid_t>(std::stol(name)));
  });
  return pids;
}

int wait_job(Job& job, std::chrono::milliseconds timeout, std::vector<Line>* lines) {
  int status = 0;
  const DriverClock::time_point deadline = DriverClock::now() + timeout;
  bool eof = false;
  while (waitpid(job.pid, &status, WNOHANG) == 0) {
    if (DriverClock::now() > deadline) {
      kill(-job.pid, SIGKILL);
      waitpid(job.pid, &status, 0);
      break;
    }
    for (Line& line : read_lines(job, 50, &eof)) lines->push_back(std::move(line));
  }
  while (!eof) {
    std::vector<Line> more = read_lines(job, 50, &eof);
    if (more.empty() && DriverClock::now() > deadline) break;
    for (Line& line : more) lines->push_back(std::move(line));
  }
  for (int& fd : job.fds) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  return status;
}

int stop_job(Job& job) {
  kill(job.pid, SIGTERM);
  std::vector<Line> ignored;
  return wait_job(job, std::chrono::seconds(15), &ignored);
}

}  // namespace kolo::bench

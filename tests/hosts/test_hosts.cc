// Test hosts seen from the tests (test_hosts.h).
#include "test_hosts.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace kolo::hosts_test {
namespace {

const char* kStateFile = "/run/kolo-hosts/env";

// Runs `command` with /bin/sh and returns its stdout.
std::string shell_output(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  pclose(pipe);
  return out;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

}  // namespace

const TestHosts* test_hosts(size_t count, std::string* why) {
  static TestHosts hosts;
  static bool loaded = false;
  if (!loaded) {
    std::ifstream in(kStateFile);
    std::map<std::string, std::string> values;
    for (std::string line; std::getline(in, line);) {
      const size_t eq = line.find('=');
      if (eq == std::string::npos) continue;
      std::string value = line.substr(eq + 1);
      if (value.size() >= 2 && value.front() == '\'' && value.back() == '\'') {
        value = value.substr(1, value.size() - 2);
      }
      values[line.substr(0, eq)] = value;
    }
    hosts.names = split(values["KOLO_TEST_HOSTS"], ',');
    hosts.ssh_command = values["KOLO_TEST_SSH"];
    hosts.launch_addr = values["KOLO_TEST_LAUNCH_ADDR"];
    hosts.rate = values["KOLO_TEST_RATE"];
    loaded = true;
  }
  if (hosts.names.size() >= count && !hosts.ssh_command.empty()) return &hosts;
  *why = "needs " + std::to_string(count) + " test hosts (network namespaces with sshd), and " +
         (hosts.names.empty() ? std::string("none are up") +
                                    (geteuid() != 0 ? " (not root: namespaces need root)" : "")
                              : std::to_string(hosts.names.size()) + " are up") +
         "; as root: scripts/test_hosts.sh up " + std::to_string(std::max<size_t>(count, 3)) +
         " (ctest does it for this tier)";
  return nullptr;
}

std::string script_path() { return std::string(KOLO_SOURCE_DIR) + "/scripts/test_hosts.sh"; }

std::vector<pid_t> host_pids(const std::string& host) {
  std::vector<pid_t> pids;
  for (const auto& word : split(shell_output("ip netns pids " + host + " 2>/dev/null"), '\n')) {
    pids.push_back(static_cast<pid_t>(std::atoi(word.c_str())));
  }
  return pids;
}

pid_t sshd_pid(const std::string& host) {
  std::ifstream in("/run/kolo-hosts/h" + host.substr(host.find_first_of("0123456789")) +
                   "/sshd.pid");
  pid_t pid = -1;
  in >> pid;
  return pid;
}

std::vector<pid_t> wait_only_sshd(const std::string& host, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const pid_t sshd = sshd_pid(host);
  for (;;) {
    std::vector<pid_t> left;
    for (pid_t pid : host_pids(host)) {
      if (pid != sshd) left.push_back(pid);
    }
    if (left.empty() || std::chrono::steady_clock::now() > deadline) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void set_link(const std::string& host, bool up) {
  const std::string command = "bash " + script_path() + " link " + host + (up ? " up" : " down");
  if (std::system(command.c_str()) != 0) throw std::runtime_error(command + " failed");
}

std::string command_line(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::replace(text.begin(), text.end(), '\0', ' ');
  return text;
}

std::vector<pid_t> all_pids() {
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = readdir(proc)) {
    const int pid = std::atoi(entry->d_name);
    if (pid > 0) pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

}  // namespace kolo::hosts_test

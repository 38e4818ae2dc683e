// The test hosts of scripts/test_hosts.sh, seen from the tests: network
// namespaces kolo-h1..kolo-hN with their own names, addresses and sshd.
// ctest brings them up before this tier (fixture `test_hosts`, as root) and
// takes them down afterwards, also when tests fail. Run by hand:
//   scripts/test_hosts.sh up 3 && build/tests/kolo_hosts_tests; scripts/test_hosts.sh down
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace kolo::hosts_test {

struct TestHosts {
  std::vector<std::string> names;  // kolo-h1, kolo-h2, ...
  std::string ssh_command;         // "ssh -F /run/kolo-hosts/ssh_config"
  std::string launch_addr;         // this machine's address on the test subnet
  std::string rate;                // "unshaped" or a tc rate (1gbit)
};

// The hosts when they are up with at least `count` hosts; otherwise null and
// `why` says what is missing (for GTEST_SKIP).
const TestHosts* test_hosts(size_t count, std::string* why);

// Skips the test, with the reason, unless `count` test hosts are up.
#define KOLO_NEED_TEST_HOSTS(count, hosts_var)           \
  std::string kolo_why_;                                 \
  const ::kolo::hosts_test::TestHosts* hosts_var =       \
      ::kolo::hosts_test::test_hosts(count, &kolo_why_); \
  if (hosts_var == nullptr) GTEST_SKIP() << kolo_why_

// scripts/test_hosts.sh in the source tree.
std::string script_path();

// Pids of every process in `host`'s network namespace (`ip netns pids`).
std::vector<pid_t> host_pids(const std::string& host);
// The pid of `host`'s sshd listener.
pid_t sshd_pid(const std::string& host);
// Waits until nothing but sshd's listener runs on `host`; returns the pids
// still there at the timeout (empty: none left).
std::vector<pid_t> wait_only_sshd(const std::string& host, std::chrono::milliseconds timeout);

// Takes `host`'s link down or brings it back (scripts/test_hosts.sh link).
void set_link(const std::string& host, bool up);

// The command line of `pid` with NULs as spaces ("" when it is gone).
std::string command_line(pid_t pid);
// Every process on this machine (all hosts share its pid namespace).
std::vector<pid_t> all_pids();

}  // namespace kolo::hosts_test

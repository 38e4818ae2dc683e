// The hierarchical communicator across real test hosts (test_hosts.h): ranks
// are forked processes that enter their host's network namespace, so shm
// runs within each host and gloo over the hosts' links. A rank SIGKILLed on
// the far host is a RuntimeFault naming it on every survivor, on both hosts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "forked_ranks.h"
#include "kolo/core/communicator.h"
#include "kolo/core/store.h"
#include "temp_dir.h"
#include "test_hosts.h"

#if KOLO_HAVE_GLOO

namespace kolo::hosts_test {
namespace {

using kolo::testing::allreduce_until_fault;
using kolo::testing::kill_once_running;
using kolo::testing::run_forked_ranks;
using kolo::testing::SharedState;
using kolo::testing::TempDir;
using std::chrono::milliseconds;

// Moves the calling process into `host`'s network namespace.
void enter_host(const std::string& host) {
  const std::string path = "/run/netns/" + host;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
    throw std::runtime_error("cannot enter " + path + ": " + std::strerror(errno));
  }
  close(fd);
}

// Allreduces of `count` f32 until rank 3 (on the second host) is SIGKILLed;
// every survivor must report it.
void expect_far_kill_reported(const TestHosts* hosts, size_t count) {
  TempDir dir("kolo-hier-hosts");
  constexpr int kSize = 4;
  constexpr int kVictim = 3;  // on the second host; ranks 0 and 1 are on the first
  bool killed = false;
  auto outcomes = run_forked_ranks(
      kSize,
      [&](int rank, SharedState& state) -> std::string {
        const std::string& host = hosts->names[rank / 2];
        enter_host(host);
        CommunicatorOptions options;
        options.rank = rank;
        options.size = kSize;
        options.store = make_file_store(dir.path());  // the hosts share this file system
        options.prefix = "hier_hosts";
        options.timeout = milliseconds(30000);
        options.hierarchical = "auto";
        options.rank_hosts = {0, 0, 1, 1};
        options.host_name = host;
        options.gloo_iface = "eth0";
        auto comm = make_communicator("gloo", options);
        return allreduce_until_fault(*comm, kVictim, count, state.progress[rank],
                                     "kolo hierarchical (rank " + std::to_string(rank));
      },
      kill_once_running(kVictim, kSize, &killed), milliseconds(120000));
  ASSERT_TRUE(killed) << "the ranks never made progress: " << outcomes[0].result;
  EXPECT_EQ(outcomes[kVictim].signal, SIGKILL);
  for (int rank = 0; rank < kSize - 1; ++rank) {
    EXPECT_EQ(outcomes[rank].exit_code, 0) << "rank " << rank << ": " << outcomes[rank].result;
  }
}

TEST(HierarchicalAcrossHosts, AKilledRankOnTheFarHostIsARuntimeFaultNamingItOnEverySurvivor) {
  KOLO_NEED_TEST_HOSTS(2, hosts);
  expect_far_kill_reported(hosts, 1 << 18);
}

// The same while allreduce runs pipelined (8 MiB and more: two or more chunks,
// the cross-host part on a helper thread): the fault in either thread ends both.
TEST(HierarchicalAcrossHosts, AKilledRankIsReportedWhileTheAllreduceIsPipelined) {
  KOLO_NEED_TEST_HOSTS(2, hosts);
  expect_far_kill_reported(hosts, (size_t{3} << 20) + 5);
}

}  // namespace
}  // namespace kolo::hosts_test

#endif  // KOLO_HAVE_GLOO

// kolorun over real ssh across the test hosts (test_hosts.h): placement and
// tagging, the job secret on no command line, the gloo and mpi backends
// across hosts, a SIGKILLed far worker and Ctrl-C stopping every worker on
// every host, --check-build on the remote side.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <memory>

#include "kolorun_harness.h"
#include "test_hosts.h"

namespace kolo::hosts_test {
namespace {

using kolorun_test::int_values;
using kolorun_test::KolorunProcess;
using kolorun_test::run_kolorun;
using kolorun_test::RunResult;
using kolorun_test::tagged_lines;
using kolorun_test::worker_path;
using std::chrono::seconds;

const std::vector<std::string> kMpiEnv = {"OMPI_ALLOW_RUN_AS_ROOT=1",
                                          "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"};

// kolorun's arguments for `-H list` over the test hosts' ssh.
std::vector<std::string> over_ssh(const TestHosts& hosts, const std::string& list,
                                  std::vector<std::string> rest) {
  std::vector<std::string> args = {"-H", list, "--ssh-command", hosts.ssh_command};
  args.insert(args.end(), rest.begin(), rest.end());
  return args;
}

std::string value_of(const std::vector<std::string>& lines, const std::string& key) {
  for (const auto& line : lines) {
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  }
  return "";
}

// Nothing but sshd is left on any host.
void expect_no_orphans(const TestHosts& hosts) {
  for (const auto& host : hosts.names) {
    const auto left = wait_only_sshd(host, seconds(15));
    std::string listing;
    for (pid_t pid : left) listing += "\n  " + std::to_string(pid) + ": " + command_line(pid);
    EXPECT_TRUE(left.empty()) << "left running on " << host << ":" << listing;
  }
}

TEST(KolorunSsh, PlacesRanksOnTheirHostsAndTagsTheirOutput) {
  KOLO_NEED_TEST_HOSTS(2, hosts);
  const std::string list = hosts->names[0] + ":2," + hosts->names[1] + ":2";
  KolorunProcess run(over_ssh(
      *hosts, list,
      {"--tag-output", worker_path("env_worker"), "--sleep-ms", "4000", "an arg", "it's"}));
  // While the workers run: their secret is on no command line anywhere on this
  // machine (the hosts share its pid namespace, so this covers ssh, sshd's
  // sessions, the remote shells and the workers).
  std::string out;
  ASSERT_TRUE(run.wait_for_stdout(
      [&](const std::string& so_far) {
        out = so_far;
        for (int rank = 0; rank < 4; ++rank) {
          if (value_of(tagged_lines(so_far, rank), "args").empty()) return false;
        }
        return true;
      },
      seconds(60)))
      << out;
  const std::string secret = value_of(tagged_lines(out, 0), "KOLO_JOB_SECRET");
  ASSERT_EQ(secret.size(), 64u) << "rank 0 got no job secret:\n" << out;
  for (pid_t pid : all_pids()) {
    EXPECT_EQ(command_line(pid).find(secret), std::string::npos)
        << "the job secret is on the command line of pid " << pid << ": " << command_line(pid);
  }
  RunResult r = run.wait(seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    const auto lines = tagged_lines(r.out, rank);
    const std::string host = hosts->names[rank / 2];
    EXPECT_EQ(value_of(lines, "host"), host) << "rank " << rank;
    EXPECT_EQ(value_of(lines, "KOLO_RANK"), std::to_string(rank));
    EXPECT_EQ(value_of(lines, "KOLO_LOCAL_RANK"), std::to_string(rank % 2));
    EXPECT_EQ(value_of(lines, "KOLO_CROSS_RANK"), std::to_string(rank / 2));
    EXPECT_EQ(value_of(lines, "KOLO_CROSS_SIZE"), "2");
    EXPECT_EQ(value_of(lines, "KOLO_JOB_SECRET"), secret) << "rank " << rank;
    // The store is reached at this machine's address on the hosts' subnet.
    EXPECT_EQ(value_of(lines, "KOLO_STORE_ADDR"), hosts->launch_addr);
    EXPECT_EQ(value_of(lines, "args"), "an arg|it's");
    EXPECT_EQ(tagged_lines(r.err, rank, "stderr"),
              std::vector<std::string>{"stderr line from " + std::to_string(rank)});
  }
  expect_no_orphans(*hosts);
}

void expect_check_passed(const RunResult& r, int np, const std::string& backend) {
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < np; ++rank) {
    const auto lines = tagged_lines(r.out, rank);
    ASSERT_FALSE(lines.empty()) << "rank " << rank << " printed nothing\n" << r.out;
    EXPECT_NE(lines.front().find(" backend=" + backend + " "), std::string::npos) << lines.front();
    EXPECT_EQ(lines.back(), "check passed") << r.out;
  }
}

TEST(KolorunSsh, GlooCollectivesAcrossHosts) {
  KOLO_NEED_TEST_HOSTS(2, hosts);
  const std::string list = hosts->names[0] + ":2," + hosts->names[1] + ":2";
  RunResult r = run_kolorun(
      over_ssh(*hosts, list,
               {"--timeout", "60", "--tag-output", worker_path("kolo_check_worker"), "--quick"}),
      seconds(240));
  expect_check_passed(r, 4, "gloo");
  EXPECT_NE(tagged_lines(r.out, 3).front().find("cross_rank=1 cross_size=2"), std::string::npos);
}

// One rank on this machine (the launcher's host) and one on a test host: the
// local rank's gloo device must pick this machine's address on the hosts'
// subnet, not loopback (this machine's name maps to 127.0.0.1).
TEST(KolorunSsh, GlooBetweenThisMachineAndATestHost) {
  KOLO_NEED_TEST_HOSTS(1, hosts);
  RunResult r = run_kolorun(over_ssh(*hosts, "localhost:1," + hosts->names[0] + ":1",
                                     {"--timeout", "60", "--tag-output",
                                      worker_path("kolo_check_worker"), "--counts", "0,1,1000"}),
                            seconds(120));
  expect_check_passed(r, 2, "gloo");
}

// KOLO_GLOO_IFACE names the interface gloo binds to (each test host has eth0).
TEST(KolorunSsh, GlooOnTheInterfaceKoloGlooIfaceNames) {
  KOLO_NEED_TEST_HOSTS(2, hosts);
  RunResult r =
      run_kolorun(over_ssh(*hosts, hosts->names[0] + ":1," + hosts->names[1] + ":1",
                           {"-x", "KOLO_GLOO_IFACE=eth0", "--timeout", "60", "--tag-output",
                            worker_path("kolo_check_worker"), "--counts", "0,1,1000"}),
                  seconds(120));
  expect_check_passed(r, 2, "gloo");
  RunResult wrong = run_kolorun(over_ssh(*hosts, hosts->names[0] + ":1," + hosts->names[1] + ":1",
                                         {"-x", "KOLO_GLOO_IFACE=nosuch0", "--timeout", "20",
                                          worker_path("kolo_check_worker"), "--counts", "1"}),
                                seconds(120));
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("nosuch0 (KOLO_GLOO_IFACE)"), std::string::npos) << wrong.err;
}

TEST(KolorunSsh, MpiAcrossHostsThroughOpenMpisSshLauncher) {
  if (!KOLO_HAVE_MPI) GTEST_SKIP() << "built without MPI";
  KOLO_NEED_TEST_HOSTS(2, hosts);
  const std::string list = hosts->names[0] + ":2," + hosts->names[1] + ":2";
  RunResult r = run_kolorun(over_ssh(*hosts, list,
                                     {"--backend", "mpi", "--timeout", "60", "--tag-output",
                                      worker_path("kolo_check_worker"), "--quick"}),
                            seconds(240), kMpiEnv);
  expect_check_passed(r, 4, "mpi");
  EXPECT_NE(tagged_lines(r.out, 3).front().find("cross_rank=1 cross_size=2"), std::string::npos);
  expect_no_orphans(*hosts);
}

// The pid each rank printed first ("pid=<pid> rank=<r>"); empty until all did.
std::vector<int> worker_pids(const std::string& out, int np) {
  std::vector<int> pids;
  for (int rank = 0; rank < np; ++rank) {
    const auto lines = tagged_lines(out, rank);
    if (lines.empty() || int_values(lines.front(), "pid").empty()) return {};
    pids.push_back(int_values(lines.front(), "pid").front());
  }
  return pids;
}

// 4 workers over 2 hosts: rank 0 sleeps (exit_worker --rank 0 with a 10-minute
// delay), so ranks 1-3 wait for it in kolo::init's rendezvous; nobody ends on
// its own. Returns the pids in rank order.
std::vector<int> start_waiting_workers(const TestHosts& hosts,
                                       std::unique_ptr<KolorunProcess>* run) {
  const std::string list = hosts.names[0] + ":2," + hosts.names[1] + ":2";
  *run = std::make_unique<KolorunProcess>(
      over_ssh(hosts, list,
               {"--grace", "2", "--timeout", "300", "--tag-output", worker_path("exit_worker"),
                "--rank", "0", "--delay-ms", "600000", "--wait", "collective"}));
  std::vector<int> pids;
  (*run)->wait_for_stdout(
      [&](const std::string& out) {
        pids = worker_pids(out, 4);
        return !pids.empty();
      },
      seconds(60));
  return pids;
}

TEST(KolorunSsh, SigkillOfAFarWorkerStopsEveryWorkerOnEveryHost) {
  KOLO_NEED_TEST_HOSTS(2, hosts);
  std::unique_ptr<KolorunProcess> run;
  const std::vector<int> pids = start_waiting_workers(*hosts, &run);
  ASSERT_EQ(pids.size(), 4u);
  // Rank 3 runs on the far host (the hosts share this machine's pid
  // namespace, so its pid can be signalled from here).
  const auto on_far = host_pids(hosts->names[1]);
  ASSERT_NE(std::find(on_far.begin(), on_far.end(), pids[3]), on_far.end())
      << "rank 3 (pid " << pids[3] << ") is not on " << hosts->names[1];
  ASSERT_EQ(kill(pids[3], SIGKILL), 0);
  RunResult r = run->wait(seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  const auto lines = r.err_lines();
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back().rfind("kolorun: rank 3 (pid ", 0), 0u) << r.err;
  EXPECT_NE(lines.back().find("ssh to " + hosts->names[1]), std::string::npos) << lines.back();
  EXPECT_NE(lines.back().find("SIGKILL on " + hosts->names[1]), std::string::npos) << lines.back();
  EXPECT_NE(lines.back().find("stopped 3 other workers"), std::string::npos) << lines.back();
  for (int pid : pids) EXPECT_TRUE(kolorun_test::wait_gone(pid, seconds(15))) << pid;
  expect_no_orphans(*hosts);
}

TEST(KolorunSsh, CtrlCStopsEveryWorkerOnEveryHost) {
  KOLO_NEED_TEST_HOSTS(2, hosts);
  std::unique_ptr<KolorunProcess> run;
  const std::vector<int> pids = start_waiting_workers(*hosts, &run);
  ASSERT_EQ(pids.size(), 4u);
  ASSERT_EQ(kill(run->pid(), SIGINT), 0);
  RunResult r = run->wait(seconds(60));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 130) << r.err;
  for (int pid : pids) EXPECT_TRUE(kolorun_test::wait_gone(pid, seconds(15))) << pid;
  expect_no_orphans(*hosts);
}

TEST(KolorunSsh, CheckBuildRunsOnEveryRemoteHost) {
  KOLO_NEED_TEST_HOSTS(2, hosts);
  RunResult r = run_kolorun(
      {"--check-build", "-H", hosts->names[0] + "," + hosts->names[1] + ",kolo-no-such-host",
       "--ssh-command", hosts->ssh_command},
      seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << "an unreachable host must fail the check\n" << r.out;
  EXPECT_NE(r.out.find("Available Communicator Backends:"), std::string::npos) << r.out;
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(r.out.find("kolorun --check-build on " + hosts->names[k] + ": the same as this host"),
              std::string::npos)
        << r.out;
  }
  EXPECT_NE(r.out.find("kolorun --check-build on kolo-no-such-host: failed ("), std::string::npos)
      << r.out;
  RunResult good = run_kolorun(
      {"--check-build", "-H", hosts->names[0], "--ssh-command", hosts->ssh_command}, seconds(60));
  EXPECT_EQ(good.exit_code, 0) << good.out << good.err;
}

}  // namespace
}  // namespace kolo::hosts_test

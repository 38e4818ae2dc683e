// Failure propagation and signals: when one worker fails, or kolorun is
// signalled, every worker is gone afterwards (their pids no longer exist).
#include <gtest/gtest.h>
#include <signal.h>

#include "kolorun_harness.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Every pid a worker printed ("pid=" and "child_pid=") must be gone.
void expect_all_gone(const std::string& output, size_t expected_count) {
  std::vector<int> pids = int_values(output, "pid");
  std::vector<int> children = int_values(output, "child_pid");
  pids.insert(pids.end(), children.begin(), children.end());
  EXPECT_EQ(pids.size(), expected_count) << output;
  for (int pid : pids) {
    EXPECT_TRUE(wait_gone(pid, seconds(5))) << "process " << pid << " outlived kolorun";
  }
}

std::string last_line(const RunResult& r) {
  auto lines = r.err_lines();
  return lines.empty() ? "" : lines.back();
}

TEST(KolorunFailure, OneWorkerExits3AndTheOthersAreStopped) {
  RunResult r = run_kolorun({"-np", "4", "--tag-output", worker_path("exit_worker"), "--rank", "1",
                             "--code", "3", "--delay-ms", "1000"},
                            seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 3);
  std::string report = last_line(r);
  EXPECT_EQ(report.rfind("kolorun: rank 1 (pid ", 0), 0u) << r.err;
  EXPECT_NE(report.find("exited with code 3"), std::string::npos) << report;
  EXPECT_NE(report.find("\"exit_worker: rank 1 failing on purpose\""), std::string::npos) << report;
  EXPECT_NE(report.find("tagged [1,1]"), std::string::npos) << report;
  EXPECT_NE(report.find("stopped 3 other workers"), std::string::npos) << report;
  // Exactly one line from kolorun itself.
  int kolorun_lines = 0;
  for (const auto& line : r.err_lines()) kolorun_lines += line.rfind("kolorun:", 0) == 0 ? 1 : 0;
  EXPECT_EQ(kolorun_lines, 1) << r.err;
  expect_all_gone(r.out, 4);
}

TEST(KolorunFailure, AWorkerKilledBySignalIsNamed) {
  RunResult r = run_kolorun({"-np", "2", "--tag-output", worker_path("exit_worker"), "--rank", "0",
                             "--kill-self", "--delay-ms", "1000"},
                            seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_NE(last_line(r).find("rank 0 (pid "), std::string::npos) << r.err;
  EXPECT_NE(last_line(r).find("killed by signal 9 (SIGKILL)"), std::string::npos) << r.err;
  expect_all_gone(r.out, 2);
}

TEST(KolorunFailure, WorkersIgnoringSigtermAreKilledAfterTheGrace) {
  RunResult r =
      run_kolorun({"-np", "3", "--grace", "0.5", "--tag-output", worker_path("exit_worker"),
                   "--rank", "2", "--code", "4", "--delay-ms", "1000", "--ignore-sigterm"},
                  seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_NE(last_line(r).find("needed SIGKILL"), std::string::npos) << r.err;
  expect_all_gone(r.out, 3);
}

TEST(KolorunFailure, WorkersChildrenAreNotLeftBehind) {
  RunResult r = run_kolorun({"-np", "2", "--tag-output", worker_path("exit_worker"), "--rank", "1",
                             "--child", "--delay-ms", "1000"},
                            seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 3);
  expect_all_gone(r.out, 4);  // two workers and a sleeping grandchild each
}

TEST(KolorunFailure, Rank0OnlyStillReportsTheFailedRanksLastLine) {
  RunResult r = run_kolorun(
      {"-np", "2", "--rank0-only", worker_path("exit_worker"), "--rank", "1", "--code", "5"},
      seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 5);
  std::string report = last_line(r);
  EXPECT_NE(report.find("rank 1"), std::string::npos) << report;
  EXPECT_NE(report.find("failing on purpose"), std::string::npos) << report;
  EXPECT_NE(report.find("--rank0-only discarded it"), std::string::npos) << report;
  // Rank 1's line appears once: quoted in the report, not printed by itself.
  size_t first = r.err.find("exit_worker: rank 1 failing");
  ASSERT_NE(first, std::string::npos);
  EXPECT_EQ(r.err.find("exit_worker: rank 1 failing", first + 1), std::string::npos) << r.err;
}

void expect_signal_stops_everything(int signal_number, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"-np", "3", "--grace", "1", "--tag-output"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back(worker_path("exit_worker"));  // no --rank: every rank waits
  KolorunProcess kolorun(args);
  ASSERT_TRUE(kolorun.wait_for_stdout(
      [](const std::string& out) { return int_values(out, "pid").size() == 3; }, seconds(30)))
      << "workers did not start";
  kill(kolorun.pid(), signal_number);
  RunResult r = kolorun.wait(seconds(30));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + signal_number);
  EXPECT_NE(r.err.find("kolorun: received SIG"), std::string::npos) << r.err;
  expect_all_gone(r.out, 3);
}

TEST(KolorunFailure, SigtermToKolorunStopsEveryWorker) {
  expect_signal_stops_everything(SIGTERM, {});
}

TEST(KolorunFailure, SigintToKolorunStopsEveryWorker) {
  expect_signal_stops_everything(SIGINT, {});
}

TEST(KolorunFailure, SigkillToKolorunLeavesNoOrphans) {
  KolorunProcess kolorun({"-np", "3", "--tag-output", worker_path("exit_worker")});
  ASSERT_TRUE(kolorun.wait_for_stdout(
      [](const std::string& out) { return int_values(out, "pid").size() == 3; }, seconds(30)));
  kill(kolorun.pid(), SIGKILL);
  RunResult r = kolorun.wait(seconds(30));
  EXPECT_EQ(r.term_signal, SIGKILL);
  expect_all_gone(r.out, 3);  // the kernel's parent-death signal took them
}

TEST(KolorunFailure, JobTimeoutStopsTheJob) {
  RunResult r =
      run_kolorun({"-np", "2", "--job-timeout", "0.5", "--tag-output", worker_path("exit_worker")},
                  seconds(30));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_NE(last_line(r).find("--job-timeout 0.5 s"), std::string::npos) << r.err;
  expect_all_gone(r.out, 2);
}

TEST(KolorunFailure, AllWorkersExitingZeroIsSuccess) {
  RunResult r = run_kolorun({"-np", "4", worker_path("env_worker")}, seconds(30));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.err.find("kolorun:"), std::string::npos) << r.err;
}

// Remote workers (through fake_ssh): a failure on the "remote" host stops the
// local workers, and a local failure stops the remote ones by closing their
// ssh's stdin (the remote script then SIGTERMs them).
TEST(KolorunFailure, RemoteFailureIsReportedWithItsHost) {
  RunResult r = run_kolorun(
      {"-H", "localhost:1,fakehost:2", "--ssh-command", worker_path("fake_ssh"), "--tag-output",
       worker_path("exit_worker"), "--rank", "2", "--code", "3", "--delay-ms", "1000"},
      seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(last_line(r).find("rank 2 (pid "), std::string::npos) << r.err;
  EXPECT_NE(last_line(r).find("ssh to fakehost) exited with code 3"), std::string::npos) << r.err;
  expect_all_gone(r.out, 3);
}

TEST(KolorunFailure, LocalFailureStopsRemoteWorkers) {
  RunResult r =
      run_kolorun({"-H", "localhost:1,fakehost:2", "--ssh-command", worker_path("fake_ssh"),
                   "--grace", "3", "--tag-output", worker_path("exit_worker"), "--rank", "0",
                   "--code", "6", "--delay-ms", "1000"},
                  seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 6);
  EXPECT_NE(last_line(r).find("rank 0 (pid "), std::string::npos) << r.err;
  EXPECT_EQ(last_line(r).find("needed SIGKILL"), std::string::npos)
      << "the remote script should have stopped its workers within the grace: " << r.err;
  expect_all_gone(r.out, 3);
}

}  // namespace
}  // namespace kolo::kolorun_test

// Parameter-server faults through kolorun, with real processes:
//  - a server SIGKILLed mid-training is a RuntimeFault naming it on every
//    worker (the torch tier's PsUnderKolorun, run by every rank), never a
//    hang, and kolorun exits non-zero naming the dead rank;
//  - the example (--strategy ps-async) with its server killed from outside
//    ends within a bounded time, kolorun non-zero and naming the server's rank;
//  - a worker SIGKILLed mid-training under --restart-workers is restarted,
//    rejoins the async job, and the job succeeds with its updates resumed;
//    without restarts left, the same death fails the job;
//  - a worker frozen (SIGSTOP) in mode ssp is evicted by the server and
//    killed by kolorun, which restarts it (or, without restarts, ends the job
//    naming it): the healthy worker is never blamed or restarted; the
//    example (--strategy ps-ssp) with a worker stopped from outside finishes.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "kolorun_harness.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

TEST(PsFaultUnderKolorun, AKilledServerIsAnErrorNamingItOnEveryWorker) {
  if (access(torch_tests_path().c_str(), X_OK) != 0) {
    GTEST_SKIP() << torch_tests_path() << " is not built (kolo_torch needs libtorch-dev)";
  }
  const RunResult r = run_kolorun(
      {"-np", "2", "--servers", "1", "--timeout", "60", "--grace", "60", torch_tests_path(),
       "--gtest_filter=PsUnderKolorun.AKilledServerIsAnErrorOnEveryWorker"},
      seconds(240));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  // Both workers saw the fault, named the server, and passed.
  EXPECT_EQ(count_of(r.out, "parameter server 0 (world rank 2) is gone"), 2u) << r.out << r.err;
  EXPECT_EQ(count_of(r.out, "ps under kolorun: worker 0 at step"), 1u) << r.out;
  EXPECT_EQ(count_of(r.out, "ps under kolorun: worker 1 at step"), 1u) << r.out;
  EXPECT_EQ(count_of(r.out, "[  PASSED  ] 1 test."), 2u) << r.out << r.err;
  EXPECT_NE(r.err.find("kolorun: rank 2 (parameter server 0; pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("killed by signal 9"), std::string::npos) << r.err;
}

// Worker 1 SIGKILLs itself mid-training (the torch tier's
// PsUnderKolorun.AKilledWorkerRejoinsTheAsyncJob); kolorun restarts it, it
// rejoins the running server, and the job succeeds, the server counting
// worker 1's pushes before and after.
TEST(PsFaultUnderKolorun, AKilledWorkerIsRestartedAndRejoins) {
  if (access(torch_tests_path().c_str(), X_OK) != 0) {
    GTEST_SKIP() << torch_tests_path() << " is not built (kolo_torch needs libtorch-dev)";
  }
  const RunResult r = run_kolorun(
      {"-np", "2", "--servers", "1", "--restart-workers", "1", "--timeout", "60",
       torch_tests_path(), "--gtest_filter=PsUnderKolorun.AKilledWorkerRejoinsTheAsyncJob"},
      seconds(240));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("kolorun: rank 1 (worker 1; pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("killed by signal 9 (SIGKILL); restarting it to rejoin the parameter "
                       "servers (restart 1 of --restart-workers 1)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(count_of(r.out, "ps rejoin: worker 1 dies at step 20"), 1u) << r.out;
  EXPECT_EQ(count_of(r.out, "ps rejoin: worker 1 (restart 1) continues at step"), 1u) << r.out;
  EXPECT_EQ(count_of(r.out, "ps rejoin: server 0: worker 1 pushed 40, rejoined 1 time(s)"), 1u)
      << r.out;
  // Worker 0, the server and the restarted worker 1 passed.
  EXPECT_EQ(count_of(r.out, "[  PASSED  ] 1 test."), 3u) << r.out << r.err;
}

// The budget spent: a worker that fails again is the job's failure.
TEST(PsFaultUnderKolorun, RestartsBeyondTheBudgetFailTheJob) {
  if (access(torch_tests_path().c_str(), X_OK) != 0) {
    GTEST_SKIP() << torch_tests_path() << " is not built (kolo_torch needs libtorch-dev)";
  }
  const RunResult r = run_kolorun(
      {"-np", "2", "--servers", "1", "--restart-workers", "0", "--timeout", "60",
       torch_tests_path(), "--gtest_filter=PsUnderKolorun.AKilledWorkerRejoinsTheAsyncJob"},
      seconds(240));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err.find("restarting it"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kolorun: rank 1 (worker 1; pid"), std::string::npos) << r.err;
}

// Worker 1 stops itself (the torch tier's
// PsUnderKolorun.AFrozenSspWorkerIsEvictedAndRejoins): the server evicts
// it, kolorun kills and restarts it, it rejoins, and the job succeeds;
// worker 0 is the one rank never restarted.
TEST(PsFaultUnderKolorun, AFrozenWorkerIsEvictedRestartedAndRejoins) {
  if (access(torch_tests_path().c_str(), X_OK) != 0) {
    GTEST_SKIP() << torch_tests_path() << " is not built (kolo_torch needs libtorch-dev)";
  }
  const RunResult r = run_kolorun(
      {"-np", "2", "--servers", "1", "--restart-workers", "1", "--timeout", "60",
       torch_tests_path(), "--gtest_filter=PsUnderKolorun.AFrozenSspWorkerIsEvictedAndRejoins"},
      seconds(240));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("kolorun: rank 1 (worker 1; pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("parameter server 0 evicted it: it sent nothing for"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("; killing it"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("killed by signal 9 (SIGKILL); restarting it to rejoin the parameter "
                       "servers (restart 1 of --restart-workers 1)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(count_of(r.err, "restarting it"), 1u) << r.err;
  EXPECT_EQ(r.err.find("rank 0 (worker 0"), std::string::npos) << r.err;
  EXPECT_EQ(count_of(r.out, "ps eviction: worker 1 freezes at step 10"), 1u) << r.out;
  EXPECT_EQ(count_of(r.out, "ps eviction: worker 1 (restart 1) continues at step"), 1u) << r.out;
  EXPECT_EQ(count_of(r.out, "ps eviction: server 0: worker 1 pushed 20, rejoined 1 time(s)"), 1u)
      << r.out;
  EXPECT_EQ(count_of(r.out, "[  PASSED  ] 1 test."), 3u) << r.out << r.err;
}

// No restart left: the frozen worker is still the one killed, and kolorun's
// last line names it as evicted, not the healthy worker or the server.
TEST(PsFaultUnderKolorun, AFrozenWorkerWithoutRestartsEndsTheJobNamingIt) {
  if (access(torch_tests_path().c_str(), X_OK) != 0) {
    GTEST_SKIP() << torch_tests_path() << " is not built (kolo_torch needs libtorch-dev)";
  }
  const RunResult r =
      run_kolorun({"-np", "2", "--servers", "1", "--timeout", "60", torch_tests_path(),
                   "--gtest_filter=PsUnderKolorun.AFrozenSspWorkerIsEvictedAndRejoins"},
                  seconds(240));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err.find("restarting it"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kolorun: rank 1 (worker 1; pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(") was evicted (parameter server 0 evicted it: it sent nothing for"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("and killed by signal 9 (SIGKILL)"), std::string::npos) << r.err;
}

TEST(PsFaultUnderKolorun, TheExampleWithItsServerKilledStops) {
  const std::string example = KOLO_BINARY_DIR "/examples/fashion_mnist/fashion_mnist";
  const std::string data = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  if (access(example.c_str(), X_OK) != 0 || access(data.c_str(), R_OK) != 0) {
    GTEST_SKIP() << "needs " << example << " (libtorch-dev) and " << data
                 << " (dataset-fashion-mnist)";
  }
  KolorunProcess job({"-np", "2", "--servers", "1", example, "--strategy", "ps-async",
                      "--train-subset=20000", "--test-subset=100", "--batch-size=32", "--threads=1",
                      "--epochs=1", "--progress-lines=0"});
  ASSERT_TRUE(job.wait_for_stdout(
      [](const std::string& out) { return out.find("Epoch 1/1") != std::string::npos; },
      seconds(120)));
  const pid_t server = child_with_env(job.pid(), "KOLO_RANK=2");
  ASSERT_GT(server, 0);
  ASSERT_EQ(kill(server, SIGKILL), 0);
  const RunResult r = job.wait(seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("kolorun: rank 2 (parameter server 0; pid " + std::to_string(server)),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("Test loss"), std::string::npos) << r.out;
}

// The example as the reliability report ran it: --strategy ps-ssp with
// --restart-workers, worker 0 stopped from outside (SIGSTOP) mid-epoch.
// The server evicts it after 9/10 of --timeout, kolorun kills and restarts
// it, and the job ends well: worker 1, the healthy one, is never restarted
// or blamed. The restarted worker trains its epoch on its own engine (its
// collectives never wait for worker 1) and prints the test accuracy.
TEST(PsFaultUnderKolorun, TheExampleWithAFrozenSspWorkerRestartsItAndFinishes) {
  const std::string example = KOLO_BINARY_DIR "/examples/fashion_mnist/fashion_mnist";
  const std::string data = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  if (access(example.c_str(), X_OK) != 0 || access(data.c_str(), R_OK) != 0) {
    GTEST_SKIP() << "needs " << example << " (libtorch-dev) and " << data
                 << " (dataset-fashion-mnist)";
  }
  KolorunProcess job({"-np", "2", "--servers", "1", "--restart-workers", "2", "--timeout", "10",
                      example, "--strategy", "ps-ssp", "--max-staleness", "1",
                      "--train-subset=20000", "--test-subset=100", "--batch-size=32", "--threads=1",
                      "--epochs=2", "--progress-lines=0"});
  // Stopped at the start of its first epoch: worker 1 still has most of its
  // two epochs to train when the restarted worker 0 rejoins (a server whose
  // every worker has finished ends, and a worker restarted after that finds
  // no job to rejoin).
  ASSERT_TRUE(job.wait_for_stdout(
      [](const std::string& out) { return out.find("Epoch 1/2") != std::string::npos; },
      seconds(120)));
  const pid_t worker0 = child_with_env(job.pid(), "KOLO_RANK=0");
  ASSERT_GT(worker0, 0);
  ASSERT_EQ(kill(worker0, SIGSTOP), 0);
  const RunResult r = job.wait(seconds(180));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("kolorun: rank 0 (worker 0; pid " + std::to_string(worker0) +
                       " on localhost): parameter server 0 evicted it: it sent nothing for"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("restarting it to rejoin the parameter servers (restart 1 of "
                       "--restart-workers 2)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(count_of(r.err, "restarting it"), 1u) << r.err;
  EXPECT_EQ(r.err.find("rank 1 (worker 1"), std::string::npos) << r.err;
  EXPECT_FALSE(numbers_after(r.out, "test accuracy: ").empty()) << r.out;
}

}  // namespace
}  // namespace kolo::kolorun_test

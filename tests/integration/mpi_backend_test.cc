// The mpi backend under mpirun: the collective correctness matrix with 1, 2
// and 4 ranks (4 oversubscribed on this 2-core machine), a count mismatch that
// must give every rank a ContractError and a non-zero exit, and a late rank
// that must give every rank a TimeoutError; never a hang.
// Each run has a watchdog that kills mpirun's whole process group.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#if KOLO_HAVE_MPI

namespace {

using Clock = std::chrono::steady_clock;

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  bool timed_out = false;
  std::string output;  // stdout and stderr
};

// Runs argv (with OpenMPI's run-as-root permission added to the environment)
// in its own process group, collecting its output; kills the group after
// `timeout`.
RunResult run(const std::vector<std::string>& argv, std::chrono::seconds timeout) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    std::vector<char*> args;
    for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also here: no race with the child's own call
  close(pipe_fds[1]);

  RunResult result;
  const auto deadline = Clock::now() + timeout;
  char chunk[4096];
  bool open = true;
  while (open) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    pollfd fd{pipe_fds[0], POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(std::min<long>(left.count(), 200))) > 0) {
      const ssize_t n = read(pipe_fds[0], chunk, sizeof(chunk));
      if (n <= 0) {
        open = false;
      } else {
        result.output.append(chunk, n);
      }
    }
  }
  close(pipe_fds[0]);
  int status = 0;
  // mpirun has closed its output; give it a moment to exit, then insist.
  const auto exit_deadline = Clock::now() + std::chrono::seconds(10);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > exit_deadline) {
      result.timed_out = true;
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(-pid, SIGKILL);  // no orphan ranks, whatever happened
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

std::vector<std::string> mpirun(int ranks, const std::vector<std::string>& worker_args) {
  std::vector<std::string> argv = {KOLO_MPIEXEC, "--oversubscribe", "-np", std::to_string(ranks),
                                   std::string(KOLO_BINARY_DIR) + "/tests/mpi_collectives_worker"};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

class MpiBackendTest : public ::testing::TestWithParam<int> {};

TEST_P(MpiBackendTest, CollectiveMatrixPasses) {
  const int ranks = GetParam();
  const RunResult result = run(mpirun(ranks, {}), std::chrono::seconds(240));
  ASSERT_FALSE(result.timed_out) << "mpirun did not finish:\n" << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output.find("FAIL"), std::string::npos) << result.output;
  for (int rank = 0; rank < ranks; ++rank) {
    EXPECT_NE(result.output.find("rank " + std::to_string(rank) + ": 0 mismatches"),
              std::string::npos)
        << result.output;
  }
}

class MpiPointToPointTest : public ::testing::TestWithParam<int> {};

TEST_P(MpiPointToPointTest, PatternsPass) {
  const int ranks = GetParam();
  const RunResult result = run(mpirun(ranks, {"--p2p"}), std::chrono::seconds(240));
  ASSERT_FALSE(result.timed_out) << "mpirun did not finish:\n" << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output.find("FAIL"), std::string::npos) << result.output;
  for (int rank = 0; rank < ranks; ++rank) {
    EXPECT_NE(result.output.find("rank " + std::to_string(rank) + ": 0 mismatches"),
              std::string::npos)
        << result.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, MpiPointToPointTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "np" + std::to_string(info.param);
                         });

INSTANTIATE_TEST_SUITE_P(Ranks, MpiBackendTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "np" + std::to_string(info.param);
                         });

TEST(MpiBackendMismatchTest, EveryRankGetsContractErrorAndExitsNonZero) {
  constexpr int kRanks = 3;
  const RunResult result = run(mpirun(kRanks, {"--mismatch"}), std::chrono::seconds(60));
  ASSERT_FALSE(result.timed_out) << "mpirun hung:\n" << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_NE(result.output.find("rank " + std::to_string(rank) +
                                 ": ContractError: kolo allreduce: count differs across ranks: "
                                 "rank 0 passed 1000, rank 1 passed 999"),
              std::string::npos)
        << result.output;
  }
}

// A send and its receive disagree on the count: a ContractError on both
// sides, and the next transfer on the same communicator still arrives.
TEST(MpiBackendMismatchTest, PointToPointCountMismatchIsContractErrorOnBothSides) {
  const RunResult result = run(mpirun(2, {"--p2p-mismatch"}), std::chrono::seconds(60));
  ASSERT_FALSE(result.timed_out) << "mpirun hung:\n" << result.output;
  EXPECT_NE(result.output.find("rank 0: ContractError: kolo send to rank 1 (tag 4) on rank 0: "
                               "rank 0 sends 1000 f32 elements, rank 1 receives 999 f32"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("rank 1: ContractError: kolo recv from rank 0 (tag 4) on rank 1: "
                               "rank 0 sends 1000 f32 elements, rank 1 receives 999 f32"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("rank 1: after the mismatch received 7"), std::string::npos)
      << result.output;
}

// A rank that arrives late: the ranks that made the call time out (per-call
// timeout of 1 s) with TimeoutError instead of hanging, and the job ends.
// They skip MPI_Finalize after the fault (it is collective: it would wait
// for the late rank), so mpirun ends the job at once and stops rank 1, which
// never gets to its own call (MpiStalledRank in stall_test.cc: a rank that
// never arrives).
TEST(MpiBackendTimeoutTest, LatePeerGivesTimeoutErrorOnTheRanksThatCalled) {
  constexpr int kRanks = 3;
  const RunResult result = run(mpirun(kRanks, {"--late-peer"}), std::chrono::seconds(60));
  ASSERT_FALSE(result.timed_out) << "mpirun hung:\n" << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output.find("succeeded"), std::string::npos) << result.output;
  for (int rank : {0, 2}) {
    EXPECT_NE(result.output.find("rank " + std::to_string(rank) +
                                 ": TimeoutError: kolo mpi allreduce (rank " +
                                 std::to_string(rank) + " of 3): timed out after 1000 ms"),
              std::string::npos)
        << result.output;
  }
}

}  // namespace

#endif  // KOLO_HAVE_MPI

// Collectives end to end through kolorun: -np 1, 2 and 4 (4 oversubscribes this
// 2-core machine) on each backend kolorun starts itself, and --backend mpi,
// which kolorun hands to mpirun. Workers run the collective check matrix.
#include <gtest/gtest.h>

#include <tuple>

#include "kolorun_harness.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

// Checks that every rank printed its placement with `backend` and passed.
void expect_check_passed(const RunResult& r, int np, const std::string& backend) {
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < np; ++rank) {
    auto lines = tagged_lines(r.out, rank);
    ASSERT_FALSE(lines.empty()) << "rank " << rank << " printed nothing\n" << r.out;
    EXPECT_EQ(lines.front().rfind(
                  "rank=" + std::to_string(rank) + " size=" + std::to_string(np) + " ", 0),
              0u)
        << lines.front();
    EXPECT_NE(lines.front().find(" backend=" + backend + " "), std::string::npos) << lines.front();
    EXPECT_EQ(lines.back(), "check passed") << r.out;
  }
}

// The matrix is smaller when ranks outnumber the cores (they take turns).
std::vector<std::string> check_args(int np) {
  std::vector<std::string> args = {worker_path("kolo_check_worker")};
  if (np > 2) args.push_back("--quick");
  return args;
}

class KolorunBackends : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(KolorunBackends, CollectiveCheckPasses) {
  const auto& [backend, np] = GetParam();
  if (backend == "gloo" && !KOLO_HAVE_GLOO) GTEST_SKIP() << "built without gloo";
  std::vector<std::string> args = {"-np", std::to_string(np), "--backend", backend, "--timeout",
                                   "60",  "--tag-output"};
  auto worker = check_args(np);
  args.insert(args.end(), worker.begin(), worker.end());
  expect_check_passed(run_kolorun(args, seconds(240)), np, backend);
}

INSTANTIATE_TEST_SUITE_P(Local, KolorunBackends,
                         ::testing::Combine(::testing::Values("shm", "gloo"),
                                            ::testing::Values(1, 2, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_np" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Point-to-point transfers on the world communicator of each backend kolorun
// starts itself (mpi: tests/integration/mpi_backend_test.cc).
class KolorunPointToPoint : public ::testing::TestWithParam<std::string> {};

TEST_P(KolorunPointToPoint, CheckPasses) {
  const std::string backend = GetParam();
  if (backend == "gloo" && !KOLO_HAVE_GLOO) GTEST_SKIP() << "built without gloo";
  expect_check_passed(run_kolorun({"-np", "3", "--backend", backend, "--timeout", "60",
                                   "--tag-output", worker_path("kolo_check_worker"), "--p2p"},
                                  seconds(240)),
                      3, backend);
}

INSTANTIATE_TEST_SUITE_P(Backends, KolorunPointToPoint, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

TEST(KolorunBackendChoice, AutomaticIsShmOnOneHost) {
  expect_check_passed(run_kolorun({"-np", "2", "--tag-output", worker_path("kolo_check_worker"),
                                   "--counts", "0,1,1000"},
                                  seconds(120)),
                      2, "shm");
}

// A stray KOLO_JOB_SECRET in kolorun's environment (left from an elastic job,
// say): kolorun's store of a one-host job has no secret, so it is not passed
// on and kolorun says so. Before, every rank waited out its 60 s timeout for the
// store's handshake and then blamed an overloaded server.
TEST(KolorunBackendChoice, AStrayJobSecretIsNotPassedToTheWorkers) {
  const RunResult r = run_kolorun({"-np", "2", "--timeout", "60", "--tag-output",
                                   worker_path("kolo_check_worker"), "--counts", "0,1,1000"},
                                  seconds(40), {"KOLO_JOB_SECRET=0123456789abcdef"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.err.find("kolorun: KOLO_JOB_SECRET is set, but kolorun makes its store's secret "
                       "itself"),
            std::string::npos)
      << r.err;
  expect_check_passed(r, 2, "shm");
}

// Two "hosts" (one reached through fake_ssh): automatic choice is gloo, and the
// remote rank finds the store at this host's name.
TEST(KolorunBackendChoice, AutomaticIsGlooAcrossHosts) {
  if (!KOLO_HAVE_GLOO) GTEST_SKIP() << "built without gloo";
  expect_check_passed(run_kolorun({"-H", "localhost:1,fakehost:1", "--ssh-command",
                                   worker_path("fake_ssh"), "--timeout", "60", "--tag-output",
                                   worker_path("kolo_check_worker"), "--counts", "0,1,1000"},
                                  seconds(120)),
                      2, "gloo");
}

// A worker that dies while the others wait in a collective: kolorun stops them.
class KolorunCollectiveFailure : public ::testing::TestWithParam<std::string> {};

TEST_P(KolorunCollectiveFailure, PeerExitDuringACollectiveStopsTheJob) {
  const std::string backend = GetParam();
  if (backend == "gloo" && !KOLO_HAVE_GLOO) GTEST_SKIP() << "built without gloo";
  RunResult r = run_kolorun(
      {"-np", "3", "--backend", backend, "--grace", "2", "--tag-output", worker_path("exit_worker"),
       "--rank", "1", "--code", "3", "--delay-ms", "1000", "--wait", "collective"},
      seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("kolorun: rank 1 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with code 3"), std::string::npos) << r.err;
  auto pids = int_values(r.out, "pid");
  EXPECT_EQ(pids.size(), 3u);
  for (int pid : pids) EXPECT_TRUE(wait_gone(pid, seconds(5))) << pid;
}

INSTANTIATE_TEST_SUITE_P(Local, KolorunCollectiveFailure, ::testing::Values("shm", "gloo"));

// --backend mpi: kolorun execs mpirun with the equivalent options.
class KolorunMpi : public ::testing::TestWithParam<int> {};

TEST_P(KolorunMpi, CollectiveCheckPassesThroughMpirun) {
  if (!KOLO_HAVE_MPI) GTEST_SKIP() << "built without MPI";
  const int np = GetParam();
  std::vector<std::string> args = {"-np", std::to_string(np), "--backend", "mpi", "--timeout",
                                   "60",  "--tag-output"};
  auto worker = check_args(np);
  args.insert(args.end(), worker.begin(), worker.end());
  // OpenMPI refuses to run as root without these (CI runs as root).
  expect_check_passed(run_kolorun(args, seconds(240),
                                  {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"}),
                      np, "mpi");
}

INSTANTIATE_TEST_SUITE_P(Local, KolorunMpi, ::testing::Values(1, 2, 4));

TEST(KolorunMpiArgs, Rank0OnlyIsRefusedWithMpi) {
  if (!KOLO_HAVE_MPI) GTEST_SKIP() << "built without MPI";
  RunResult r = run_kolorun(
      {"-np", "2", "--backend", "mpi", "--rank0-only", worker_path("kolo_check_worker")},
      seconds(30));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--rank0-only does not work with --backend mpi"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace kolo::kolorun_test

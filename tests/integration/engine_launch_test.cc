// The engine end to end: workers started by kolorun (shm, gloo) and by mpirun
// (through kolorun --backend mpi) run tests/workers/engine_worker.cc on the
// default runtime's engine: reordered allreduces, allgather, a process set of
// a subset of the ranks, join.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "kolorun_harness.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

class EngineLaunch : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(EngineLaunch, EngineWorkerPassesOnEveryRank) {
  const auto& [backend, np] = GetParam();
  if (backend == "gloo" && !KOLO_HAVE_GLOO) GTEST_SKIP() << "built without gloo";
  if (backend == "mpi" && !KOLO_HAVE_MPI) GTEST_SKIP() << "built without MPI";
  const RunResult r =
      run_kolorun({"-np", std::to_string(np), "--backend", backend, "--timeout", "60",
                   "--tag-output", worker_path("engine_worker")},
                  seconds(120), {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < np; ++rank) {
    const auto lines = tagged_lines(r.out, rank);
    ASSERT_FALSE(lines.empty()) << "rank " << rank << " printed nothing\n" << r.out << r.err;
    EXPECT_EQ(lines.back().rfind("rank " + std::to_string(rank) + ": engine ok (" + backend, 0), 0u)
        << lines.back() << "\n"
        << r.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineLaunch,
                         ::testing::Combine(::testing::Values("shm", "gloo", "mpi"),
                                            ::testing::Values(1, 3)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_np" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace kolo::kolorun_test

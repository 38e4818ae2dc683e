// A frozen rank (tests/workers/stall_worker.cc stops itself with SIGSTOP)
// under kolorun: the engine's NegotiationWatch (engine/stall_inspector.h)
// names it within KOLO_STALL_WARNING_SECONDS and fails the others' pending
// work after KOLO_STALL_SHUTDOWN_SECONDS, far before --timeout; kolorun then
// stops the job, SIGKILLing the stopped rank after --grace. Point-to-point
// waits that deadlock are warned about and ended the same way.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "kolorun_harness.h"
#include "temp_dir.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class FrozenRank : public ::testing::TestWithParam<std::string> {};

TEST_P(FrozenRank, IsNamedByTheStallWarningAndFailsTheOthersAfterTheShutdownTime) {
  const std::string backend = GetParam();
  if (backend == "gloo" && !KOLO_HAVE_GLOO) GTEST_SKIP() << "built without gloo";
  // --timeout 600: only the stall check can end this within the watchdog.
  const RunResult r = run_kolorun(
      {"-np", "3", "--backend", backend, "--timeout", "600", "--grace", "1", "--tag-output",
       worker_path("stall_worker"), "--steps", "100000", "--freeze", "2@20"},
      seconds(60), {"KOLO_STALL_WARNING_SECONDS=1", "KOLO_STALL_SHUTDOWN_SECONDS=3"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.err,
                       "[1,0]<stderr>:kolo[rank 0] warning: stall: the negotiation has "
                       "waited"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "(more than KOLO_STALL_WARNING_SECONDS 1.0) for rank 2: frozen"))
      << r.err;
  EXPECT_FALSE(contains(r.err, "kolo[rank 1] warning: stall")) << "one rank warns\n" << r.err;
  // Every survivor's pending allreduce fails with the recoverable error,
  // naming rank 2, not with a timeout. Both fail at about the same moment, and
  // the first to exit makes kolorun stop the job, which may end the other
  // before it prints its own error (as in MpiStalledRank below): so at least
  // one survivor reports it, and any survivor that reports a fault reports
  // this one.
  int reported = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const auto lines = tagged_lines(r.out, rank);
    ASSERT_FALSE(lines.empty()) << r.out << r.err;
    if (!contains(lines.back(), "rank " + std::to_string(rank) + ": fault: ")) continue;
    ++reported;
    EXPECT_TRUE(contains(lines.back(), "KOLO_STALL_SHUTDOWN_SECONDS")) << lines.back();
    EXPECT_TRUE(contains(lines.back(), "[failed ranks: 2]")) << lines.back();
  }
  EXPECT_GE(reported, 1) << r.out << r.err;
  EXPECT_FALSE(contains(r.out + r.err, "timed out after 600000 ms")) << r.out << r.err;
}

INSTANTIATE_TEST_SUITE_P(Backends, FrozenRank, ::testing::Values("shm", "gloo"));

// Point-to-point waits that can never match, through kolorun (each rank
// receives from the next what nobody sends: a pipeline's stages on different
// plans deadlock this way): every rank is warned about by the world's stall
// watch after KOLO_STALL_WARNING_SECONDS, naming its peer and tag, and fails
// after KOLO_STALL_SHUTDOWN_SECONDS, far before --timeout; kolorun ends the
// job non-zero.
class P2PDeadlock : public ::testing::TestWithParam<std::string> {};

TEST_P(P2PDeadlock, IsWarnedAboutAndFailsNamingPeerAndTagUnderKolorun) {
  const std::string backend = GetParam();
  if (backend == "gloo" && !KOLO_HAVE_GLOO) GTEST_SKIP() << "built without gloo";
  const auto start = std::chrono::steady_clock::now();
  const RunResult r =
      run_kolorun({"-np", "3", "--backend", backend, "--timeout", "600", "--grace", "1",
                   "--tag-output", worker_path("stall_worker"), "--p2p-deadlock", "1"},
                  seconds(60), {"KOLO_STALL_WARNING_SECONDS=1", "KOLO_STALL_SHUTDOWN_SECONDS=3"});
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_LT(elapsed, 30.0) << r.out << r.err;
  // Each rank's own wait is named, before any of them gives up.
  for (int rank = 0; rank < 3; ++rank) {
    const std::string wait = "recv from rank " + std::to_string((rank + 1) % 3) + " (tag " +
                             std::to_string(100 + rank) + ")";
    EXPECT_TRUE(contains(r.err, "stall: rank " + std::to_string(rank) + " has waited")) << r.err;
    EXPECT_TRUE(contains(r.err, wait + ": rank " + std::to_string((rank + 1) % 3) +
                                    " has not posted the matching send"))
        << r.err;
  }
  // The first rank to fail makes kolorun stop the others: at least one
  // reports the fault, and it names the shutdown setting, not a timeout.
  int reported = 0;
  for (int rank = 0; rank < 3; ++rank) {
    const auto lines = tagged_lines(r.out, rank);
    if (lines.empty() || !contains(lines.back(), "rank " + std::to_string(rank) + ": fault: ")) {
      continue;
    }
    ++reported;
    EXPECT_TRUE(contains(lines.back(), "KOLO_STALL_SHUTDOWN_SECONDS")) << lines.back();
    EXPECT_TRUE(contains(lines.back(), "(tag 10")) << lines.back();
  }
  EXPECT_GE(reported, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "kolorun: rank ")) << r.err;
  EXPECT_FALSE(contains(r.out + r.err, "timed out after 600000 ms")) << r.out << r.err;
}

INSTANTIATE_TEST_SUITE_P(Backends, P2PDeadlock, ::testing::Values("shm", "gloo"));

#if KOLO_HAVE_MPI
// --backend mpi with a frozen rank and the stall check off: the others' allreduce
// times out (--timeout 3) and they exit. Before, rank 0 then blocked forever in
// MPI_Finalize at exit (collective, and rank 2 never arrives), so mpirun never
// exited; now a process whose MPI communicator failed skips it, mpirun ends
// the job and kills rank 2, and OpenMPI's shared-memory segments (in a
// directory of the test's own) are gone.
TEST(MpiStalledRank, TheJobEndsWithinTheTimeoutAndLeavesNoSegment) {
  const kolo::testing::TempDir temp("kolo-test-vader", "/dev/shm");
  const std::string& dir = temp.path();
  const RunResult r =
      run_kolorun({"-np", "3", "--backend", "mpi", "--timeout", "3", "--tag-output",
                   worker_path("stall_worker"), "--steps", "100000", "--freeze", "2@20"},
                  seconds(60),
                  {"KOLO_STALL_SHUTDOWN_SECONDS=0", "OMPI_MCA_btl_vader_backing_directory=" + dir,
                   "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"});
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  // Ranks 0 and 1 both time out after 3 s; the first to exit makes mpirun
  // end the job, which may kill the other before it prints its own timeout.
  int reported = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const auto lines = tagged_lines(r.out, rank);
    ASSERT_FALSE(lines.empty()) << r.out << r.err;
    if (contains(lines.back(), "timed out after 3000 ms")) {
      ++reported;
    } else {
      EXPECT_TRUE(contains(lines.back(), "pid="))
          << "neither its timeout nor its start: " << lines.back();
    }
  }
  EXPECT_GE(reported, 1) << r.out << r.err;
  const std::vector<int> pids = int_values(r.out, "pid");
  EXPECT_EQ(pids.size(), 3u) << r.out;
  for (int pid : pids) EXPECT_TRUE(wait_gone(pid, seconds(10))) << "pid " << pid << " outlived";
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    left.push_back(entry.path().filename());
  }
  EXPECT_TRUE(left.empty()) << "left in " << dir << ": " << left.front();
}
#endif

// Every segment name of these workers' pids is gone from /dev/shm.
void expect_no_segments_of(const std::vector<int>& pids) {
  for (int pid : pids) {
    const std::string prefix = "kolo-" + std::to_string(pid) + "-";
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
      const std::string name = entry.path().filename();
      EXPECT_NE(name.rfind(prefix, 0), 0u) << "left behind: /dev/shm/" << name;
    }
  }
}

// Rank 1 exits before its init while rank 0 waits in the shm rendezvous,
// holding the segment's name; kolorun stops rank 0 with SIGTERM, which ends
// it before it can unlink the name. kolorun removes it when it reaps rank 0.
// Before, /dev/shm/kolo-<pid>-* stayed until a later job's stale-segment
// sweep.
TEST(ShmRendezvous, AnInterruptedInitLeavesNoSegment) {
  const RunResult r =
      run_kolorun({"-np", "2", "--backend", "shm", "--timeout", "60", "--tag-output",
                   worker_path("stall_worker"), "--exit-before-init", "1"},
                  seconds(40));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  const std::vector<int> pids = int_values(r.out, "pid");
  ASSERT_EQ(pids.size(), 2u) << r.out;
  expect_no_segments_of(pids);
}

// A rank that exits 0 before its init (an early return) while rank 0 waits
// for it in the shm rendezvous: kolorun announces the exit in its store and
// rank 0 fails at once naming it, instead of waiting out --timeout.
TEST(ShmRendezvous, ARankThatExits0BeforeInitFailsTheOthersAtOnceNamingIt) {
  const auto start = std::chrono::steady_clock::now();
  const RunResult r =
      run_kolorun({"-np", "2", "--backend", "shm", "--timeout", "120", "--tag-output",
                   worker_path("stall_worker"), "--exit-0-before-init", "1"},
                  seconds(100));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(60)) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.out.find("rank 0: fault: kolo::init: rank 1 exited with code 0 before joining"),
            std::string::npos)
      << r.out << r.err;
  EXPECT_NE(r.out.find("[failed ranks: 1]"), std::string::npos) << r.out;
  expect_no_segments_of(int_values(r.out, "pid"));
}

// Signals whose default action would end kolorun with no message (SIGQUIT
// dumps core, SIGALRM terminates) while rank 0 holds a shm rendezvous
// segment: kolorun stops the job, names the signal, and leaves no segment.
void expect_signal_during_rendezvous_cleans_up(int signal_number, const std::string& name) {
  KolorunProcess kolorun({"-np", "2", "--backend", "shm", "--timeout", "60", "--grace", "1",
                          "--tag-output", worker_path("stall_worker"), "--sleep-before-init", "1"});
  ASSERT_TRUE(kolorun.wait_for_stdout(
      [](const std::string& out) { return int_values(out, "pid").size() == 2; }, seconds(30)))
      << "workers did not start";
  std::this_thread::sleep_for(std::chrono::seconds(1));  // rank 0 is in the rendezvous
  kill(kolorun.pid(), signal_number);
  const RunResult r = kolorun.wait(seconds(30));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 128 + signal_number) << r.err;
  EXPECT_NE(r.err.find("kolorun: received " + name), std::string::npos) << r.err;
  const std::vector<int> pids = int_values(r.out, "pid");
  for (int pid : pids) EXPECT_TRUE(wait_gone(pid, seconds(5))) << pid << " outlived kolorun";
  expect_no_segments_of(pids);
}

TEST(ShmRendezvous, SigquitToKolorunStopsTheJobAndLeavesNoSegment) {
  expect_signal_during_rendezvous_cleans_up(SIGQUIT, "SIGQUIT");
}

TEST(ShmRendezvous, SigalrmToKolorunStopsTheJobAndLeavesNoSegment) {
  expect_signal_during_rendezvous_cleans_up(SIGALRM, "SIGALRM");
}

// SIGUSR1 (a batch system's "checkpoint now") is passed on to the workers,
// as mpirun does; these do not handle it, so they die of it and the job
// fails naming the signal, with no segment left.
TEST(ShmRendezvous, Sigusr1IsPassedOnToTheWorkers) {
  KolorunProcess kolorun({"-np", "2", "--backend", "shm", "--timeout", "60", "--tag-output",
                          worker_path("stall_worker"), "--sleep-before-init", "1"});
  ASSERT_TRUE(kolorun.wait_for_stdout(
      [](const std::string& out) { return int_values(out, "pid").size() == 2; }, seconds(30)))
      << "workers did not start";
  std::this_thread::sleep_for(std::chrono::seconds(1));
  kill(kolorun.pid(), SIGUSR1);
  const RunResult r = kolorun.wait(seconds(30));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("kolorun: passed SIGUSR1 on to 2 local worker(s)"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("SIGUSR1"), r.err.rfind("SIGUSR1")) << "the failure names it: " << r.err;
  expect_no_segments_of(int_values(r.out, "pid"));
}

}  // namespace
}  // namespace kolo::kolorun_test

// Parameter-server faults through kolorun, with real processes:
//  - a server SIGKILLed mid-training is a RuntimeFault naming it on every
//    worker (the torch tier's PsUnderKolorun, run by every rank), never a
//    hang, and kolorun exits non-zero naming the dead rank;
//  - the example (--strategy ps-async) with its server killed from outside
//    ends within a bounded time, kolorun non-zero and naming the server's rank.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kolorun_harness.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

std::string torch_tests_path() { return KOLO_BINARY_DIR "/tests/kolo_torch_tests"; }

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

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
  EXPECT_NE(r.err.find("kolorun: rank 2 (pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("killed by signal 9"), std::string::npos) << r.err;
}

// The pid of kolorun's child whose environment holds `variable` (-1 if none).
pid_t child_with(pid_t kolorun, const std::string& variable) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    const std::string text((std::istreambuf_iterator<char>(stat)), {});
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos) continue;
    if (std::stol(text.substr(paren + 4)) != kolorun) continue;  // ") S <ppid>"
    std::ifstream environ(entry.path() / "environ", std::ios::binary);
    for (std::string v; std::getline(environ, v, '\0');) {
      if (v == variable) return static_cast<pid_t>(std::stol(name));
    }
  }
  return -1;
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
  const pid_t server = child_with(job.pid(), "KOLO_RANK=2");
  ASSERT_GT(server, 0);
  ASSERT_EQ(kill(server, SIGKILL), 0);
  const RunResult r = job.wait(seconds(120));
  ASSERT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("kolorun: rank 2 (pid " + std::to_string(server)), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("Test loss"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kolo::kolorun_test

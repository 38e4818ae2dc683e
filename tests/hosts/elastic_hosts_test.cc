// Elastic training across the test hosts (test_hosts.h): the discovery script
// names three hosts; pulling one host's cable makes the others fail within
// their timeout and re-form without it, and plugging it back lets a worker
// on it rejoin. Training ends with the same model as a fault-free run.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "kolorun_harness.h"
#include "temp_dir.h"
#include "test_hosts.h"

namespace kolo::hosts_test {
namespace {

using kolorun_test::KolorunProcess;
using kolorun_test::run_kolorun;
using kolorun_test::RunResult;
using kolorun_test::worker_path;
using std::chrono::seconds;

std::vector<std::string> worker_args(const std::string& journal) {
  return {worker_path("elastic_worker"),
          "--epochs",
          "30",
          "--samples",
          "96",
          "--batch",
          "12",
          "--commit-every",
          "3",
          "--step-ms",
          "60",
          "--journal",
          journal};
}

std::vector<double> final_w(const std::string& out) {
  const size_t at = out.find("final_w=");
  if (at == std::string::npos) return {};
  std::istringstream in(out.substr(at + 8, out.find('\n', at) - at - 8));
  std::vector<double> w;
  for (std::string item; std::getline(in, item, ',');) w.push_back(std::stod(item));
  return w;
}

// The world sizes of the steps the workers logged so far ("step <epoch>
// <batch> <round> <size> ..." lines of every journal), in no particular order.
std::vector<int> step_sizes(const std::string& dir) {
  std::vector<int> sizes;
  for (int id = 0; id < 64; ++id) {
    std::ifstream file(dir + "/worker" + std::to_string(id) + ".log");
    for (std::string line; std::getline(file, line);) {
      std::istringstream in(line);
      std::string kind;
      long epoch, batch, round;
      int size;
      if (in >> kind >> epoch >> batch >> round >> size && kind == "step") sizes.push_back(size);
    }
  }
  return sizes;
}

bool wait_for_step_of_size(const std::string& dir, int size, size_t after,
                           std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto sizes = step_sizes(dir);
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] == size && sizes.size() > after) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(ElasticAcrossHosts, AHostWhoseLinkGoesDownIsLeftOutAndRejoinsWhenItComesBack) {
  KOLO_NEED_TEST_HOSTS(3, hosts);
  const kolo::testing::TempDir temp("kolo-elastic-hosts");
  const std::string hosts_file = temp.file("hosts");
  std::ofstream(hosts_file) << hosts->names[0] << ":1\n"
                            << hosts->names[1] << ":1\n"
                            << hosts->names[2] << ":1\n";
  const std::string script = temp.file("discover.sh");
  std::ofstream(script) << "#!/bin/sh\ncat " << hosts_file << "\n";
  chmod(script.c_str(), 0755);

  std::vector<std::string> args = {"--host-discovery-script",
                                   script,
                                   "--discovery-interval",
                                   "0.2",
                                   "--min-np",
                                   "2",
                                   "--max-np",
                                   "3",
                                   "--max-restarts",
                                   "10",
                                   "--timeout",
                                   "5",
                                   "--cooldown",
                                   "1",
                                   "--grace",
                                   "2",
                                   "--ssh-command",
                                   hosts->ssh_command};
  const auto worker = worker_args(temp.path());
  args.insert(args.end(), worker.begin(), worker.end());
  KolorunProcess run(args);
  ASSERT_TRUE(wait_for_step_of_size(temp.path(), 3, 0, seconds(60))) << "never trained on 3 hosts";
  const std::string far = hosts->names[2];
  set_link(far, false);
  // The others time out on the far host within --timeout and re-form.
  const bool shrank = wait_for_step_of_size(temp.path(), 2, 0, seconds(60));
  const size_t steps_before_return = step_sizes(temp.path()).size();
  set_link(far, true);
  ASSERT_TRUE(shrank) << "no step of 2 workers after " << far << "'s link went down";
  RunResult r = run.wait(seconds(180));
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // A worker on the far host rejoined once its link was back.
  const auto sizes = step_sizes(temp.path());
  bool rejoined = false;
  for (size_t i = steps_before_return; i < sizes.size(); ++i) rejoined = rejoined || sizes[i] == 3;
  EXPECT_TRUE(rejoined) << r.err;
  EXPECT_NE(r.err.find("host " + far + " set aside"), std::string::npos) << r.err;
  // The same model as 2 workers without faults (the data path does not depend
  // on the world size, up to the rounding of the sum).
  const kolo::testing::TempDir reference_dir("kolo-elastic-hosts-ref");
  RunResult reference = run_kolorun(
      [&] {
        std::vector<std::string> a = {"-np", "2"};
        const auto w = worker_args(reference_dir.path());
        a.insert(a.end(), w.begin(), w.end());
        return a;
      }(),
      seconds(120));
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  const auto w = final_w(r.out);
  const auto ref = final_w(reference.out);
  ASSERT_EQ(w.size(), ref.size()) << r.out;
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], ref[i], 1e-9) << "w[" << i << "]";
}

}  // namespace
}  // namespace kolo::hosts_test

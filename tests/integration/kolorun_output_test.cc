// What kolorun gives its workers and how their output comes back.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "kolo/core/topology.h"
#include "kolorun_harness.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

// "NAME=value" from a rank's tagged stdout, or "" when absent.
std::string value_of(const std::vector<std::string>& lines, const std::string& name) {
  for (const auto& line : lines) {
    if (line.rfind(name + "=", 0) == 0) return line.substr(name.size() + 1);
  }
  return "";
}

TEST(KolorunOutput, EachWorkerGetsItsVariables) {
  RunResult r = run_kolorun({"-np", "3", "--tag-output", worker_path("env_worker")}, seconds(30));
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::set<std::string> ports, job_ids;
  const std::string threads = std::to_string(std::max(1, usable_cores_here() / 3));
  for (int rank = 0; rank < 3; ++rank) {
    auto lines = tagged_lines(r.out, rank);
    EXPECT_EQ(value_of(lines, "KOLO_RANK"), std::to_string(rank));
    EXPECT_EQ(value_of(lines, "KOLO_SIZE"), "3");
    EXPECT_EQ(value_of(lines, "KOLO_LOCAL_RANK"), std::to_string(rank));
    EXPECT_EQ(value_of(lines, "KOLO_LOCAL_SIZE"), "3");
    EXPECT_EQ(value_of(lines, "KOLO_CROSS_RANK"), "0");
    EXPECT_EQ(value_of(lines, "KOLO_CROSS_SIZE"), "1");
    EXPECT_EQ(value_of(lines, "KOLO_STORE_ADDR"), "127.0.0.1");
    EXPECT_EQ(value_of(lines, "KOLO_BACKEND"), "");  // automatic unless --backend
    EXPECT_EQ(value_of(lines, "OMP_NUM_THREADS"), threads);
    EXPECT_EQ(value_of(lines, "OPENBLAS_NUM_THREADS"), threads);
    EXPECT_EQ(value_of(lines, "MKL_NUM_THREADS"), threads);
    ports.insert(value_of(lines, "KOLO_STORE_PORT"));
    job_ids.insert(value_of(lines, "KOLO_JOB_ID"));
  }
  ASSERT_EQ(ports.size(), 1u);
  EXPECT_GT(std::atoi(ports.begin()->c_str()), 0);
  ASSERT_EQ(job_ids.size(), 1u);
  EXPECT_FALSE(job_ids.begin()->empty());

  // Another run is another job.
  RunResult again =
      run_kolorun({"-np", "1", "--tag-output", worker_path("env_worker")}, seconds(30));
  EXPECT_NE(value_of(tagged_lines(again.out, 0), "KOLO_JOB_ID"), *job_ids.begin());
}

TEST(KolorunOutput, BackendTimeoutAndUserThreadSettingsReachTheWorkers) {
  RunResult r = run_kolorun({"-np", "2", "--backend", "gloo", "--timeout", "7.5", "--tag-output",
                             worker_path("env_worker")},
                            seconds(30), {"OMP_NUM_THREADS=5", "MKL_NUM_THREADS"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    auto lines = tagged_lines(r.out, rank);
    EXPECT_EQ(value_of(lines, "KOLO_BACKEND"), "gloo");
    EXPECT_EQ(value_of(lines, "KOLO_TIMEOUT_SECONDS"), "7.5");
    // The user's choice wins, for the variables left unset too (libtorch's
    // BLAS obeys MKL_NUM_THREADS before OMP_NUM_THREADS).
    EXPECT_EQ(value_of(lines, "OMP_NUM_THREADS"), "5");
    EXPECT_EQ(value_of(lines, "MKL_NUM_THREADS"), "5");
  }
}

TEST(KolorunOutput, TaggedLinesLikeMpirun) {
  RunResult r = run_kolorun({"-np", "2", "--tag-output", worker_path("env_worker"), "--partial",
                             "-np", "7", "--tag-output", "two words"},
                            seconds(30));
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream out(r.out);
  std::string line;
  while (std::getline(out, line)) {
    EXPECT_TRUE(line.rfind("[1,0]<stdout>:", 0) == 0 || line.rfind("[1,1]<stdout>:", 0) == 0)
        << line;
  }
  for (int rank = 0; rank < 2; ++rank) {
    auto lines = tagged_lines(r.out, rank);
    // Everything after the program is the program's, untouched.
    EXPECT_EQ(value_of(lines, "args"), "-np|7|--tag-output|two words");
    // A last line without a newline is still delivered, whole.
    EXPECT_EQ(lines.back(), "no newline at the end");
    EXPECT_EQ(tagged_lines(r.err, rank, "stderr"),
              (std::vector<std::string>{"stderr line from " + std::to_string(rank)}));
  }
}

TEST(KolorunOutput, PlainOutputByDefault) {
  RunResult r = run_kolorun({"-np", "2", worker_path("env_worker")}, seconds(30));
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("[1,"), std::string::npos);
  EXPECT_NE(r.out.find("\nKOLO_RANK=0\n"), std::string::npos);
  EXPECT_NE(r.out.find("\nKOLO_RANK=1\n"), std::string::npos);
  EXPECT_NE(r.err.find("stderr line from 0\n"), std::string::npos);
  EXPECT_NE(r.err.find("stderr line from 1\n"), std::string::npos);
}

TEST(KolorunOutput, Rank0OnlyAndOutputDir) {
  char dir_template[] = "/tmp/kolorun-logs-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  RunResult r = run_kolorun(
      {"-np", "3", "--rank0-only", "--output-dir", dir, worker_path("env_worker")}, seconds(30));
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("KOLO_RANK=0\n"), std::string::npos);
  EXPECT_EQ(r.out.find("KOLO_RANK=1"), std::string::npos);
  EXPECT_EQ(r.out.find("KOLO_RANK=2"), std::string::npos);
  EXPECT_EQ(r.err, "stderr line from 0\n");
  for (int rank = 0; rank < 3; ++rank) {
    std::ifstream log(dir + "/rank." + std::to_string(rank) + ".log");
    std::stringstream content;
    content << log.rdbuf();
    EXPECT_NE(content.str().find("KOLO_RANK=" + std::to_string(rank) + "\n"), std::string::npos)
        << content.str();
    EXPECT_NE(content.str().find("stderr line from " + std::to_string(rank)), std::string::npos);
  }
  std::string command = "rm -rf " + dir;
  EXPECT_EQ(std::system(command.c_str()), 0);
}

// A log file that cannot be written (here a file-size limit; a full disk
// fails the same way with ENOSPC) is reported at once and in kolorun's last
// line, and the job's exit code says so. Before, the logs were truncated
// silently and kolorun exited 0.
TEST(KolorunOutput, OutputDirWriteErrorsAreReported) {
  char dir_template[] = "/tmp/kolorun-logs-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit small = old_limit;
  small.rlim_cur = 1024;  // bytes; kolorun inherits it, its log files hit it
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  KolorunProcess process(
      {"-np", "2", "--output-dir", dir, worker_path("env_worker"), std::string(3000, 'x')});
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const RunResult r = process.wait(seconds(30));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("kolorun: cannot write " + dir +
                       "/rank.0.log: File too large; rank 0's "
                       "output from here on is missing from it"),
            std::string::npos)
      << r.err;
  const auto lines = r.err_lines();
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back().rfind("kolorun: --output-dir: the log files of rank(s) 0, 1 are "
                               "incomplete (" +
                                   dir + "/rank.0.log: File too large)",
                               0),
            0u)
      << lines.back();
  // The terminal still got everything.
  EXPECT_NE(r.out.find(std::string(3000, 'x')), std::string::npos);
  std::string command = "rm -rf " + dir;
  EXPECT_EQ(std::system(command.c_str()), 0);
}

TEST(KolorunOutput, LocalhostHostListRunsLocally) {
  RunResult r =
      run_kolorun({"-H", "localhost:2", "--tag-output", worker_path("env_worker")}, seconds(30));
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    auto lines = tagged_lines(r.out, rank);
    EXPECT_EQ(value_of(lines, "KOLO_SIZE"), "2");  // -np defaults to every slot
    EXPECT_EQ(value_of(lines, "KOLO_LOCAL_SIZE"), "2");
    EXPECT_EQ(value_of(lines, "KOLO_CROSS_SIZE"), "1");
    EXPECT_EQ(value_of(lines, "KOLO_STORE_ADDR"), "127.0.0.1");
    EXPECT_EQ(value_of(lines, "FAKE_SSH_HOST"), "");
  }
}

// A second "host" reached through fake_ssh, which runs the remote script of
// ssh_command.h on this machine: the whole remote path except the network.
TEST(KolorunOutput, RemoteHostThroughTheSshScript) {
  RunResult r = run_kolorun(
      {"-H", "localhost:1,fakehost:2", "--ssh-command", worker_path("fake_ssh"), "--tag-output",
       "-x", "EXTRA_SETTING=1", worker_path("env_worker"), "it's", "two words"},
      seconds(30), {"KOLO_LOG_LEVEL=info"});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  char hostname[256] = {};
  gethostname(hostname, sizeof(hostname) - 1);
  for (int rank = 0; rank < 3; ++rank) {
    auto lines = tagged_lines(r.out, rank);
    bool remote = rank > 0;
    EXPECT_EQ(value_of(lines, "FAKE_SSH_HOST"), remote ? "fakehost" : "") << rank;
    EXPECT_EQ(value_of(lines, "KOLO_RANK"), std::to_string(rank));
    EXPECT_EQ(value_of(lines, "KOLO_SIZE"), "3");
    EXPECT_EQ(value_of(lines, "KOLO_LOCAL_RANK"), remote ? std::to_string(rank - 1) : "0");
    EXPECT_EQ(value_of(lines, "KOLO_LOCAL_SIZE"), remote ? "2" : "1");
    EXPECT_EQ(value_of(lines, "KOLO_CROSS_RANK"), remote ? "1" : "0");
    EXPECT_EQ(value_of(lines, "KOLO_CROSS_SIZE"), "2");
    // The store is bound to 0.0.0.0 and named by an address other hosts reach
    // (this host's name maps to loopback here, and fakehost does not resolve:
    // the first interface that is up).
    EXPECT_EQ(value_of(lines, "KOLO_STORE_ADDR"), reachable_address(hostname, {"fakehost"}));
    EXPECT_EQ(value_of(lines, "KOLO_JOB_SECRET").size(), 64u);  // an authenticated store
    EXPECT_EQ(value_of(lines, "KOLO_LOG_LEVEL"), "info");       // forwarded
    EXPECT_EQ(value_of(lines, "EXTRA_SETTING"), "1");           // -x NAME=VALUE
    EXPECT_EQ(value_of(lines, "args"), "it's|two words");
    // Remote thread counts are computed on the remote host (nproc / its workers).
    EXPECT_EQ(value_of(lines, "OMP_NUM_THREADS"),
              std::to_string(std::max(1, usable_cores_here() / (remote ? 2 : 1))));
    EXPECT_EQ(tagged_lines(r.err, rank, "stderr"),
              (std::vector<std::string>{"stderr line from " + std::to_string(rank)}));
  }
}

}  // namespace
}  // namespace kolo::kolorun_test

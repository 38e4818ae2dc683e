// The workers' variables (launcher/worker_env.h).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "worker_env.h"

namespace kolo::launcher {
namespace {

ParentEnv env_of(std::map<std::string, std::string> values) {
  return [values](const std::string& name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

std::map<std::string, std::string> as_map(const std::vector<EnvVar>& vars) {
  return std::map<std::string, std::string>(vars.begin(), vars.end());
}

JobInfo sample_job() {
  JobInfo job;
  job.size = 6;
  job.store_addr = "node1";
  job.store_port = 29500;
  job.job_id = "node1-42-abcdef01";
  job.local_cores = 8;
  return job;
}

Placement sample_placement() {
  Placement p;
  p.rank = 4;
  p.host = "node2";
  p.local = false;
  p.local_rank = 1;
  p.local_size = 3;
  p.cross_rank = 1;
  p.cross_size = 2;
  return p;
}

TEST(LauncherEnv, BootstrapVariables) {
  JobInfo job = sample_job();
  auto vars = as_map(kolo_variables(sample_placement(), job));
  EXPECT_EQ(vars, (std::map<std::string, std::string>{{"KOLO_RANK", "4"},
                                                      {"KOLO_SIZE", "6"},
                                                      {"KOLO_LOCAL_RANK", "1"},
                                                      {"KOLO_LOCAL_SIZE", "3"},
                                                      {"KOLO_CROSS_RANK", "1"},
                                                      {"KOLO_CROSS_SIZE", "2"},
                                                      {"KOLO_STORE_ADDR", "node1"},
                                                      {"KOLO_STORE_PORT", "29500"},
                                                      {"KOLO_JOB_ID", "node1-42-abcdef01"},
                                                      {"HOROVOD_RANK", "4"},
                                                      {"HOROVOD_SIZE", "6"},
                                                      {"HOROVOD_LOCAL_RANK", "1"},
                                                      {"HOROVOD_LOCAL_SIZE", "3"},
                                                      {"HOROVOD_CROSS_RANK", "1"},
                                                      {"HOROVOD_CROSS_SIZE", "2"}}));
  job.backend = "gloo";
  job.timeout_seconds = 2.5;
  vars = as_map(kolo_variables(sample_placement(), job));
  EXPECT_EQ(vars["KOLO_BACKEND"], "gloo");
  EXPECT_EQ(vars["KOLO_TIMEOUT_SECONDS"], "2.5");
}

// One thread setting wins: a count the user gave in any of the variables
// goes to the others too (libtorch's BLAS obeys MKL_NUM_THREADS or
// OPENBLAS_NUM_THREADS before OMP_NUM_THREADS), not kolorun's share.
TEST(LauncherEnv, ThreadsAreTheCoresShareUnlessTheUserSetThem) {
  JobInfo job = sample_job();  // 8 cores, 3 workers on the host -> 2 threads each
  auto vars = as_map(local_thread_variables(sample_placement(), job, env_of({})));
  EXPECT_EQ(vars, (std::map<std::string, std::string>{{"OMP_NUM_THREADS", "2"},
                                                      {"OPENBLAS_NUM_THREADS", "2"},
                                                      {"MKL_NUM_THREADS", "2"}}));
  vars =
      as_map(local_thread_variables(sample_placement(), job, env_of({{"OMP_NUM_THREADS", "7"}})));
  EXPECT_EQ(vars.count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(vars["MKL_NUM_THREADS"], "7");
  EXPECT_EQ(vars["OPENBLAS_NUM_THREADS"], "7");
  vars =
      as_map(local_thread_variables(sample_placement(), job, env_of({{"MKL_NUM_THREADS", "5"}})));
  EXPECT_EQ(vars, (std::map<std::string, std::string>{{"OMP_NUM_THREADS", "5"},
                                                      {"OPENBLAS_NUM_THREADS", "5"}}));

  job.local_cores = 2;  // 4 workers on 2 cores: never below one thread
  Placement crowded = sample_placement();
  crowded.local_size = 4;
  EXPECT_EQ(as_map(local_thread_variables(crowded, job, env_of({})))["OMP_NUM_THREADS"], "1");
}

TEST(LauncherEnv, LocalEnvironmentReplacesAndAdds) {
  auto env = local_worker_environment({"PATH=/bin", "KOLO_RANK=9", "HOME=/root"},
                                      {{"KOLO_RANK", "1"}, {"KOLO_SIZE", "2"}});
  std::multiset<std::string> entries(env.begin(), env.end());
  EXPECT_EQ(entries,
            (std::multiset<std::string>{"PATH=/bin", "HOME=/root", "KOLO_RANK=1", "KOLO_SIZE=2"}));
}

// Each name once, the later entry winning (a -x NAME=VALUE after kolorun's
// own thread count, or a -x given twice).
TEST(LauncherEnv, LocalEnvironmentHasEachNameOnce) {
  auto env = local_worker_environment(
      {"PATH=/bin", "OMP_NUM_THREADS=8"},
      {{"KOLO_RANK", "1"}, {"OMP_NUM_THREADS", "2"}, {"A", "1"}, {"A", "2"}});
  std::multiset<std::string> entries(env.begin(), env.end());
  EXPECT_EQ(entries,
            (std::multiset<std::string>{"PATH=/bin", "KOLO_RANK=1", "OMP_NUM_THREADS=2", "A=2"}));
}

TEST(LauncherEnv, RemoteForwarding) {
  auto vars =
      forwarded_variables({"KOLO_LOG_LEVEL=debug", "KOLO_RANK=7", "OMP_NUM_THREADS=3", "HOME=/root",
                           "LD_LIBRARY_PATH=/opt/lib", "SECRET=x"},
                          {"LD_LIBRARY_PATH", "EXTRA=1", "UNSET_HERE"}, {{"KOLO_RANK", "1"}});
  auto map = as_map(vars);
  EXPECT_EQ(map,
            (std::map<std::string, std::string>{{"LD_LIBRARY_PATH", "/opt/lib"},
                                                {"EXTRA", "1"},
                                                {"KOLO_LOG_LEVEL", "debug"},
                                                {"OMP_NUM_THREADS", "3"},
                                                {"GLIBC_TUNABLES", "glibc.malloc.hugetlb=1"}}));
}

// Remote workers get kolorun's allocator default unless kolorun's
// environment or -x sets the variable (an empty value opts out).
TEST(LauncherEnv, RemoteAllocatorDefaultGivesWayToTheUsers) {
  EXPECT_EQ(as_map(forwarded_variables({"GLIBC_TUNABLES="}, {}, {}))["GLIBC_TUNABLES"], "");
  EXPECT_EQ(as_map(forwarded_variables({"GLIBC_TUNABLES=glibc.malloc.hugetlb=0"},
                                       {"GLIBC_TUNABLES=x"}, {}))["GLIBC_TUNABLES"],
            "x");
  ASSERT_EQ(allocator_variables().size(), 1u);
  EXPECT_EQ(allocator_variables()[0], (EnvVar{"GLIBC_TUNABLES", "glibc.malloc.hugetlb=1"}));
}

TEST(LauncherEnv, FormatsSecondsAsTheConfigReadsThem) {
  EXPECT_EQ(format_seconds(60), "60");
  EXPECT_EQ(format_seconds(0.5), "0.5");
  EXPECT_EQ(format_seconds(1e-3), "0.001");
}

TEST(LauncherEnv, JobIdsAreUniqueAndSafeForSegmentNames) {
  std::set<std::string> ids;
  for (int i = 0; i < 50; ++i) {
    std::string id = make_job_id();
    EXPECT_LT(id.size(), 64u);
    for (char c : id)
      EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 50u);
}

TEST(LauncherEnv, UsableCoresIsPositive) { EXPECT_GE(usable_cores(), 1); }

}  // namespace
}  // namespace kolo::launcher

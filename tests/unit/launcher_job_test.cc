// Job planning: checks before anything is spawned, and each worker's request
// (launcher/job.h), plus the mpirun command of --backend mpi (mpi_launch.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "job.h"
#include "mpi_launch.h"
#include "options.h"
#include "spawn.h"
#include "usage_error.h"

namespace kolo::launcher {
namespace {

LaunchOptions options_for(const std::vector<std::string>& args) {
  return parse_command_line(args).options;
}

PlanContext context() {
  PlanContext c;
  c.hostname = "me";
  c.path = "/usr/bin:/bin";
  c.compiled = {"shm", "gloo"};
  return c;
}

std::string plan_error(const std::vector<std::string>& args) {
  try {
    plan_job(options_for(args), context());
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

ParentEnv no_env() {
  return [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
}

bool contains(const std::vector<std::string>& items, const std::string& item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

TEST(LauncherJob, LocalPlanResolvesTheProgram) {
  JobPlan plan = plan_job(options_for({"-np", "2", "sh", "-c", "true"}), context());
  EXPECT_EQ(plan.placements.size(), 2u);
  EXPECT_FALSE(plan.any_remote);
  EXPECT_TRUE(plan.program_path == "/usr/bin/sh" || plan.program_path == "/bin/sh")
      << plan.program_path;
  EXPECT_EQ(plan.store_bind, "127.0.0.1");
  EXPECT_EQ(plan.store_addr, "127.0.0.1");
}

TEST(LauncherJob, RemoteHostsBindTheStoreToEveryInterface) {
  JobPlan plan = plan_job(options_for({"-H", "localhost:1,node2:2", "sh"}), context());
  EXPECT_EQ(plan.placements.size(), 3u);
  EXPECT_TRUE(plan.any_remote);
  EXPECT_EQ(plan.store_bind, "0.0.0.0");
  EXPECT_EQ(plan.store_addr, "me");
  JobPlan chosen =
      plan_job(options_for({"-H", "node2:2", "--store-addr", "10.1.1.1", "./x"}), context());
  EXPECT_EQ(chosen.store_addr, "10.1.1.1");
  EXPECT_TRUE(chosen.program_path.empty());  // not checked: no rank runs here
}

// More local workers than the host can run at once (its pid limit, thread
// limit or ulimit -u) are refused before any is spawned, naming the limit;
// workers placed on other hosts do not count against this one.
TEST(LauncherJob, RefusesMoreLocalWorkersThanTheHostRuns) {
  PlanContext c = context();
  c.process_limit = 4;
  std::string error;
  try {
    plan_job(options_for({"-np", "4", "sh"}), c);
  } catch (const UsageError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("4 workers on this host (-np 4), but it runs at most 4 processes"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("ulimit -u"), std::string::npos) << error;
  EXPECT_EQ(plan_job(options_for({"-np", "3", "sh"}), c).placements.size(), 3u);
  EXPECT_EQ(plan_job(options_for({"-H", "me:2,node2:8", "sh"}), c).placements.size(), 10u);
  EXPECT_GT(host_process_limit(), 0);  // Linux has kernel.pid_max
}

TEST(LauncherJob, ChecksBeforeSpawning) {
  EXPECT_NE(
      plan_error({"-np", "2", "no-such-program-kolo"}).find("is not an executable file in PATH"),
      std::string::npos);
  EXPECT_NE(plan_error({"-np", "2", "/etc/passwd"}).find("not an executable file"),
            std::string::npos);
  EXPECT_NE(plan_error({"-np", "2", "/no-such-dir-kolo/prog"}).find("does not exist"),
            std::string::npos);
  EXPECT_NE(plan_error({"-np", "2", "/tmp"}).find("is a directory"), std::string::npos);
  EXPECT_NE(plan_error({"-np", "2", "--backend", "mpi", "sh"}).find("has no mpi backend"),
            std::string::npos);
  EXPECT_NE(plan_error({"-H", "node2:2", "--backend", "shm", "sh"}).find("use --backend gloo"),
            std::string::npos);
  EXPECT_NE(plan_error({"-np", "3", "-H", "localhost:2", "sh"}).find("more than the 2 slots"),
            std::string::npos);
  EXPECT_NE(plan_error({"-H", "node2:1", "--ssh-command", "no-such-ssh", "sh"})
                .find("--ssh-command 'no-such-ssh'"),
            std::string::npos);
}

TEST(LauncherJob, NamesASymlinkLoopAsOne) {
  // A link that points at itself: stat fails with ELOOP, not ENOENT.
  char dir_template[] = "/tmp/kolo-loop-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string link = std::string(dir_template) + "/prog";
  ASSERT_EQ(symlink(link.c_str(), link.c_str()), 0);
  const std::string error = plan_error({"-np", "2", link});
  unlink(link.c_str());
  rmdir(dir_template);
  EXPECT_NE(error.find("is a loop of symbolic links"), std::string::npos) << error;
  EXPECT_EQ(error.find("does not exist"), std::string::npos) << error;
}

JobInfo sample_job() {
  JobInfo job;
  job.size = 3;
  job.store_addr = "me";
  job.store_port = 1234;
  job.job_id = "job";
  job.local_cores = 4;
  return job;
}

TEST(LauncherJob, LocalRequestRunsTheProgramWithTheVariables) {
  LaunchOptions options = options_for({"-np", "2", "-x", "EXTRA=1", "sh", "-c", "true"});
  JobPlan plan = plan_job(options, context());
  SpawnRequest request = worker_request(plan, options, plan.placements[1], sample_job(),
                                        {"PATH=/bin", "KOLO_RANK=99"}, no_env(), "/work");
  EXPECT_EQ(request.path, plan.program_path);
  EXPECT_EQ(request.argv, (std::vector<std::string>{"sh", "-c", "true"}));
  EXPECT_FALSE(request.stdin_pipe);
  EXPECT_TRUE(contains(request.env, "PATH=/bin"));
  EXPECT_TRUE(contains(request.env, "KOLO_RANK=1"));
  EXPECT_FALSE(contains(request.env, "KOLO_RANK=99"));
  EXPECT_TRUE(contains(request.env, "KOLO_LOCAL_SIZE=2"));
  EXPECT_TRUE(contains(request.env, "OMP_NUM_THREADS=2"));  // 4 cores / 2 local workers
  EXPECT_TRUE(contains(request.env, "EXTRA=1"));
  EXPECT_TRUE(contains(request.env, "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"));
  // kolorun's own GLIBC_TUNABLES (even empty) is inherited instead, as is a -x one.
  auto tuned = [](const std::string& name) -> std::optional<std::string> {
    if (name == "GLIBC_TUNABLES") return std::string("");
    return std::nullopt;
  };
  request = worker_request(plan, options, plan.placements[1], sample_job(),
                           {"PATH=/bin", "GLIBC_TUNABLES="}, tuned, "/work");
  EXPECT_TRUE(contains(request.env, "GLIBC_TUNABLES="));
  EXPECT_FALSE(contains(request.env, "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"));
  LaunchOptions given = options_for({"-np", "2", "-x", "GLIBC_TUNABLES=a=1", "sh"});
  request = worker_request(plan, given, plan.placements[1], sample_job(), {"PATH=/bin"}, no_env(),
                           "/work");
  EXPECT_TRUE(contains(request.env, "GLIBC_TUNABLES=a=1"));
  EXPECT_FALSE(contains(request.env, "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"));
}

TEST(LauncherJob, RemoteRequestGoesThroughSsh) {
  LaunchOptions options =
      options_for({"-H", "node1:1,node2:2", "--ssh-command", "sh", "./train", "a b"});
  JobPlan plan = plan_job(options, context());
  ASSERT_FALSE(plan.placements[2].local);
  SpawnRequest request =
      worker_request(plan, options, plan.placements[2], sample_job(),
                     {"PATH=/usr/bin:/bin", "KOLO_LOG_LEVEL=info"}, no_env(), "/work dir");
  ASSERT_EQ(request.argv.size(), 5u);
  EXPECT_EQ(request.argv[0], "sh");
  EXPECT_EQ(request.argv[3], "node2");
  const std::string& script = request.argv[4];
  EXPECT_EQ(script.rfind("cd '/work dir' && ", 0), 0u) << script;
  for (const std::string fragment :
       {"KOLO_RANK=2", "KOLO_LOCAL_RANK=1", "KOLO_LOCAL_SIZE=2", "KOLO_CROSS_RANK=1",
        "KOLO_CROSS_SIZE=2", "KOLO_STORE_ADDR=me", "KOLO_STORE_PORT=1234", "KOLO_LOG_LEVEL=info",
        "/ 2 ))", "GLIBC_TUNABLES=glibc.malloc.hugetlb=1", "./train 'a b' </dev/null"}) {
    EXPECT_NE(script.find(fragment), std::string::npos) << fragment << " in " << script;
  }
  EXPECT_TRUE(request.stdin_pipe);
}

// The job secret reaches a local worker in its environment and a remote one
// on ssh's stdin, never on a command line (every user's `ps` shows those),
// even when kolorun itself has KOLO_JOB_SECRET set.
TEST(LauncherJob, TheSecretIsOnNoCommandLine) {
  LaunchOptions options = options_for({"-H", "me:1,node2:1", "--ssh-command", "sh", "sh"});
  JobPlan plan = plan_job(options, context());
  JobInfo job = sample_job();
  job.secret = "00ff";
  const std::vector<std::string> parent = {"PATH=/bin", "KOLO_JOB_SECRET=stray"};
  SpawnRequest local =
      worker_request(plan, options, plan.placements[0], job, parent, no_env(), "/");
  EXPECT_TRUE(contains(local.env, "KOLO_JOB_SECRET=00ff"));
  EXPECT_FALSE(contains(local.env, "KOLO_JOB_SECRET=stray"));
  EXPECT_TRUE(local.stdin_data.empty());
  SpawnRequest remote =
      worker_request(plan, options, plan.placements[1], job, parent, no_env(), "/");
  for (const auto& arg : remote.argv) {
    EXPECT_EQ(arg.find("00ff"), std::string::npos) << arg;
    EXPECT_EQ(arg.find("stray"), std::string::npos) << arg;
  }
  EXPECT_TRUE(remote.stdin_pipe);
  EXPECT_EQ(remote.stdin_data, "00ff\n");
  EXPECT_NE(remote.argv.back().find("IFS= read -r KOLO_JOB_SECRET && export KOLO_JOB_SECRET && "),
            std::string::npos)
      << remote.argv.back();
}

// Without --store-addr, remote workers get the address reachable_address()
// picks for the remote hosts (the host name when the context has none).
TEST(LauncherJob, TheStoreAddressIsReachableFromTheRemoteHosts) {
  PlanContext c = context();
  std::vector<std::string> asked;
  c.reachable_address = [&](const std::vector<std::string>& remote) {
    asked = remote;
    return std::string("198.18.17.1");
  };
  JobPlan plan = plan_job(options_for({"-H", "localhost:1,node2:2,node3:1", "sh"}), c);
  EXPECT_EQ(plan.store_addr, "198.18.17.1");
  EXPECT_EQ(asked, (std::vector<std::string>{"node2", "node2", "node3"}));
  JobPlan given = plan_job(options_for({"-H", "node2:2", "--store-addr", "n0", "./x"}), c);
  EXPECT_EQ(given.store_addr, "n0");
}

TEST(LauncherMpi, BuildsTheEquivalentMpirunCommand) {
  LaunchOptions options =
      options_for({"-np", "4", "--backend", "mpi", "--timeout", "30", "--tag-output",
                   "--job-timeout", "9.5", "-x", "LD_LIBRARY_PATH", "./w", "arg"});
  auto argv = mpirun_command(options, {}, "/usr/bin/mpirun", 2, {"KOLO_LOG_LEVEL=info"}, no_env());
  EXPECT_EQ(argv, (std::vector<std::string>{"/usr/bin/mpirun",
                                            "-np",
                                            "4",
                                            "--oversubscribe",
                                            "--bind-to",
                                            "none",
                                            "--tag-output",
                                            "--timeout",
                                            "10",
                                            "-x",
                                            "KOLO_BACKEND=mpi",
                                            "-x",
                                            "KOLO_TIMEOUT_SECONDS=30",
                                            "-x",
                                            "OMP_NUM_THREADS=1",
                                            "-x",
                                            "OPENBLAS_NUM_THREADS=1",
                                            "-x",
                                            "MKL_NUM_THREADS=1",
                                            "-x",
                                            "KOLO_LOG_LEVEL",
                                            "-x",
                                            "GLIBC_TUNABLES=glibc.malloc.hugetlb=1",
                                            "-x",
                                            "LD_LIBRARY_PATH",
                                            "./w",
                                            "arg"}));
}

// The allocator default reaches every rank, unless the user's environment
// (passed on by name) or a -x entry (alone) says otherwise.
TEST(LauncherMpi, AllocatorDefaultGivesWayToTheUsers) {
  LaunchOptions plain = options_for({"-np", "2", "--backend", "mpi", "./w"});
  EXPECT_TRUE(contains(mpirun_command(plain, {}, "mpirun", 2, {}, no_env()),
                       "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"));
  auto parent = [](const std::string& name) -> std::optional<std::string> {
    if (name == "GLIBC_TUNABLES") return std::string("");
    return std::nullopt;
  };
  auto argv = mpirun_command(plain, {}, "mpirun", 2, {}, parent);
  EXPECT_TRUE(contains(argv, "GLIBC_TUNABLES"));
  EXPECT_FALSE(contains(argv, "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"));
  LaunchOptions given = options_for(
      {"-np", "2", "--backend", "mpi", "-x", "GLIBC_TUNABLES=glibc.malloc.arena_max=2", "./w"});
  argv = mpirun_command(given, {}, "mpirun", 2, {}, no_env());
  EXPECT_TRUE(contains(argv, "GLIBC_TUNABLES=glibc.malloc.arena_max=2"));
  EXPECT_FALSE(contains(argv, "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"));
}

TEST(LauncherMpi, HostListsAndRefusals) {
  LaunchOptions options = options_for({"-H", "a:2,b:2", "--backend", "mpi", "./w"});
  auto argv = mpirun_command(options, {{"a", 2}, {"b", 2}}, "mpirun", 2, {}, no_env());
  auto host = std::find(argv.begin(), argv.end(), "--host");
  ASSERT_NE(host, argv.end());
  EXPECT_EQ(*(host + 1), "a:2,b:2");
  EXPECT_FALSE(contains(argv, "--oversubscribe"));
  EXPECT_FALSE(contains(argv, "-np"));
  EXPECT_FALSE(contains(argv, "OMP_NUM_THREADS=1"));  // remote cores are unknown here

  LaunchOptions rank0 = options_for({"-np", "2", "--backend", "mpi", "--rank0-only", "./w"});
  EXPECT_THROW(mpirun_command(rank0, {}, "mpirun", 2, {}, no_env()), UsageError);
}

}  // namespace
}  // namespace kolo::launcher

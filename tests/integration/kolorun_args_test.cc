// kolorun's command line through the real binary: bad arguments are one line
// and start nothing; --check-build, --print-env-docs, --help, --version.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "kolo/core/config.h"
#include "kolo/version.h"
#include "kolorun_harness.h"

namespace kolo::kolorun_test {
namespace {

using std::chrono::seconds;

TEST(KolorunArgs, BadArgumentsGiveOneLineAndStartNothing) {
  char marker_template[] = "/tmp/kolorun-marker-XXXXXX";
  ASSERT_NE(mkdtemp(marker_template), nullptr);
  const std::string marker = std::string(marker_template) + "/started";
  const std::string not_executable = std::string(marker_template) + "/data.txt";
  std::ofstream(not_executable) << "not a program\n";
  // The program, if it ever ran, would leave the marker behind.
  const std::vector<std::string> program = {"sh", "-c", "touch " + marker};
  auto with_program = [&](std::vector<std::string> args) {
    args.insert(args.end(), program.begin(), program.end());
    return args;
  };
  struct Case {
    std::vector<std::string> args;
    std::string fragment;  // the message names the argument
  };
  const std::vector<Case> cases = {
      {with_program({"-np", "0"}), "-np 0"},
      {with_program({}), "-np is missing"},
      {with_program({"-np", "2", "--backend", "nccl"}), "--backend 'nccl'"},
      {with_program({"-np", "2", "-H", "a:"}), "-H 'a:'"},
      {with_program({"-np", "2", "-H", "a:x"}), "'a:x'"},
      {with_program({"-np", "2", "-H", ":2"}), "':2'"},
      {with_program({"-np", "3", "-H", "localhost:2"}), "-np 3 is more than the 2 slots"},
      {{"-np", "2"}, "no program given"},
      {{"-np", "2", "./no-such-kolo-program"}, "'./no-such-kolo-program'"},
      {{"-np", "2", not_executable}, "not an executable file"},
      {with_program({"-np", "2", "--timeout", "-5"}), "--timeout '-5'"},
      {with_program({"-np", "2", "--unknown-flag"}), "--unknown-flag"},
      {with_program({"-np", "2", "--tag-output", "--rank0-only"}), "excludes"},
      {with_program({"-H", "otherhost:2", "--backend", "shm"}), "--backend gloo"},
  };
  for (const auto& c : cases) {
    RunResult r = run_kolorun(c.args, seconds(20));
    ASSERT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, 2) << c.fragment << "\n" << r.err;
    auto lines = r.err_lines();
    ASSERT_EQ(lines.size(), 1u) << c.fragment << "\n" << r.err;
    EXPECT_EQ(lines[0].rfind("kolorun: ", 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find(c.fragment), std::string::npos) << lines[0];
    EXPECT_EQ(r.out, "");
    EXPECT_NE(access(marker.c_str(), F_OK), 0) << "a worker ran for: " << c.fragment;
  }
  std::remove(marker.c_str());
  std::remove(not_executable.c_str());
  rmdir(marker_template);
}

// A file that passes the checks but cannot be executed: one line naming the rank
// and the reason, and nothing left running.
TEST(KolorunArgs, AProgramThatCannotBeExecutedIsReported) {
  char dir_template[] = "/tmp/kolorun-noexec-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string program = std::string(dir_template) + "/garbage";
  std::ofstream(program) << "\x7f\x01\x02 not a program\n";
  ASSERT_EQ(chmod(program.c_str(), 0755), 0);
  RunResult r = run_kolorun({"-np", "2", program}, seconds(20));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1);
  ASSERT_EQ(r.err_lines().size(), 1u) << r.err;
  EXPECT_NE(r.err.find("kolorun: cannot start rank 0: execve " + program + ": Exec format error"),
            std::string::npos)
      << r.err;
  std::remove(program.c_str());
  rmdir(dir_template);
}

TEST(KolorunArgs, CheckBuildListsTheCompiledBackends) {
  RunResult r = run_kolorun({"--check-build"}, seconds(20));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[X] shm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(KOLO_HAVE_GLOO ? "[X] gloo" : "[ ] gloo"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(KOLO_HAVE_MPI ? "[X] mpi" : "[ ] mpi"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::string("kolo v") + kolo::version()), std::string::npos) << r.out;
  // Versions: libtorch's (this tree builds kolo::torch whenever libtorch is
  // found), gloo's and the MPI library's own.
  EXPECT_NE(r.out.find(KOLO_HAVE_TORCH ? "[X] libtorch " + std::string(KOLO_TORCH_VERSION)
                                       : std::string("[ ] libtorch")),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("not yet"), std::string::npos) << r.out;
  if (KOLO_HAVE_GLOO) {
    EXPECT_NE(r.out.find("[X] gloo " + std::string(KOLO_GLOO_VERSION) + " ("), std::string::npos)
        << r.out;
  }
  if (KOLO_HAVE_MPI) {
    EXPECT_NE(r.out.find("[X] mpi Open MPI v"), std::string::npos) << r.out;
  }
}

TEST(KolorunArgs, PrintEnvDocsNamesEveryRegisteredVariable) {
  RunResult r = run_kolorun({"--print-env-docs"}, seconds(20));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, Config::markdown());
  for (const auto& var : config_registry()) {
    EXPECT_NE(r.out.find(var.name), std::string::npos) << var.name;
  }
}

TEST(KolorunArgs, HelpAndVersion) {
  RunResult help = run_kolorun({"--help"}, seconds(20));
  EXPECT_EQ(help.exit_code, 0);
  for (const std::string option :
       {"-np", "-H", "--backend", "--timeout", "--tag-output", "--rank0-only", "--check-build"}) {
    EXPECT_NE(help.out.find(option), std::string::npos) << option;
  }
  RunResult version = run_kolorun({"--version"}, seconds(20));
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.out.rfind("kolorun (kolo) ", 0), 0u) << version.out;
}

}  // namespace
}  // namespace kolo::kolorun_test

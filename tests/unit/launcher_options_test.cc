// kolorun's command-line parsing (launcher/options.h).
#include <gtest/gtest.h>

#include "options.h"
#include "usage_error.h"

namespace kolo::launcher {
namespace {

CommandLine parse(const std::vector<std::string>& args) { return parse_command_line(args); }

// The UsageError message of parsing `args` ("" when it parses).
std::string error_of(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(LauncherOptions, ParsesTheIssueSynopsis) {
  auto line = parse({"-np", "4", "-H", "a:2,b:2", "--backend", "gloo", "--timeout", "30",
                     "--tag-output", "./train", "--epochs", "3"});
  ASSERT_EQ(line.action, Action::kLaunch);
  const auto& o = line.options;
  EXPECT_EQ(o.np, 4);
  EXPECT_EQ(o.hosts, "a:2,b:2");
  EXPECT_EQ(o.backend, "gloo");
  ASSERT_TRUE(o.timeout_seconds.has_value());
  EXPECT_DOUBLE_EQ(*o.timeout_seconds, 30.0);
  EXPECT_EQ(o.output, OutputMode::kTag);
  EXPECT_EQ(o.program, "./train");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"--epochs", "3"}));
}

// --servers S: S more ranks, told their role through KOLO_PS_SERVERS on
// every launch path (forwarded like -x NAME=VALUE).
TEST(LauncherOptions, ServersAreExtraRanksWithTheirVariable) {
  auto o = parse({"-np", "4", "--servers", "2", "./train"}).options;
  EXPECT_EQ(o.np, 6);
  EXPECT_EQ(o.servers, 2);
  EXPECT_EQ(o.forward_env, (std::vector<std::string>{"KOLO_PS_SERVERS=2"}));
  EXPECT_NE(error_of({"--servers", "1", "-H", "a:2", "./train"}).find("needs -np"),
            std::string::npos);
  EXPECT_NE(error_of({"-np", "2", "--servers", "0", "./train"}), "");
  EXPECT_NE(error_of({"-np", "2", "--servers", "1", "--min-np", "1", "./train"})
                .find("--servers cannot be elastic"),
            std::string::npos);
  EXPECT_NE(error_of({"-np", "2", "--servers", "1", "-x", "KOLO_PS_SERVERS=3", "./train"})
                .find("contradicts --servers"),
            std::string::npos);
}

// --restart-workers N: parameter-server workers only, not under mpirun.
TEST(LauncherOptions, RestartWorkersNeedServers) {
  auto o = parse({"-np", "2", "--servers", "1", "--restart-workers", "3", "./train"}).options;
  EXPECT_EQ(o.restart_workers, 3);
  EXPECT_EQ(parse({"-np", "2", "--servers", "1", "./train"}).options.restart_workers, 0);
  EXPECT_NE(error_of({"-np", "2", "--restart-workers", "1", "./train"}).find("add --servers S"),
            std::string::npos);
  EXPECT_NE(error_of({"-np", "2", "--servers", "1", "--restart-workers", "1", "--backend", "mpi",
                      "./train"})
                .find("cannot run with --backend mpi"),
            std::string::npos);
  EXPECT_NE(error_of({"-np", "2", "--servers", "1", "--restart-workers", "-1", "./train"}), "");
  EXPECT_NE(error_of({"-np", "2", "--servers", "1", "-x", "KOLO_PS_REJOIN=1", "./train"})
                .find("kolorun sets KOLO_PS_REJOIN itself"),
            std::string::npos);
}

TEST(LauncherOptions, EverythingAfterTheProgramIsPassedUntouched) {
  // The program's own flags look like kolorun's: they must not be parsed.
  auto o =
      parse({"-np", "2", "prog", "-np", "7", "-H", "x", "--backend", "bad", "--", "-v"}).options;
  EXPECT_EQ(o.np, 2);
  EXPECT_TRUE(o.hosts.empty());
  EXPECT_EQ(o.program, "prog");
  EXPECT_EQ(o.program_args,
            (std::vector<std::string>{"-np", "7", "-H", "x", "--backend", "bad", "--", "-v"}));
}

TEST(LauncherOptions, FlagsDoNotSwallowTheProgram) {
  auto o = parse({"--rank0-only", "-np", "2", "sh", "-c", "echo hi"}).options;
  EXPECT_EQ(o.output, OutputMode::kRank0Only);
  EXPECT_EQ(o.program, "sh");
  EXPECT_EQ(o.program_args, (std::vector<std::string>{"-c", "echo hi"}));
}

TEST(LauncherOptions, AcceptsOtherSpellings) {
  auto o = parse({"-n", "3", "--hosts=localhost:3", "--backend=shm", "prog"}).options;
  EXPECT_EQ(o.np, 3);
  EXPECT_EQ(o.hosts, "localhost:3");
  EXPECT_EQ(o.backend, "shm");
  EXPECT_EQ(parse({"--np=5", "prog"}).options.np, 5);
  EXPECT_EQ(parse({"-np", "2", "--", "-weird-program-name"}).options.program,
            "-weird-program-name");
  EXPECT_TRUE(parse({"-np", "2", "--backend", "auto", "prog"}).options.backend.empty());
}

TEST(LauncherOptions, NpMayBeLeftOutWithAHostList) {
  auto o = parse({"-H", "localhost:2", "prog"}).options;
  EXPECT_FALSE(o.np.has_value());
}

TEST(LauncherOptions, ForwardedVariablesAndTimeouts) {
  auto o = parse({"-np", "1", "-x", "A", "-x", "B=2", "--job-timeout", "1.5", "--grace", "0",
                  "--output-dir", "/tmp/logs", "prog"})
               .options;
  EXPECT_EQ(o.forward_env, (std::vector<std::string>{"A", "B=2"}));
  EXPECT_DOUBLE_EQ(*o.job_timeout_seconds, 1.5);
  EXPECT_DOUBLE_EQ(o.grace_seconds, 0.0);
  EXPECT_EQ(o.output_dir, "/tmp/logs");
}

TEST(LauncherOptions, ActionsNeedNoProgram) {
  EXPECT_EQ(parse({"--check-build"}).action, Action::kCheckBuild);
  EXPECT_EQ(parse({"--print-env-docs"}).action, Action::kPrintEnvDocs);
  EXPECT_EQ(parse({"--version"}).action, Action::kVersion);
  auto help = parse({"--help"});
  EXPECT_EQ(help.action, Action::kHelp);
  EXPECT_NE(help.help_text.find("--rank0-only"), std::string::npos);
}

TEST(LauncherOptions, BadArgumentsGiveOneLineNamingTheArgument) {
  struct Case {
    std::vector<std::string> args;
    std::string expected;  // a fragment of the message
  };
  const std::vector<Case> cases = {
      {{"-np", "0", "prog"}, "-np 0: the number of workers must be at least 1"},
      {{"-np", "2", "--servers", "0", "prog"},
       "--servers 0: the number of parameter servers must be at least 1"},
      {{"-np", "-3", "prog"}, "-np -3"},
      {{"-np", "two", "prog"}, "-np 'two': expected a whole number"},
      {{"prog"}, "-np is missing"},
      {{"-np", "2"}, "no program given"},
      {{"-np", "2", "--backend", "nccl", "prog"}, "--backend 'nccl' is not a backend"},
      {{"-np", "2", "--timeout", "0", "prog"}, "--timeout '0'"},
      {{"-np", "2", "--timeout", "soon", "prog"}, "--timeout 'soon'"},
      {{"-np", "2", "--job-timeout", "-1", "prog"}, "--job-timeout '-1'"},
      {{"-np", "2", "--tag-output", "--rank0-only", "prog"}, "excludes"},
      {{"-np", "2", "--frobnicate", "prog"}, "--frobnicate"},
      {{"-np", "2", "-x", "=v", "prog"}, "-x '=v'"},
      {{"-np"}, "np"},
      // Before: "the number of workers must be at least 1" for a restart count.
      {{"-np", "2", "--min-np", "1", "--max-restarts", "-1", "prog"},
       "--max-restarts -1: the number of restarts must be at least 0"},
      {{"-np", "2", "--min-np", "1", "--max-restarts", "99999999999", "prog"},
       "--max-restarts 99999999999: too large"},
      {{"-np", "99999999999999999999", "prog"}, "-np 99999999999999999999: too large"},
      // Before: accepted here, then every worker failed (0.1 ms rounds to 0 ms).
      {{"-np", "2", "--timeout", "0.0001", "prog"},
       "--timeout 0.0001: too small; kolo's timeouts count whole milliseconds, give at least "
       "0.001"},
      {{"-np", "2", "--grace", "1e300", "prog"}, "--grace 1e300: too large"},
      {{"-np", "2", "--job-timeout", "1e12", "prog"}, "--job-timeout 1e12: too large"},
      // Before: accepted, and each worker's environment held KOLO_RANK twice.
      {{"-np", "2", "-x", "KOLO_RANK=7", "prog"},
       "-x KOLO_RANK=7: kolorun sets KOLO_RANK itself (each worker's rank); leave it out"},
      {{"-np", "2", "-x", "KOLO_JOB_SECRET", "prog"}, "kolorun sets KOLO_JOB_SECRET itself"},
      {{"-np", "2", "--backend", "shm", "-x", "KOLO_BACKEND=gloo", "prog"},
       "-x KOLO_BACKEND=gloo contradicts --backend shm: give one"},
  };
  for (const auto& c : cases) {
    std::string message = error_of(c.args);
    EXPECT_NE(message.find(c.expected), std::string::npos)
        << "args[0]=" << c.args[0] << " message: " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace kolo::launcher

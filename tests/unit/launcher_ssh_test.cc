// Remote command construction (launcher/ssh_command.h). This machine has no ssh
// peers; the integration tier runs these scripts through a local stand-in.
#include <gtest/gtest.h>

#include <cstdio>

#include "ssh_command.h"

namespace kolo::launcher {
namespace {

// What /bin/sh makes of `word` (one quoted word), read back through printf.
std::string through_shell(const std::string& word) {
  std::string command = "printf '%s' " + shell_quote(word);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "<popen failed>";
  std::string out;
  char buffer[256];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  pclose(pipe);
  return out;
}

TEST(LauncherSsh, QuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(shell_quote("plain/path-1.2_x"), "plain/path-1.2_x");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
}

TEST(LauncherSsh, QuotedWordsSurviveTheShell) {
  for (const std::string word :
       {"a b", "it's", "$HOME `id` $(id)", "semi;colon&amp|pipe", "tab\there", "new\nline",
        "back\\slash", "\"double\"", "*?[glob]", "~tilde", "!bang", "'", "''", "ünïcödé"}) {
    EXPECT_EQ(through_shell(word), word);
  }
}

RemoteWorker sample_worker() {
  RemoteWorker worker;
  worker.host = "node2";
  worker.working_dir = "/home/me/my job";
  worker.variables = {{"KOLO_RANK", "2"}, {"KOLO_SIZE", "4"}, {"KOLO_STORE_ADDR", "node1"}};
  worker.threads_divisor = 2;
  worker.program = "./train";
  worker.args = {"--name", "it's mine"};
  worker.grace_seconds = 5;
  return worker;
}

TEST(LauncherSsh, BuildsTheSshCommandLine) {
  RemoteWorker worker = sample_worker();
  auto argv = remote_command("ssh", worker);
  ASSERT_EQ(argv.size(), 5u);
  EXPECT_EQ(argv[0], "ssh");
  EXPECT_EQ(argv[1], "-o");
  EXPECT_EQ(argv[2], "BatchMode=yes");
  EXPECT_EQ(argv[3], "node2");
  EXPECT_EQ(argv[4], remote_script(worker));

  auto custom = remote_command("ssh -p 2222  -i key", worker);
  EXPECT_EQ((std::vector<std::string>(custom.begin(), custom.begin() + 7)),
            (std::vector<std::string>{"ssh", "-p", "2222", "-i", "key", "-o", "BatchMode=yes"}));
}

TEST(LauncherSsh, TheRemoteScript) {
  EXPECT_EQ(remote_script(sample_worker()),
            "cd '/home/me/my job' && exec 3<&0 && "
            "kolo_threads=$(( $(nproc 2>/dev/null || echo 1) / 2 )); "
            "[ \"$kolo_threads\" -ge 1 ] || kolo_threads=1; "
            "{ env KOLO_RANK=2 KOLO_SIZE=4 KOLO_STORE_ADDR=node1 OMP_NUM_THREADS=$kolo_threads "
            "OPENBLAS_NUM_THREADS=$kolo_threads MKL_NUM_THREADS=$kolo_threads "
            "./train --name 'it'\\''s mine' </dev/null 3<&- & kolo_pid=$!; "
            "{ cat <&3 >/dev/null 2>&1; kill -TERM $kolo_pid 2>/dev/null; sleep 5; "
            "kill -KILL $kolo_pid 2>/dev/null; } >/dev/null 2>&1 & kolo_watch=$!; "
            "exec 3<&-; wait $kolo_pid; kolo_rc=$?; kill $kolo_watch 2>/dev/null; "
            "exit $kolo_rc; }");
}

// A thread count the user gave (-x OMP_NUM_THREADS=3) is not recomputed and
// wins for the other thread variables too.
TEST(LauncherSsh, ThreadVariablesTheUserSetAreNotRecomputed) {
  RemoteWorker worker = sample_worker();
  worker.variables.push_back({"OMP_NUM_THREADS", "3"});
  std::string script = remote_script(worker);
  EXPECT_NE(script.find("OMP_NUM_THREADS=3"), std::string::npos);
  EXPECT_EQ(script.find("kolo_threads"), std::string::npos) << script;
  EXPECT_NE(script.find("MKL_NUM_THREADS=3"), std::string::npos) << script;
  EXPECT_NE(script.find("OPENBLAS_NUM_THREADS=3"), std::string::npos) << script;

  worker.threads_divisor = 0;
  EXPECT_EQ(remote_script(worker).find("kolo_threads"), std::string::npos);
}

TEST(LauncherSsh, GraceIsRoundedUpToWholeSeconds) {
  RemoteWorker worker = sample_worker();
  worker.grace_seconds = 0.2;
  EXPECT_NE(remote_script(worker).find("sleep 1;"), std::string::npos);
}

}  // namespace
}  // namespace kolo::launcher

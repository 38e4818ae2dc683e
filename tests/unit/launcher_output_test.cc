// Output routing (launcher/output.h) and the failure report's pieces.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "output.h"
#include "supervisor.h"

namespace kolo::launcher {
namespace {

// An in-memory file standing in for kolorun's stdout or stderr.
class MemoryFile {
 public:
  MemoryFile() : fd_(memfd_create("kolorun-test", 0)) {}
  ~MemoryFile() { close(fd_); }
  int fd() const { return fd_; }
  std::string text() const {
    std::string out;
    char buffer[4096];
    ssize_t n;
    off_t offset = 0;
    while ((n = pread(fd_, buffer, sizeof(buffer), offset)) > 0) {
      out.append(buffer, static_cast<size_t>(n));
      offset += n;
    }
    return out;
  }

 private:
  int fd_;
};

struct Fixture {
  MemoryFile out, err;
  OutputRouter::Options options(OutputMode mode) {
    OutputRouter::Options o;
    o.mode = mode;
    o.stdout_fd = out.fd();
    o.stderr_fd = err.fd();
    return o;
  }
};

void feed(OutputRouter& router, int rank, Stream stream, const std::string& text) {
  router.feed(rank, stream, text.data(), text.size());
}

TEST(LauncherOutput, TagsLikeMpirun) {
  EXPECT_EQ(output_tag(0, Stream::kStdout), "[1,0]<stdout>:");
  EXPECT_EQ(output_tag(12, Stream::kStderr), "[1,12]<stderr>:");
}

TEST(LauncherOutput, TaggedLinesAreWholeEvenWhenFedInPieces) {
  Fixture f;
  OutputRouter router(f.options(OutputMode::kTag), 2);
  feed(router, 1, Stream::kStdout, "hel");
  feed(router, 0, Stream::kStdout, "zero\n");
  feed(router, 1, Stream::kStdout, "lo\nwor");
  feed(router, 1, Stream::kStderr, "oops\n");
  feed(router, 1, Stream::kStdout, "ld\n\n");
  feed(router, 0, Stream::kStdout, "no newline at the end");
  router.flush(0, Stream::kStdout);
  router.flush(1, Stream::kStdout);  // nothing pending: writes nothing
  EXPECT_EQ(f.out.text(),
            "[1,0]<stdout>:zero\n[1,1]<stdout>:hello\n[1,1]<stdout>:world\n[1,1]<stdout>:\n"
            "[1,0]<stdout>:no newline at the end\n");
  EXPECT_EQ(f.err.text(), "[1,1]<stderr>:oops\n");
}

// A progress bar redrawing its line with '\r' is passed through as it comes
// (tagged like a line, ending in '\r'), not held back until a newline; its
// last segment is the rank's last line; "\r\n" is one line end, also split
// across reads.
TEST(LauncherOutput, CarriageReturnSegmentsPassThroughAtOnce) {
  Fixture f;
  OutputRouter router(f.options(OutputMode::kTag), 2);
  feed(router, 1, Stream::kStdout, "epoch 1: 10%\r");
  EXPECT_EQ(f.out.text(), "[1,1]<stdout>:epoch 1: 10%\r");
  feed(router, 1, Stream::kStdout, "epoch 1: 20%\repoch 1: 3");
  EXPECT_EQ(router.last_line(1), "epoch 1: 20%");
  feed(router, 1, Stream::kStdout, "0%\r");
  feed(router, 1, Stream::kStdout, "\ndone\r\n");
  EXPECT_EQ(f.out.text(),
            "[1,1]<stdout>:epoch 1: 10%\r[1,1]<stdout>:epoch 1: 20%\r[1,1]<stdout>:epoch 1: 30%\r"
            "\n[1,1]<stdout>:done\n");
  EXPECT_EQ(router.last_line(1), "done");

  Fixture plain;
  OutputRouter untagged(plain.options(OutputMode::kPlain), 1);
  feed(untagged, 0, Stream::kStderr, "50%\r100%\r");
  feed(untagged, 0, Stream::kStderr, "\n");
  EXPECT_EQ(plain.err.text(), "50%\r100%\r\n");  // the bytes the program wrote
}

TEST(LauncherOutput, PlainModeKeepsLinesUntagged) {
  Fixture f;
  OutputRouter router(f.options(OutputMode::kPlain), 2);
  feed(router, 1, Stream::kStdout, "one\ntw");
  feed(router, 0, Stream::kStdout, "zero\n");
  router.flush(1, Stream::kStdout);
  EXPECT_EQ(f.out.text(), "one\nzero\ntw\n");
}

TEST(LauncherOutput, Rank0OnlyDropsOthersButRemembersTheirLastLines) {
  Fixture f;
  OutputRouter router(f.options(OutputMode::kRank0Only), 3);
  feed(router, 0, Stream::kStdout, "from zero\n");
  feed(router, 2, Stream::kStdout, "from two\n");
  feed(router, 2, Stream::kStderr, "two failed\n\n");
  EXPECT_EQ(f.out.text(), "from zero\n");
  EXPECT_EQ(f.err.text(), "");
  Stream stream = Stream::kStdout;
  EXPECT_EQ(router.last_line(2, &stream), "two failed");  // blank last line skipped
  EXPECT_EQ(stream, Stream::kStderr);
  EXPECT_EQ(router.last_line(1), "");
  EXPECT_NE(router.where(2).find("--rank0-only discarded it"), std::string::npos);
  EXPECT_EQ(router.where(0), "the terminal above");
}

TEST(LauncherOutput, VeryLongLinesAreWrittenInPieces) {
  Fixture f;
  OutputRouter router(f.options(OutputMode::kPlain), 1);
  std::string big(200 * 1024, 'x');
  feed(router, 0, Stream::kStdout, big);
  router.flush(0, Stream::kStdout);
  std::string text = f.out.text();
  EXPECT_EQ(std::count(text.begin(), text.end(), 'x'), static_cast<long>(big.size()));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 4);  // 3 x 64 KiB + the rest
}

TEST(LauncherOutput, OutputDirKeepsEveryRanksFullLog) {
  Fixture f;
  char dir_template[] = "/tmp/kolorun-output-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  std::string dir = std::string(dir_template) + "/nested/logs";
  {
    auto options = f.options(OutputMode::kRank0Only);
    options.output_dir = dir;
    OutputRouter router(options, 2);
    feed(router, 0, Stream::kStdout, "a\n");
    feed(router, 1, Stream::kStdout, "b\n");
    feed(router, 1, Stream::kStderr, "c");
    router.flush(1, Stream::kStderr);
    EXPECT_EQ(router.log_path(1), dir + "/rank.1.log");
    EXPECT_EQ(router.where(1), dir + "/rank.1.log");
    EXPECT_EQ(router.where(0), "the terminal above, and " + dir + "/rank.0.log");
  }
  std::ifstream log(dir + "/rank.1.log");
  std::stringstream content;
  content << log.rdbuf();
  EXPECT_EQ(content.str(), "b\nc\n");
  EXPECT_EQ(f.out.text(), "a\n");
  std::string command = "rm -rf " + std::string(dir_template);
  EXPECT_EQ(std::system(command.c_str()), 0);
}

TEST(LauncherOutput, WhereNamesTheTag) {
  Fixture f;
  OutputRouter tagged(f.options(OutputMode::kTag), 2);
  EXPECT_EQ(tagged.where(1), "the terminal above, tagged [1,1]");
  OutputRouter plain(f.options(OutputMode::kPlain), 2);
  EXPECT_NE(plain.where(1).find("untagged"), std::string::npos);
}

int status_of_child(void (*body)()) {
  pid_t pid = fork();
  if (pid == 0) {
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(LauncherReport, DescribesExitCodesAndSignals) {
  EXPECT_EQ(describe_status(status_of_child([] { _exit(3); })), "exited with code 3");
  EXPECT_EQ(describe_status(status_of_child([] {
              signal(SIGKILL, SIG_DFL);
              raise(SIGKILL);
            })),
            "killed by signal 9 (SIGKILL)");
  EXPECT_EQ(describe_status(status_of_child([] { raise(SIGTERM); })),
            "killed by signal 15 (SIGTERM)");
}

TEST(LauncherReport, QuotesLinesSafely) {
  EXPECT_EQ(quote_line("plain"), "\"plain\"");
  EXPECT_EQ(quote_line("say \"hi\"\t\\"), "\"say \\\"hi\\\"\\x09\\\\\"");
  EXPECT_EQ(quote_line(std::string(300, 'y'), 5), "\"yyyyy...\"");
  EXPECT_EQ(quote_line("\x1b[31mred"), "\"\\x1b[31mred\"");
}

}  // namespace
}  // namespace kolo::launcher

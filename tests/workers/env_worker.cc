// Worker that shows what kolorun gave it, for kolorun's integration tests.
//
//   env_worker [--sleep-ms D] [--partial] [args...]
//
// Prints "pid=<pid>", "host=<gethostname()>", then NAME=VALUE for each KOLO_* and thread variable
// it was given (and FAKE_SSH_HOST under fake_ssh, and EXTRA_* test variables), then
// "args=<arg>|<arg>|..." and "stderr line from <rank>" on stderr.
// --partial ends stdout with a line that has no newline. Exits 0 after D ms.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

extern char** environ;

int main(int argc, char** argv) {
  int sleep_ms = 0;
  bool partial = false;
  std::string args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--sleep-ms" && i + 1 < argc) {
      sleep_ms = std::atoi(argv[++i]);
    } else if (a == "--partial") {
      partial = true;
    } else {
      args += (args.empty() ? "" : "|") + a;
    }
  }
  std::printf("pid=%d\n", static_cast<int>(getpid()));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::printf("host=%s\n", host);
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string e = *entry;
    if (e.rfind("KOLO_", 0) == 0 || e.rfind("OMP_NUM_THREADS=", 0) == 0 ||
        e.rfind("OPENBLAS_NUM_THREADS=", 0) == 0 || e.rfind("MKL_NUM_THREADS=", 0) == 0 ||
        e.rfind("FAKE_SSH_HOST=", 0) == 0 || e.rfind("EXTRA_", 0) == 0) {
      std::printf("%s\n", e.c_str());
    }
  }
  std::printf("args=%s\n", args.c_str());
  const char* rank = std::getenv("KOLO_RANK");
  std::fprintf(stderr, "stderr line from %s\n", rank != nullptr ? rank : "?");
  if (partial) std::printf("no newline at the end");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  return 0;
}

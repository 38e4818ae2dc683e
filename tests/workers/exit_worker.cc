// Worker for kolorun's failure-propagation tests.
//
//   exit_worker [--rank R] [--code C] [--delay-ms D] [--wait sleep|collective]
//               [--kill-self] [--ignore-sigterm] [--child]
//
// Prints "pid=<pid> rank=<r>" first (so the test knows whom to look for), then:
// rank R waits D ms and exits with code C (or SIGKILLs itself with --kill-self);
// every other rank waits: `sleep` sleeps for 10 minutes, `collective` calls
// kolo::init() and then blocks in a barrier that rank R never joins.
// --ignore-sigterm makes the waiting ranks ignore SIGTERM (kolorun must SIGKILL
// them after the grace period). --child also forks a grandchild that sleeps and
// prints "child_pid=<pid>" (kolorun must not leave it behind).
// Without --rank every rank just waits. Never run by a test without a watchdog.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "kolo/kolo.h"

namespace {

struct Args {
  int fail_rank = -1;
  int code = 3;
  int delay_ms = 200;
  std::string wait = "sleep";
  bool kill_self = false;
  bool ignore_sigterm = false;
  bool child = false;
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "exit_worker: %s needs a value\n", a.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    if (a == "--rank") {
      args.fail_rank = std::atoi(next().c_str());
    } else if (a == "--code") {
      args.code = std::atoi(next().c_str());
    } else if (a == "--delay-ms") {
      args.delay_ms = std::atoi(next().c_str());
    } else if (a == "--wait") {
      args.wait = next();
    } else if (a == "--kill-self") {
      args.kill_self = true;
    } else if (a == "--ignore-sigterm") {
      args.ignore_sigterm = true;
    } else if (a == "--child") {
      args.child = true;
    } else {
      std::fprintf(stderr, "exit_worker: unknown argument %s\n", a.c_str());
      std::exit(64);
    }
  }
  return args;
}

int env_rank() {
  const char* rank = std::getenv("KOLO_RANK");
  return rank != nullptr ? std::atoi(rank) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  int rank = env_rank();
  std::printf("pid=%d rank=%d\n", static_cast<int>(getpid()), rank);
  std::fflush(stdout);
  if (args.child) {
    pid_t child = fork();
    if (child == 0) {
      execlp("sleep", "sleep", "600", static_cast<char*>(nullptr));
      _exit(127);
    }
    std::printf("child_pid=%d rank=%d\n", static_cast<int>(child), rank);
    std::fflush(stdout);
  }

  if (rank == args.fail_rank) {
    std::this_thread::sleep_for(std::chrono::milliseconds(args.delay_ms));
    std::fprintf(stderr, "exit_worker: rank %d failing on purpose\n", rank);
    std::fflush(stderr);
    if (args.kill_self) raise(SIGKILL);
    _exit(args.code);
  }

  if (args.ignore_sigterm) signal(SIGTERM, SIG_IGN);
  if (args.wait == "collective") {
    try {
      kolo::init();
      kolo::CollectiveOptions options;
      options.timeout = std::chrono::minutes(10);
      kolo::runtime().world().barrier(options);  // the failing rank never arrives
      std::printf("rank %d: barrier returned\n", rank);
      kolo::shutdown();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "exit_worker: rank %d: %s\n", rank, e.what());
      return 2;
    }
    return 0;
  }
  std::this_thread::sleep_for(std::chrono::minutes(10));
  return 0;
}

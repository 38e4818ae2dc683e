// A rank that freezes (tests/integration/stall_test.cc): kolo::init() from the
// launcher's variables, then allreduces through the default runtime's engine,
// one per step. With --freeze R@S, rank R stops itself with SIGSTOP before
// step S (a debugger, a stopped terminal job, a hung node), so the others'
// engines wait for it in negotiation.
//
// With --exit-before-init R, rank R exits 3 after 2 s without ever calling
// kolo::init(), while the others wait for it in the shm rendezvous (rank 0
// holds the segment's name) until kolorun stops them. With
// --sleep-before-init R, rank R sleeps 120 s first instead (the others wait
// in the rendezvous meanwhile); with --exit-0-before-init R it exits 0 after
// 1 s (an early return).
//
// With --p2p-deadlock 1, every rank instead receives on the world
// communicator from the next rank (tag 100 + its rank) what no rank ever
// sends: a deadlock of point-to-point waits, which the world's stall watch
// (core/src/comm/watched_communicator.h) warns about and ends.
//
// Prints "pid=<pid>" first; "rank R: done" and exits 0 after --steps steps;
// on a RuntimeFault prints "rank R: fault: <message> [failed ranks: a,b]" and
// exits 3.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/engine.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"

int main(int argc, char** argv) {
  int steps = 50;
  int freeze_rank = -1;
  int freeze_step = -1;
  int exit_rank = -1;
  int sleep_rank = -1;
  int clean_exit_rank = -1;
  bool p2p_deadlock = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--steps") {
      steps = std::atoi(value.c_str());
    } else if (flag == "--exit-before-init") {
      exit_rank = std::atoi(value.c_str());
    } else if (flag == "--exit-0-before-init") {
      clean_exit_rank = std::atoi(value.c_str());
    } else if (flag == "--sleep-before-init") {
      sleep_rank = std::atoi(value.c_str());
    } else if (flag == "--p2p-deadlock") {
      p2p_deadlock = std::atoi(value.c_str()) != 0;
    } else if (flag == "--freeze") {
      const size_t at = value.find('@');
      freeze_rank = std::atoi(value.substr(0, at).c_str());
      freeze_step = std::atoi(value.substr(at + 1).c_str());
    } else {
      std::fprintf(stderr, "stall_worker: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::printf("pid=%d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  const char* rank_text = std::getenv("KOLO_RANK");
  if (rank_text != nullptr && std::atoi(rank_text) == exit_rank) {
    std::this_thread::sleep_for(std::chrono::seconds(2));
    return 3;
  }
  if (rank_text != nullptr && std::atoi(rank_text) == clean_exit_rank) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    return 0;  // an early return before the first collective
  }
  if (rank_text != nullptr && std::atoi(rank_text) == sleep_rank) {
    std::this_thread::sleep_for(std::chrono::seconds(120));
  }
  int rank = rank_text != nullptr ? std::atoi(rank_text) : 0;
  std::vector<float> grad(1000, 1.0f);
  try {
    kolo::init();
    rank = kolo::rank();
    if (p2p_deadlock) {
      kolo::Communicator& world = kolo::runtime().world();
      kolo::P2POptions stuck;
      stuck.tag = 100 + rank;
      int value = 0;
      world.recv(&value, 1, kolo::DType::kI32, (rank + 1) % world.size(), stuck);
      steps = 0;
    }
    for (int step = 0; step < steps; ++step) {
      if (rank == freeze_rank && step == freeze_step) raise(SIGSTOP);
      kolo::TensorView v{grad.data(), kolo::DType::kF32, {1000}};
      kolo::runtime().engine().allreduce("grad", v, v, {kolo::ReduceOp::kAverage});
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const kolo::RuntimeFault& e) {
    std::string failed;
    for (int r : e.failed_ranks()) failed += (failed.empty() ? "" : ",") + std::to_string(r);
    std::printf("rank %d: fault: %s [failed ranks: %s]\n", rank, e.what(), failed.c_str());
    std::fflush(stdout);
    return 3;
  }
  std::printf("rank %d: done\n", rank);
  kolo::shutdown();
  return 0;
}

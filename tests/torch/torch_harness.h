// Ranks as threads for the torch frontend's tests: one Engine per rank-thread
// over the threads backend (plus process-set communicators), and options that
// point the frontend's calls at it.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/engine.h"
#include "kolo/core/errors.h"
#include "kolo/torch/tensor.h"
#include "thread_ranks.h"

namespace kolo::testing {

// Every communicator call and every wait: far below run_ranks' watchdog, far
// above any legitimate wait on two loaded cores.
constexpr std::chrono::milliseconds kTorchTimeout{30000};

inline EngineOptions torch_test_engine_options() {
  EngineOptions o;
  o.cycle_time_ms = 0.5;
  o.stall_warning_seconds = 20;
  o.stall_shutdown_seconds = 25;
  return o;
}

class ThreadEngines {
 public:
  explicit ThreadEngines(int size)
      : size_(size), comms_(make_thread_communicators(size, kTorchTimeout)) {}

  // Rank `rank`'s engine; call on the rank's thread (creating engines is collective).
  std::unique_ptr<Engine> engine(int rank) {
    std::unique_ptr<Communicator> comm;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      comm = std::move(comms_[rank]);
    }
    CommunicatorFactory factory = [this, rank](const std::vector<int>& ranks, int set_id) {
      int index = 0;
      while (ranks[index] != rank) ++index;
      std::lock_guard<std::mutex> lock(mutex_);
      auto& comms = set_comms_[set_id];
      if (comms.empty()) {
        comms = make_thread_communicators(static_cast<int>(ranks.size()), kTorchTimeout);
      }
      return std::move(comms[index]);
    };
    return std::make_unique<Engine>(std::move(comm), factory, torch_test_engine_options());
  }

  int size() const { return size_; }

 private:
  int size_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::map<int, std::vector<std::unique_ptr<Communicator>>> set_comms_;
};

// Options whose calls go to `engine` and give up after kTorchTimeout.
inline TensorOpOptions on(Engine& engine) {
  TensorOpOptions o;
  o.engine = &engine;
  o.timeout = kTorchTimeout;
  return o;
}

// Runs fn(rank, engine) on `n` rank-threads, each with its own engine.
inline void run_with_engines(int n, const std::function<void(int rank, Engine& engine)>& fn) {
  ThreadEngines engines(n);
  run_ranks(n, [&](int rank) {
    std::unique_ptr<Engine> engine = engines.engine(rank);
    fn(rank, *engine);
  });
}

// The message of the ContractError that fn throws; "" when it throws none.
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ContractError& e) {
    return e.what();
  }
  return "";
}

}  // namespace kolo::testing

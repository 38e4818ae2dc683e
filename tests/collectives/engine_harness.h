// Ranks as threads for engine tests: one Engine per rank-thread over the
// threads backend, or over shm / gloo built through make_communicator with an
// in-memory store, plus a CommunicatorFactory for process sets.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/engine.h"
#include "kolo/core/store.h"

namespace kolo::testing {

// Timeout of every communicator call and of every Handle::wait in the engine
// tests: far below run_ranks' watchdog, far above any legitimate wait.
constexpr std::chrono::milliseconds kEngineTimeout{30000};

inline std::vector<std::string> engine_backends() {
  std::vector<std::string> names = {"threads", "shm"};
#if KOLO_HAVE_GLOO
  names.push_back("gloo");
#endif
  return names;
}

inline std::string engine_prefix(const std::string& what) {
  static std::atomic<int> counter{0};
  return "kolo-engine-test-" + std::to_string(getpid()) + "-" + what + "-" +
         std::to_string(counter++);
}

// Options for tests: short cycles so that steps are quick on 2 shared cores.
inline EngineOptions test_engine_options() {
  EngineOptions o;
  o.cycle_time_ms = 0.2;
  o.stall_warning_seconds = 20;
  o.stall_shutdown_seconds = 25;
  return o;
}

class EngineWorld {
 public:
  EngineWorld(const std::string& backend, int size,
              std::chrono::milliseconds timeout = kEngineTimeout)
      : backend_(backend), size_(size), timeout_(timeout) {
    if (backend == "threads") {
      thread_comms_ = make_thread_communicators(size, timeout);
    } else {
      store_ = make_memory_store();
      prefix_ = engine_prefix(backend + std::to_string(size));
    }
  }

  // Builds rank `rank`'s world communicator (call on the rank's thread: shm
  // and gloo rendezvous with the other ranks).
  std::unique_ptr<Communicator> communicator(int rank) {
    if (backend_ == "threads") {
      std::lock_guard<std::mutex> lock(mutex_);
      return std::move(thread_comms_[rank]);
    }
    CommunicatorOptions o;
    o.rank = rank;
    o.size = size_;
    o.store = store_;
    o.prefix = prefix_ + "/world";
    o.timeout = timeout_;
    o.check_args = false;
    return make_communicator(backend_, o);
  }

  // Builds process-set communicators for world rank `rank`.
  CommunicatorFactory factory(int rank) {
    return [this, rank](const std::vector<int>& ranks, int set_id) {
      int index = 0;
      while (ranks[index] != rank) ++index;
      if (backend_ == "threads") {
        std::lock_guard<std::mutex> lock(mutex_);
        auto& comms = set_comms_[set_id];
        if (comms.empty())
          comms = make_thread_communicators(static_cast<int>(ranks.size()), timeout_);
        return std::move(comms[index]);
      }
      CommunicatorOptions o;
      o.rank = index;
      o.size = static_cast<int>(ranks.size());
      o.store = store_;
      o.prefix = prefix_ + "/set" + std::to_string(set_id);
      o.timeout = timeout_;
      o.check_args = false;
      return make_communicator(backend_, o);
    };
  }

  std::unique_ptr<Engine> engine(int rank, const EngineOptions& options = test_engine_options()) {
    return std::make_unique<Engine>(communicator(rank), factory(rank), options);
  }

  int size() const { return size_; }
  const std::string& backend() const { return backend_; }

 private:
  std::string backend_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Communicator>> thread_comms_;
  std::map<int, std::vector<std::unique_ptr<Communicator>>> set_comms_;
  std::shared_ptr<Store> store_;
  std::string prefix_;
};

// A float tensor that owns its storage.
struct Tensor {
  std::vector<float> data;
  std::vector<int64_t> shape;

  Tensor() = default;
  explicit Tensor(std::vector<int64_t> s, float fill = 0) : shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    data.assign(static_cast<size_t>(n), fill);
  }
  TensorView view() { return TensorView{data.data(), DType::kF32, shape}; }
};

// AllocateOutput into a Tensor owned by the caller.
inline AllocateOutput allocate_into(Tensor& t) {
  return [&t](const std::vector<int64_t>& shape) {
    t = Tensor(shape);
    return t.view();
  };
}

}  // namespace kolo::testing

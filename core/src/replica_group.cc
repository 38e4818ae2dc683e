// In-process replicas (replica_group.h).
#include "kolo/core/replica_group.h"

#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "kolo/core/config.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"

namespace kolo {
namespace {

using std::chrono::milliseconds;

// fn(i) for i in [0, n) on n threads; joins them all. Returns each one's
// error (null if it returned) and, in first_error, the index of the one that
// failed first in time (-1 if none). on_error(i, error) runs on thread i as
// soon as it failed, before the others are joined.
struct ThreadsOutcome {
  std::vector<std::exception_ptr> errors;
  int first_error = -1;
};

ThreadsOutcome run_threads(int n, const std::function<void(int)>& fn,
                           const std::function<void(int, std::exception_ptr)>& on_error) {
  ThreadsOutcome outcome;
  outcome.errors.resize(n);
  std::mutex mutex;
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (...) {
        std::exception_ptr error = std::current_exception();
        {
          std::lock_guard<std::mutex> lock(mutex);
          outcome.errors[i] = error;
          if (outcome.first_error < 0) outcome.first_error = i;
        }
        if (on_error) on_error(i, error);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return outcome;
}

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// One process: the replicas' communicators over the threads backend, and
// their process sets' built on first use by any member.
struct ThreadWorld {
  std::mutex mutex;
  std::vector<std::unique_ptr<Communicator>> world;
  std::map<int, std::vector<std::unique_ptr<Communicator>>> sets;  // set id -> by index
  milliseconds timeout{0};
};

EngineCommunicators thread_communicators(const std::shared_ptr<ThreadWorld>& tw, int replica) {
  EngineCommunicators comms;
  {
    std::lock_guard<std::mutex> lock(tw->mutex);
    comms.world = std::move(tw->world[replica]);
  }
  comms.factory = [tw, replica](const std::vector<int>& ranks, int set_id) {
    int index = -1;
    for (size_t k = 0; k < ranks.size(); ++k) {
      if (ranks[k] == replica) index = static_cast<int>(k);
    }
    if (index < 0) {
      throw ContractError("kolo process set " + std::to_string(set_id) +
                          ": this replica is not a member");
    }
    std::lock_guard<std::mutex> lock(tw->mutex);
    auto& comms = tw->sets[set_id];
    if (comms.empty()) {
      comms = make_thread_communicators(static_cast<int>(ranks.size()), tw->timeout);
    }
    return std::move(comms[index]);
  };
  return comms;
}

}  // namespace

ReplicaGroup::ReplicaGroup(const ReplicaGroupOptions& options) : replicas_(options.replicas) {
  if (options.replicas < 1) {
    throw ContractError("kolo::ReplicaGroup: replicas must be at least 1, got " +
                        std::to_string(options.replicas) +
                        "; pass the number of model replicas to run in this process");
  }
  Runtime* runtime = options.runtime;
  if (runtime && runtime->topology().size > 1) {
    ranks_ = runtime->topology().size;
    rank_ = runtime->topology().rank;
    // Every rank must run as many replicas: the members' numbering depends on it.
    int32_t extremes[2] = {replicas_, -replicas_};
    AllreduceOptions max;
    max.op = ReduceOp::kMax;
    runtime->world().allreduce(extremes, extremes, 2, DType::kI32, max);
    if (extremes[0] != -extremes[1]) {
      throw ContractError(
          "kolo::ReplicaGroup: every rank must run the same number of replicas, "
          "but they range from " +
          std::to_string(-extremes[1]) + " to " + std::to_string(extremes[0]) + " (this rank " +
          std::to_string(rank_) + ": " + std::to_string(replicas_) +
          "); pass the same count everywhere");
    }
  }
  const Config config = runtime ? runtime->config() : Config::load(process_env());
  EngineOptions engine_options =
      options.engine ? *options.engine : EngineOptions::from_config(config);

  std::string prefix;
  std::shared_ptr<ThreadWorld> thread_world;
  if (ranks_ > 1) {
    prefix = runtime->next_replica_prefix();
  } else {
    thread_world = std::make_shared<ThreadWorld>();
    thread_world->timeout =
        options.timeout.count() > 0
            ? options.timeout
            : milliseconds(static_cast<int64_t>(config.get_double("KOLO_TIMEOUT_SECONDS") * 1000));
    thread_world->world = make_thread_communicators(replicas_, thread_world->timeout);
  }

  engines_.resize(replicas_);
  comms_.resize(replicas_, nullptr);
  std::mutex comms_mutex;  // comms_ while the engines start
  ThreadsOutcome built = run_threads(
      replicas_,
      [&](int r) {
        EngineCommunicators comms = thread_world
                                        ? thread_communicators(thread_world, r)
                                        : runtime->replica_communicators(prefix, replicas_, r);
        {
          std::lock_guard<std::mutex> lock(comms_mutex);
          comms_[r] = comms.world.get();
        }
        try {
          engines_[r] = std::make_unique<Engine>(std::move(comms.world), std::move(comms.factory),
                                                 engine_options);
        } catch (...) {
          std::lock_guard<std::mutex> lock(comms_mutex);
          comms_[r] = nullptr;  // gone with the engine that failed to start
          throw;
        }
      },
      [&](int r, std::exception_ptr error) {
        // The others may wait for this one in their engine's start.
        std::lock_guard<std::mutex> lock(comms_mutex);
        for (Communicator* comm : comms_) {
          if (comm) comm->abort("replica " + std::to_string(r) + ": " + what_of(error), {});
        }
      });
  if (built.first_error >= 0) {
    std::exception_ptr error = built.errors[built.first_error];
    // Engines that did start stop together, on their own threads.
    run_threads(
        replicas_, [&](int r) { engines_[r].reset(); }, nullptr);
    std::rethrow_exception(error);
  }
}

ReplicaGroup::~ReplicaGroup() {
  // The engines negotiate their shutdown with each other: stop them at once.
  run_threads(
      replicas_, [&](int r) { engines_[r].reset(); }, nullptr);
}

int ReplicaGroup::member(int replica) const {
  if (replica < 0 || replica >= replicas_) {
    throw ContractError("kolo::ReplicaGroup: replica " + std::to_string(replica) +
                        " does not exist; this process runs replicas 0.." +
                        std::to_string(replicas_ - 1));
  }
  return rank_ * replicas_ + replica;
}

Engine& ReplicaGroup::engine(int replica) {
  member(replica);  // checks the index
  return *engines_[replica];
}

void ReplicaGroup::run(const std::function<void(int replica)>& fn) {
  if (!broken_.empty()) {
    throw ContractError("kolo::ReplicaGroup::run: the group failed in an earlier run (" + broken_ +
                        ") and its engines are aborted; build a new one");
  }
  ThreadsOutcome outcome = run_threads(replicas_, fn, [&](int r, std::exception_ptr error) {
    // Whoever waits for this replica (its sibling threads, other ranks'
    // replicas) fails now rather than at a timeout.
    comms_[r]->abort("replica " + std::to_string(member(r)) + " failed: " + what_of(error), {});
  });
  if (outcome.first_error >= 0) {
    broken_ = "replica " + std::to_string(member(outcome.first_error)) + ": " +
              what_of(outcome.errors[outcome.first_error]);
    std::rethrow_exception(outcome.errors[outcome.first_error]);
  }
}

}  // namespace kolo

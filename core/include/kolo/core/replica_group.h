// ReplicaGroup: N replicas of a computation as threads of one process, each
// with an engine of its own, in a world of (processes x N) members
// (TensorFlow's MirroredStrategy; the torch frontend's kolo::MirroredStrategy
// is built on it).
//
// Members. With P ranks underneath (a Runtime of P processes, or none: this
// process alone), replica r of rank p is member p * N + r of a world of P * N.
// Each member has its own Engine: the frontend's collectives and optimizers
// take it through CallOptions::engine and work unchanged, so a replica is a
// rank as far as they can tell (a DistributedOptimizer per replica averages
// over all P * N members).
//
// Transport. One process (P = 1): the threads backend, in process memory,
// nothing crosses a process boundary. Several: the runtime's backend with
// P * N members, built like the runtime's own engine (Runtime::
// replica_communicators): on one host shm, whose shared segment the replicas
// of one process reach in their own memory; across hosts gloo, composed
// hierarchically as the world is (shm within each host, one ring per local
// member across hosts). mpi is refused (its members are processes).
//
// Threads. run(fn) calls fn(replica) on N threads and returns when all have
// returned. When one throws, its engine's communicator is aborted, so the
// replicas and ranks waiting for it fail at once with a RuntimeFault naming
// it (never a hang); run() rethrows the first error (in time) and the group
// is unusable afterwards (every later run() is a ContractError): build a new
// one.
//
// Collective: every rank builds its groups in the same order, with the same
// number of replicas (checked: a ContractError on every rank naming both
// counts), and destroys them together (the engines stop together).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/engine.h"
#include "kolo/core/export.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

class Runtime;

struct ReplicaGroupOptions {
  // N >= 1: replicas in this process.
  int replicas = 1;
  // The ranks underneath. Null = this process alone (no kolo::init() needed).
  // A runtime of one rank is the same as none.
  Runtime* runtime = nullptr;
  // Per communicator call, P = 1 only (several ranks use the runtime's
  // KOLO_TIMEOUT_SECONDS); 0 = KOLO_TIMEOUT_SECONDS of the environment.
  std::chrono::milliseconds timeout{0};
  // The replicas' engines. Default: the runtime's settings
  // (EngineOptions::from_config), or the environment's without a runtime.
  std::optional<EngineOptions> engine;
};

class ReplicaGroup {
 public:
  // Builds the N engines, each on a thread of its own (collective across
  // ranks). ContractError for replicas < 1 or ranks that disagree on it;
  // RuntimeFault when peers do not arrive.
  explicit ReplicaGroup(const ReplicaGroupOptions& options);
  // Stops the engines (together, each on its own thread).
  ~ReplicaGroup();
  ReplicaGroup(const ReplicaGroup&) = delete;
  ReplicaGroup& operator=(const ReplicaGroup&) = delete;

  int replicas() const { return replicas_; }       // N
  int size() const { return ranks_ * replicas_; }  // P * N members
  int process_rank() const { return rank_; }       // p
  // Member number of this process's replica r: p * N + r.
  int member(int replica) const;
  Engine& engine(int replica);

  // fn(replica) on N threads, one per replica; returns when every one has
  // returned, rethrowing the first error (see "Threads" above).
  void run(const std::function<void(int replica)>& fn);

 private:
  int replicas_ = 1;
  int ranks_ = 1;
  int rank_ = 0;
  std::vector<std::unique_ptr<Engine>> engines_;
  // Each engine's communicator (owned by the engine): aborted when its
  // replica fails (Communicator::abort is thread-safe).
  std::vector<Communicator*> comms_;
  std::string broken_;  // why run() is refused; "" = usable
};

}  // namespace kolo
#pragma GCC visibility pop

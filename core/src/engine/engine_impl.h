// The Engine's private state, shared by its source files (internal):
//   engine.cc         the API: argument checks at the boundary, submission
//   engine_thread.cc  the background thread: cycles, negotiation outcomes,
//                     completion, process sets, timeline phases
//   execute.cc        running agreed responses: fusion batches, joined ranks'
//                     neutral inputs, the communicator calls
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/autotune.h"
#include "engine/controller.h"
#include "engine/device_path.h"
#include "engine/fusion_buffer.h"
#include "engine/handle.h"
#include "engine/message.h"
#include "engine/pending_list.h"
#include "engine/tensor_queue.h"
#include "engine/timeline.h"
#include "kolo/core/engine.h"
#include "log.h"

namespace kolo {

// The engine's own types, named unqualified by its .cc files (engine.cc,
// engine_thread.cc, execute.cc), which all include this header.
using detail::Controller;
using detail::ControllerOptions;
using detail::Finished;
using detail::FusionBuffer;
using detail::HandleState;
using detail::Request;
using detail::RequestInfo;
using detail::RequestKind;
using detail::Response;
using detail::TimelinePhase;
using Clock = std::chrono::steady_clock;

namespace detail {
// "[0, 2, 3]".
std::string world_ranks_text(const std::vector<int>& ranks);
}  // namespace detail

struct Engine::Impl {
  // One process set this rank belongs to (engine thread only).
  struct SetState {
    int id = 0;
    std::vector<int> ranks;  // world ranks, sorted
    int set_rank = 0;
    std::unique_ptr<Communicator> own_comm;  // null for set 0 (the world)
    Communicator* comm = nullptr;
    std::unique_ptr<detail::Controller> controller;
    // This rank's requests in negotiation or execution.
    detail::PendingList pending;
    // CUDA tensors (decided at the set's first one, identically on every
    // member: execute.cc's route()): staged through `comm`, or on NCCL.
    enum class CudaRoute { kUndecided, kStaged, kNccl } cuda_route = CudaRoute::kUndecided;
    std::unique_ptr<Communicator> nccl;
    std::unique_ptr<detail::BatchMemory> nccl_memory;  // fusion buffers on the device
  };

  // Where one batch runs: the communicator, the memory its buffers live in,
  // and whether its device tensors are staged through pinned host memory.
  struct Route {
    Communicator* comm = nullptr;
    detail::BatchMemory* mem = nullptr;
    bool staged = false;
  };

  Impl(std::unique_ptr<Communicator> world_comm, CommunicatorFactory comm_factory,
       const EngineOptions& engine_options);
  ~Impl();

  // Caller side.
  Handle submit(std::unique_ptr<detail::Request> request);
  void check_name(const std::string& op, const std::string& name) const;
  int set_size_checked(const std::string& op, int process_set, int* set_rank);

  // An agreed response and this rank's request in it (null if it has none).
  struct Item {
    const detail::Response* r = nullptr;
    detail::Request* req = nullptr;
  };

  // Engine thread.
  void run();
  void agree_options();
  void drain();
  void run_set(SetState& set, detail::Controller::Outcome& outcome);
  void execute(SetState& set, std::vector<Item>& data);
  // The route of a batch whose first response is `first` (CUDA: decides the
  // set's route at its first CUDA batch, a collective on set.comm; throws
  // ContractError, on every member alike, when KOLO_CUDA_COMM=nccl cannot be met).
  Route route(SetState& set, const detail::Response& first);
  void decide_cuda_route(SetState& set);
  // Before a batch runs: stages its device inputs (staged routes) or waits
  // for their readiness events (NCCL).
  void prepare_device_inputs(SetState& set, const Route& route, const std::vector<Item>& batch);
  void run_allreduce(SetState& set, const Route& route, const std::vector<Item>& batch);
  void run_allreduce_segments(SetState& set, const Route& route, const std::vector<Item>& batch,
                              const AllreduceOptions& o);
  void run_allgather(SetState& set, const Route& route, const std::vector<Item>& batch);
  void run_broadcast(SetState& set, const Route& route, const std::vector<Item>& batch);
  void run_reducescatter(SetState& set, const Route& route, const Item& item);
  void run_alltoall(SetState& set, const Route& route, const Item& item);
  void add_set(const detail::Response& r, SetState& world_set);
  void remove_set(const detail::Response& r, SetState& world_set);
  detail::Request* local(SetState& set, const std::string& name);
  // Takes `name`'s request out of negotiation; wake_finished() completes it
  // (runs its callbacks, marks it done) and wakes its waiters.
  void finish(SetState& set, const std::string& name, std::exception_ptr error);
  // The same for a request known by pointer (null: nothing to finish).
  void finish(SetState& set, detail::Request* request, std::exception_ptr error);
  // Completes every request finish()ed since the last call: releases their
  // names, runs their callbacks, then wakes their waiters.
  void wake_finished();
  void fail_everything(std::exception_ptr error);
  TensorView allocate_output(detail::Request* request, const std::vector<int64_t>& shape,
                             std::exception_ptr* error);
  void count_collective(uint64_t bytes);
  // The device runtime (made at the first CUDA tensor), and this rank's one
  // CUDA device (bound by its first CUDA tensor): caller side, under device_mutex.
  DeviceRuntime& device_runtime(const std::string& what);
  void bind_device(const std::string& what, const Device& device);

  // Timeline helpers (no-ops without a timeline or a local request).
  void phase_begin(detail::Request* r, detail::TimelinePhase phase, const char* op = nullptr);
  void phase_end(detail::Request* r, detail::TimelinePhase phase);
  void phases_close(detail::Request* r);
  void mark_ready(detail::Request* r);

  // --- fixed after construction
  std::unique_ptr<Communicator> world;
  CommunicatorFactory factory;
  EngineOptions options;
  int rank = 0;
  int size = 1;
  detail::Logger logger;

  // --- shared between callers and the engine thread
  detail::TensorQueue queue;
  std::shared_ptr<detail::EngineWaker> waker = std::make_shared<detail::EngineWaker>();
  mutable std::mutex mutex;               // guards the fields below
  std::map<int, std::vector<int>> sets;   // known process sets -> world ranks
  std::set<int> joining;                  // sets this rank is inside join() for
  std::atomic<int> joins_in_progress{0};  // joining.size(), read without the mutex
  bool stopped = false;                   // the thread has stopped: submits fail
  std::string stop_reason;
  std::exception_ptr fault;  // the RuntimeFault that stopped the engine, if any
  int add_calls = 0;
  Stats stats;
  std::atomic<bool> shutdown_requested{false};
  std::atomic<double> current_cycle_time_ms{1.0};
  std::atomic<int64_t> current_fusion_threshold_bytes{0};
  std::mutex device_mutex;  // guards the two below
  std::shared_ptr<DeviceRuntime> device;
  int bound_device = -1;  // this rank's CUDA device; -1 until its first CUDA tensor

  // --- engine thread only
  std::vector<std::unique_ptr<SetState>> active;  // by id; active[0] = set 0
  int next_set_id = 1;
  std::unique_ptr<detail::Timeline> timeline;
  std::unique_ptr<detail::Autotuner> autotuner;
  detail::BatchMemory host_memory;           // fusion and scratch buffers of host batches
  std::unique_ptr<detail::Staging> staging;  // CUDA tensors on host routes
  std::vector<AllreduceSegment> segments;    // a fused allreduce's tensors (native segments)
  uint64_t cycle_bytes = 0;
  std::vector<detail::Finished> finished;  // out of negotiation, handles not yet completed
  std::thread thread;
};

}  // namespace kolo

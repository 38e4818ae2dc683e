// The Engine: the caller-facing API and the background thread (engine.h).
//
// Callers submit requests from any thread (validated here, queued in the
// TensorQueue). One background thread per engine runs in cycles:
//   drain the queue -> for each process set this rank is in (set 0 first, then
//   by id): negotiate (controller.h) -> execute the agreed responses, fused
//   (fusion buffers) -> complete the handles -> sleep the rest of the cycle.
// Everything that touches communicators runs on that thread, so the
// communicators need no locking. Nothing here is process state: every engine
// owns its communicators, queue, caches and timeline.
#include "kolo/core/engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "engine/autotune.h"
#include "engine/controller.h"
#include "engine/fusion_buffer.h"
#include "engine/handle.h"
#include "engine/message.h"
#include "engine/tensor_queue.h"
#include "engine/timeline.h"
#include "kolo/core/errors.h"
#include "log.h"

namespace kolo {

using detail::Controller;
using detail::ControllerOptions;
using detail::FusionBuffer;
using detail::HandleState;
using detail::Request;
using detail::RequestInfo;
using detail::RequestKind;
using detail::Response;
using detail::TimelinePhase;
using Clock = std::chrono::steady_clock;

namespace {

// A globally idle engine with a cycle time below this waits up to this long
// for local work instead of spinning through empty negotiations.
constexpr std::chrono::microseconds kIdleWait{1000};
// Consecutive globally idle cycles before that backoff starts (~ a few ms of
// idleness at cycle time 0, so bursts of work keep the lowest latency).
constexpr int kIdleCyclesBeforeBackoff = 200;
constexpr const char* kReservedPrefix = "__kolo/";
// Requests larger than this run alone, directly on the caller's buffers,
// instead of being packed into a fusion buffer. Packing costs two extra
// copies of the tensor (in and out); on shm a 256 KiB copy costs about what
// one collective's fixed latency does, so beyond it fusion loses (measured
// on 2 shm ranks: the ResNet-50 gradient set packed whole ran ~2.9x the
// single-buffer allreduce, since pack + unpack triple the memory traffic of
// shm's cache-pipelined allreduce).
constexpr int64_t kMaxFusedTensorBytes = 256 << 10;

std::string world_ranks_text(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

// Writes `count` neutral elements of `op` (the value that leaves the others'
// reduction unchanged) for a joined rank. A negative prescale swaps min/max.
void fill_neutral(void* buffer, size_t count, DType dtype, ReduceOp op, double prescale) {
  if (count == 0) return;
  if (op == ReduceOp::kSum || op == ReduceOp::kAverage) {
    std::memset(buffer, 0, count * dtype_size(dtype));
    return;
  }
  enum { kOne, kHighest, kLowest } which = kOne;
  if (op == ReduceOp::kMin) which = prescale < 0 ? kLowest : kHighest;
  if (op == ReduceOp::kMax) which = prescale < 0 ? kHighest : kLowest;
  auto fill = [&](auto one, auto highest, auto lowest) {
    using T = decltype(one);
    const T value = which == kOne ? one : which == kHighest ? highest : lowest;
    T* p = static_cast<T*>(buffer);
    std::fill(p, p + count, value);
  };
  switch (dtype) {
    case DType::kU8:
      fill(uint8_t{1}, std::numeric_limits<uint8_t>::max(), uint8_t{0});
      break;
    case DType::kI8:
      fill(int8_t{1}, std::numeric_limits<int8_t>::max(), std::numeric_limits<int8_t>::min());
      break;
    case DType::kI32:
      fill(int32_t{1}, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min());
      break;
    case DType::kI64:
      fill(int64_t{1}, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min());
      break;
    case DType::kF16:  // 1.0, +inf, -inf
      fill(uint16_t{0x3C00}, uint16_t{0x7C00}, uint16_t{0xFC00});
      break;
    case DType::kBF16:
      fill(uint16_t{0x3F80}, uint16_t{0x7F80}, uint16_t{0xFF80});
      break;
    case DType::kF32:
      fill(1.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity());
      break;
    case DType::kF64:
      fill(1.0, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity());
      break;
  }
}

// The reduction a response runs: averages over the ranks that contributed
// (ranks that joined add neutral zeros and are not counted).
AllreduceOptions reduce_options(const Response& r, int set_size) {
  AllreduceOptions o;
  o.op = r.op;
  o.prescale = r.prescale;
  o.postscale = r.postscale;
  if (r.op == ReduceOp::kAverage && r.contributors < set_size) {
    o.op = ReduceOp::kSum;
    o.postscale = r.postscale / r.contributors;
  }
  return o;
}

}  // namespace

EngineOptions EngineOptions::from_config(const Config& config) {
  EngineOptions o;
  o.cycle_time_ms = config.get_double("KOLO_CYCLE_TIME_MS");
  o.fusion_threshold_bytes = config.get_int("KOLO_FUSION_THRESHOLD_BYTES");
  o.cache_capacity = static_cast<int>(config.get_int("KOLO_CACHE_CAPACITY"));
  o.stall_warning_seconds = config.get_double("KOLO_STALL_WARNING_SECONDS");
  o.stall_shutdown_seconds = config.get_double("KOLO_STALL_SHUTDOWN_SECONDS");
  o.timeline_path = config.get_string("KOLO_TIMELINE");
  o.timeline_all_ranks = config.get_bool("KOLO_TIMELINE_ALL_RANKS");
  o.autotune = config.get_bool("KOLO_AUTOTUNE");
  o.autotune_log = config.get_string("KOLO_AUTOTUNE_LOG");
  o.log_level = config.get_string("KOLO_LOG_LEVEL");
  return o;
}

// ---------------------------------------------------------------------------

struct Engine::Impl {
  // One process set this rank belongs to (engine thread only).
  struct SetState {
    int id = 0;
    std::vector<int> ranks;  // world ranks, sorted
    int set_rank = 0;
    std::unique_ptr<Communicator> own_comm;  // null for set 0 (the world)
    Communicator* comm = nullptr;
    std::unique_ptr<Controller> controller;
    // This rank's requests in negotiation or execution; keys view info.name.
    std::unordered_map<std::string_view, std::unique_ptr<Request>> pending;
  };

  Impl(std::unique_ptr<Communicator> world_comm, CommunicatorFactory comm_factory,
       const EngineOptions& engine_options);
  ~Impl();

  // Caller side.
  Handle submit(std::unique_ptr<Request> request);
  void check_name(const std::string& op, const std::string& name) const;
  int set_size_checked(const std::string& op, int process_set, int* set_rank);

  // Engine thread.
  void run();
  void agree_options();
  void drain();
  void run_set(SetState& set, Controller::Outcome& outcome);
  void execute(SetState& set, std::vector<const Response*>& data);
  void run_allreduce(SetState& set, const std::vector<const Response*>& batch);
  void run_allgather(SetState& set, const std::vector<const Response*>& batch);
  void run_broadcast(SetState& set, const std::vector<const Response*>& batch);
  void run_reducescatter(SetState& set, const Response& r);
  void run_alltoall(SetState& set, const Response& r);
  void add_set(const Response& r, SetState& world_set);
  void remove_set(const Response& r, SetState& world_set);
  Request* local(SetState& set, const std::string& name);
  // Completes `name`'s request; its waiters are woken by wake_finished().
  void finish(SetState& set, const std::string& name, std::exception_ptr error);
  void wake_finished();
  void fail_everything(std::exception_ptr error);
  TensorView allocate_output(Request* request, const std::vector<int64_t>& shape,
                             std::exception_ptr* error);
  void count_collective(uint64_t bytes);

  // Timeline helpers (no-ops without a timeline or a local request).
  void phase_begin(Request* r, TimelinePhase phase, const char* op = nullptr);
  void phase_end(Request* r, TimelinePhase phase);
  void phases_close(Request* r);
  void mark_ready(Request* r);

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
  mutable std::mutex mutex;              // guards the fields below
  std::map<int, std::vector<int>> sets;  // known process sets -> world ranks
  std::set<int> joining;                 // sets this rank is inside join() for
  bool stopped = false;                  // the thread has stopped: submits fail
  std::string stop_reason;
  std::exception_ptr fault;  // the RuntimeFault that stopped the engine, if any
  int add_calls = 0;
  Stats stats;
  std::atomic<bool> shutdown_requested{false};
  std::atomic<double> current_cycle_time_ms{1.0};
  std::atomic<int64_t> current_fusion_threshold_bytes{0};

  // --- engine thread only
  std::vector<std::unique_ptr<SetState>> active;  // by id; active[0] = set 0
  int next_set_id = 1;
  std::unique_ptr<detail::Timeline> timeline;
  std::unique_ptr<detail::Autotuner> autotuner;
  FusionBuffer fusion;      // packed inputs / in-place fused results
  FusionBuffer fusion_out;  // fused allgather results
  FusionBuffer scratch;     // neutral inputs and discarded outputs of joined ranks
  FusionBuffer scratch_out;
  uint64_t cycle_bytes = 0;
  std::vector<std::shared_ptr<HandleState>> to_wake;  // finished, waiters not yet woken
  std::thread thread;
};

Engine::Impl::Impl(std::unique_ptr<Communicator> world_comm, CommunicatorFactory comm_factory,
                   const EngineOptions& engine_options)
    : world(std::move(world_comm)), factory(std::move(comm_factory)), options(engine_options) {
  if (!world) {
    throw ContractError(
        "kolo::Engine: the world communicator is null; pass one that nobody else uses (the "
        "runtime builds it for Runtime::engine())");
  }
  rank = world->rank();
  size = world->size();
  logger = detail::Logger(detail::parse_log_level(options.log_level), rank);
  if (!(options.cycle_time_ms >= 0) || !std::isfinite(options.cycle_time_ms)) {
    throw ContractError("kolo::Engine: cycle_time_ms must be >= 0, got " +
                        std::to_string(options.cycle_time_ms));
  }
  if (options.fusion_threshold_bytes < 0) {
    throw ContractError("kolo::Engine: fusion_threshold_bytes must be >= 0 (0 = no fusion), got " +
                        std::to_string(options.fusion_threshold_bytes));
  }
  if (options.cache_capacity < 0) {
    throw ContractError("kolo::Engine: cache_capacity must be >= 0 (0 = no cache), got " +
                        std::to_string(options.cache_capacity));
  }
  if (!(options.stall_warning_seconds > 0) || !(options.stall_shutdown_seconds >= 0)) {
    throw ContractError(
        "kolo::Engine: stall_warning_seconds must be > 0 and stall_shutdown_seconds >= 0 (0 = "
        "never), got " +
        std::to_string(options.stall_warning_seconds) + " and " +
        std::to_string(options.stall_shutdown_seconds));
  }
  if (!options.timeline_path.empty() && (rank == 0 || options.timeline_all_ranks)) {
    std::string path = options.timeline_path;
    if (options.timeline_all_ranks) {
      const std::string suffix = ".json";
      if (path.size() > suffix.size() &&
          path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
        path.resize(path.size() - suffix.size());
      }
      path += ".rank" + std::to_string(rank) + ".json";
    }
    timeline = std::make_unique<detail::Timeline>(path, rank);
  }
  current_cycle_time_ms = options.cycle_time_ms;
  current_fusion_threshold_bytes = options.fusion_threshold_bytes;
  std::vector<int> all(size);
  for (int r = 0; r < size; ++r) all[r] = r;
  sets[0] = all;
  thread = std::thread([this] { run(); });
}

Engine::Impl::~Impl() {
  shutdown_requested = true;
  queue.wake();
  waker->poke();
  if (thread.joinable()) thread.join();
}

// ---- caller side ----------------------------------------------------------

void Engine::Impl::check_name(const std::string& op, const std::string& name) const {
  if (name.empty()) {
    throw ContractError("kolo::Engine::" + op +
                        ": name is empty; every request needs a name that all ranks use for it "
                        "(e.g. the parameter's name)");
  }
  if (name.rfind(kReservedPrefix, 0) == 0) {
    throw ContractError("kolo::Engine::" + op + ": name '" + name + "' starts with '" +
                        kReservedPrefix + "', which is reserved for the engine; rename it");
  }
}

int Engine::Impl::set_size_checked(const std::string& op, int process_set, int* set_rank) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = sets.find(process_set);
  if (it == sets.end()) {
    std::string known;
    for (const auto& [id, ranks] : sets) known += (known.empty() ? "" : ", ") + std::to_string(id);
    throw ContractError("kolo::Engine::" + op + ": process set " + std::to_string(process_set) +
                        " does not exist (known sets: " + known +
                        "); create it with add_process_set() on every rank first");
  }
  const auto& ranks = it->second;
  auto pos = std::find(ranks.begin(), ranks.end(), rank);
  if (pos == ranks.end()) {
    throw ContractError("kolo::Engine::" + op + ": rank " + std::to_string(rank) +
                        " is not a member of process set " + std::to_string(process_set) +
                        " (world ranks " + world_ranks_text(ranks) +
                        "); only its members may submit requests on it");
  }
  if (set_rank) *set_rank = static_cast<int>(pos - ranks.begin());
  return static_cast<int>(ranks.size());
}

Handle Engine::Impl::submit(std::unique_ptr<Request> request) {
  if (!request->handle) request->handle = std::make_shared<HandleState>();
  request->handle->waker = waker;
  request->submitted = Clock::now();
  std::shared_ptr<HandleState> handle = request->handle;
  std::lock_guard<std::mutex> lock(mutex);
  if (stopped) {
    if (fault) {
      try {
        std::rethrow_exception(fault);
      } catch (const RuntimeFault& e) {
        throw RuntimeFault(std::string("kolo engine stopped after a fault: ") + e.what(),
                           e.failed_ranks());
      }
    }
    throw RuntimeFault("kolo engine: " + stop_reason + "; no more requests can run on this engine");
  }
  if (request->info.kind != RequestKind::kJoin && joining.count(request->process_set) != 0) {
    throw ContractError(std::string("kolo::Engine: ") + request_kind_name(request->info.kind) +
                        " of tensor '" + request->info.name + "' submitted while this rank is " +
                        "inside join() on process set " + std::to_string(request->process_set) +
                        "; a rank that joined submits nothing until join() returns");
  }
  queue.push(std::move(request));
  return Handle(handle);
}

// ---- engine thread ----------------------------------------------------------

void Engine::Impl::agree_options() {
  // Every rank must fuse with the same threshold and size its bit vector with
  // the same cache capacity: rank 0's settings win.
  struct Wire {
    double cycle_time_ms;
    int64_t fusion_threshold_bytes;
    int64_t cache_capacity;
    double stall_warning_seconds;
    double stall_shutdown_seconds;
  } wire{options.cycle_time_ms, options.fusion_threshold_bytes, options.cache_capacity,
         options.stall_warning_seconds, options.stall_shutdown_seconds};
  const Wire mine = wire;
  BroadcastOptions root0;
  world->broadcast(&wire, sizeof(wire), DType::kU8, root0);
  if (std::memcmp(&mine, &wire, sizeof(wire)) != 0) {
    logger.warning(
        "engine settings differ from rank 0's (KOLO_CYCLE_TIME_MS, KOLO_FUSION_THRESHOLD_BYTES, "
        "KOLO_CACHE_CAPACITY, KOLO_STALL_*); using rank 0's");
  }
  options.cycle_time_ms = wire.cycle_time_ms;
  options.fusion_threshold_bytes = wire.fusion_threshold_bytes;
  options.cache_capacity = static_cast<int>(wire.cache_capacity);
  options.stall_warning_seconds = wire.stall_warning_seconds;
  options.stall_shutdown_seconds = wire.stall_shutdown_seconds;
  current_cycle_time_ms = options.cycle_time_ms;
  current_fusion_threshold_bytes = options.fusion_threshold_bytes;
}

void Engine::Impl::run() {
  std::exception_ptr error;
  std::string reason = "the engine was shut down";
  try {
    agree_options();
    auto world_set = std::make_unique<SetState>();
    world_set->id = 0;
    for (int r = 0; r < size; ++r) world_set->ranks.push_back(r);
    world_set->set_rank = rank;
    world_set->comm = world.get();
    ControllerOptions co;
    co.process_set = 0;
    co.world_ranks = world_set->ranks;
    co.set_rank = rank;
    co.cache_capacity = options.cache_capacity;
    co.stall_warning_seconds = options.stall_warning_seconds;
    co.stall_shutdown_seconds = options.stall_shutdown_seconds;
    world_set->controller = std::make_unique<Controller>(*world, co, logger);
    active.push_back(std::move(world_set));

    if (options.autotune && rank == 0) {
      detail::Autotuner::Options ao;
      ao.initial.cycle_time_ms = options.cycle_time_ms;
      ao.initial.fusion_threshold_bytes = options.fusion_threshold_bytes;
      ao.log_path = options.autotune_log;
      ao.logger = detail::Logger(detail::LogLevel::kInfo, rank);
      autotuner = std::make_unique<detail::Autotuner>(ao);
    }

    int idle_cycles = 0;
    for (;;) {
      const Clock::time_point start = Clock::now();
      cycle_bytes = 0;
      drain();
      bool stop = false;
      bool idle = false;
      for (size_t i = 0; i < active.size(); ++i) {
        SetState& set = *active[i];
        Controller::Outcome outcome = set.controller->negotiate(i == 0 && shutdown_requested);
        if (outcome.shutdown) {
          stop = true;
          break;
        }
        if (i == 0) idle = outcome.idle;
        if (timeline && i == 0 && (outcome.full_round || !outcome.responses.empty())) {
          timeline->mark("CYCLE_START");
        }
        run_set(set, outcome);
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++stats.cycles;
      }
      if (stop) {
        reason = "the engine was shut down (Engine destroyed on some rank)";
        break;
      }
      // Requests that went through a round without becoming ready now wait
      // for the other ranks.
      if (timeline) {
        for (auto& set : active) {
          for (auto& [name, request] : set->pending) {
            if (!request->negotiated_once) {
              request->negotiated_once = true;
              phase_begin(request.get(), TimelinePhase::kWaitForOtherRanks);
            }
          }
        }
      }
      idle_cycles = idle ? idle_cycles + 1 : 0;
      const double cycle_ms = current_cycle_time_ms;
      const auto cycle = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double, std::milli>(cycle_ms));
      const auto elapsed = Clock::now() - start;
      if (idle_cycles > kIdleCyclesBeforeBackoff && cycle < kIdleWait) {
        queue.wait_for_work(kIdleWait);
      } else if (elapsed < cycle) {
        waker->sleep_for(cycle - elapsed);  // a caller blocking in wait() ends it early
      }
      if (autotuner) {
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        const detail::Autotuner::Params p = autotuner->record(cycle_bytes, seconds);
        if (p.cycle_time_ms != current_cycle_time_ms ||
            p.fusion_threshold_bytes != current_fusion_threshold_bytes) {
          active[0]->controller->ship_params(p.cycle_time_ms, p.fusion_threshold_bytes);
        }
      }
    }
  } catch (const RuntimeFault& e) {
    error = std::current_exception();
    logger.error(std::string("engine stopped: ") + e.what());
  } catch (const std::exception& e) {
    // A broken invariant or a contract error outside any request (e.g. the
    // settings exchange); surfaced to every pending and later request.
    error = std::make_exception_ptr(RuntimeFault(std::string("kolo engine stopped: ") + e.what()));
    logger.error(std::string("engine stopped: ") + e.what());
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopped = true;
    stop_reason = reason;
    fault = error;
  }
  fail_everything(error ? error
                        : std::make_exception_ptr(
                              RuntimeFault("kolo engine: " + reason + " before this request ran")));
  if (timeline) timeline->flush();
}

void Engine::Impl::fail_everything(std::exception_ptr error) {
  for (auto& set : active) {
    std::vector<std::string> names;
    for (auto& [name, request] : set->pending) names.emplace_back(name);
    for (const auto& name : names) finish(*set, name, error);
  }
  wake_finished();
  for (auto& request : queue.drain()) {
    queue.release(request->process_set, request->info.name);
    request->handle->complete(error);
  }
}

void Engine::Impl::drain() {
  const Clock::time_point now = Clock::now();
  for (auto& request : queue.drain()) {
    SetState* set = nullptr;
    for (auto& s : active) {
      if (s->id == request->process_set) set = s.get();
    }
    if (set == nullptr) {
      queue.release(request->process_set, request->info.name);
      request->handle->complete(std::make_exception_ptr(ContractError(
          std::string("kolo::Engine: ") + request_kind_name(request->info.kind) + " of tensor '" +
          request->info.name + "': process set " + std::to_string(request->process_set) +
          " was removed before the request ran")));
      continue;
    }
    Request* r = request.get();
    set->controller->submit(r->info, now);
    set->pending[std::string_view(r->info.name)] = std::move(request);
    phase_begin(r, TimelinePhase::kNegotiate);
  }
}

Request* Engine::Impl::local(SetState& set, const std::string& name) {
  auto it = set.pending.find(name);
  return it == set.pending.end() ? nullptr : it->second.get();
}

void Engine::Impl::finish(SetState& set, const std::string& name, std::exception_ptr error) {
  auto it = set.pending.find(name);
  if (it == set.pending.end()) return;
  std::unique_ptr<Request> request = std::move(it->second);
  set.pending.erase(it);
  phases_close(request.get());
  queue.release(set.id, name);
  for (const std::string& message : request->handle->complete(error, false)) {
    logger.warning("a completion callback of '" + name + "' threw: " + message);
  }
  to_wake.push_back(std::move(request->handle));
}

void Engine::Impl::wake_finished() {
  for (auto& handle : to_wake) handle->wake();
  to_wake.clear();
}

void Engine::Impl::count_collective(uint64_t bytes) {
  cycle_bytes += bytes;
  std::lock_guard<std::mutex> lock(mutex);
  ++stats.collectives;
}

void Engine::Impl::run_set(SetState& set, Controller::Outcome& outcome) {
  if (outcome.has_params) {
    current_cycle_time_ms = outcome.cycle_time_ms;
    current_fusion_threshold_bytes = outcome.fusion_threshold_bytes;
    logger.debug("engine parameters from rank 0: cycle " + std::to_string(outcome.cycle_time_ms) +
                 " ms, fusion threshold " + std::to_string(outcome.fusion_threshold_bytes) +
                 " bytes");
  }
  uint64_t data_responses = 0;
  std::vector<const Response*> data;
  for (const detail::ResponsePtr& response : outcome.responses) {
    const Response& r = *response;
    if (is_data_kind(r.kind)) ++data_responses;
    if (r.status != Response::Status::kOk) {
      if (!r.contributed.empty() && !r.contributed[set.set_rank]) continue;
      const std::string name = r.kind == RequestKind::kJoin ? detail::kJoinName : r.name;
      if (r.status == Response::Status::kStalled) {
        finish(set, name, std::make_exception_ptr(RuntimeFault(r.error, r.failed_ranks)));
      } else {
        finish(set, name, std::make_exception_ptr(ContractError(r.error)));
      }
      continue;
    }
    switch (r.kind) {
      case RequestKind::kAddProcessSet:
        add_set(r, set);
        break;
      case RequestKind::kRemoveProcessSet:
        remove_set(r, set);
        break;
      case RequestKind::kJoin:
        break;
      default:
        mark_ready(local(set, r.name));
        data.push_back(&r);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    stats.cache_hits += outcome.cache_hits;
    stats.cache_evictions += outcome.cache_evictions;
    if (outcome.full_round) ++stats.full_negotiations;
    stats.responses += data_responses;
  }
  if (!data.empty()) execute(set, data);
  if (outcome.join_finished) {
    Request* join = local(set, detail::kJoinName);
    if (join) join->handle->value = outcome.last_joined;
    finish(set, detail::kJoinName, nullptr);
  }
  wake_finished();
}

// ---- execution ----------------------------------------------------------------

void Engine::Impl::execute(SetState& set, std::vector<const Response*>& data) {
  // Batches: allreduces with the same dtype and reduction, allgathers, and
  // broadcasts with the same root are packed together up to the fusion
  // threshold (greedy, in response order); the rest run one by one. Batches
  // run in the order of their first response, identically on every rank.
  const int n = static_cast<int>(set.ranks.size());
  const int64_t threshold = current_fusion_threshold_bytes;
  struct Batch {
    std::vector<const Response*> items;
    int64_t bytes = 0;
    bool open = true;
  };
  std::vector<Batch> batches;
  // Fusion key: kind, dtype, reduction, scales, root. Responses with equal
  // keys may share a batch.
  using Key = std::tuple<int, int, int, double, double, int>;
  std::map<Key, size_t> open_batch;  // key -> index in batches
  for (const Response* r : data) {
    int64_t bytes = 0;
    bool fusable = true;
    Key key{static_cast<int>(r->kind), 0, 0, 0.0, 0.0, 0};
    const int64_t esize = static_cast<int64_t>(dtype_size(r->dtype));
    switch (r->kind) {
      case RequestKind::kAllreduce: {
        const AllreduceOptions o = reduce_options(*r, n);
        bytes = r->elements() * esize;
        key = Key{static_cast<int>(r->kind),
                  static_cast<int>(r->dtype),
                  static_cast<int>(o.op),
                  o.prescale,
                  o.postscale,
                  0};
        break;
      }
      case RequestKind::kAllgather: {  // fused as bytes: any dtypes together
        int64_t rows = 0;
        for (int64_t v : r->rows) rows += v;
        bytes = rows * r->row_elements() * esize;
        break;
      }
      case RequestKind::kBroadcast:  // fused as bytes, per root
        bytes = r->elements() * esize;
        std::get<5>(key) = r->root;
        break;
      default:
        fusable = false;
        break;
    }
    // Packing costs two extra copies of the tensor; above this size they cost
    // more than the collective's fixed latency that fusion saves.
    if (bytes > kMaxFusedTensorBytes) fusable = false;
    if (fusable && threshold > 0) {
      auto it = open_batch.find(key);
      if (it != open_batch.end()) {
        Batch& b = batches[it->second];
        if (b.bytes + bytes <= threshold) {
          b.items.push_back(r);
          b.bytes += bytes;
          continue;
        }
      }
      open_batch[key] = batches.size();
    }
    batches.push_back(Batch{{r}, bytes, true});
  }

  for (Batch& b : batches) {
    const Response& first = *b.items.front();
    try {
      switch (first.kind) {
        case RequestKind::kAllreduce:
          run_allreduce(set, b.items);
          break;
        case RequestKind::kAllgather:
          run_allgather(set, b.items);
          break;
        case RequestKind::kBroadcast:
          run_broadcast(set, b.items);
          break;
        case RequestKind::kReducescatter:
          run_reducescatter(set, first);
          break;
        case RequestKind::kAlltoall:
          run_alltoall(set, first);
          break;
        default:
          break;
      }
    } catch (const RuntimeFault&) {
      throw;  // the communicator is gone: the run loop fails everything
    } catch (const std::exception& e) {
      // A communicator's ContractError is raised on every rank alike, so the
      // engine stays in step: fail this batch and go on.
      const auto error = std::make_exception_ptr(ContractError(e.what()));
      for (const Response* r : b.items) finish(set, r->name, error);
    }
    wake_finished();
  }
}

TensorView Engine::Impl::allocate_output(Request* request, const std::vector<int64_t>& shape,
                                         std::exception_ptr* error) {
  TensorView view;
  try {
    if (!request->allocate) throw ContractError("no AllocateOutput was given");
    view = request->allocate(shape);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (view.dtype != request->in.dtype) {
      throw ContractError(std::string("the allocated output has dtype ") + dtype_name(view.dtype) +
                          ", expected " + dtype_name(request->in.dtype));
    }
    if (view.numel() != numel) {
      throw ContractError("the allocated output has " + std::to_string(view.numel()) +
                          " elements, expected " + std::to_string(numel) + " (shape " +
                          detail::shape_text(shape) + ")");
    }
    if (numel > 0 && view.data == nullptr) {
      throw ContractError("the allocated output's data is null");
    }
    return view;
  } catch (const std::exception& e) {
    *error = std::make_exception_ptr(ContractError(
        std::string("kolo engine: ") + request_kind_name(request->info.kind) + " of tensor '" +
        request->info.name + "': AllocateOutput failed: " + e.what()));
    return TensorView{};
  }
}

void Engine::Impl::run_allreduce(SetState& set, const std::vector<const Response*>& batch) {
  const int n = static_cast<int>(set.ranks.size());
  const Response& first = *batch.front();
  const AllreduceOptions o = reduce_options(first, n);
  const size_t esize = dtype_size(first.dtype);
  if (batch.size() == 1) {
    Request* req = local(set, first.name);
    const size_t count = static_cast<size_t>(first.elements());
    const void* in;
    void* out;
    if (req) {
      in = req->in.data;
      out = req->out.data;
    } else {
      out = scratch.get(count * esize);
      fill_neutral(out, count, first.dtype, first.op, first.prescale);
      in = out;
    }
    phase_end(req, TimelinePhase::kQueue);
    phase_begin(req, TimelinePhase::kCollective, "ALLREDUCE");
    set.comm->allreduce(in, out, count, first.dtype, o);
    count_collective(count * esize);
    phase_end(req, TimelinePhase::kCollective);
    finish(set, first.name, nullptr);
    return;
  }
  size_t total = 0;
  std::vector<Request*> reqs;
  reqs.reserve(batch.size());
  for (const Response* r : batch) {
    total += static_cast<size_t>(r->elements());
    reqs.push_back(local(set, r->name));
  }
  uint8_t* buffer = fusion.get(total * esize);
  size_t offset = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Response* r = batch[i];
    Request* req = reqs[i];
    const size_t bytes = static_cast<size_t>(r->elements()) * esize;
    phase_end(req, TimelinePhase::kQueue);
    phase_begin(req, TimelinePhase::kMemcpyInFusionBuffer);
    if (req) {
      if (bytes) std::memcpy(buffer + offset, req->in.data, bytes);
    } else {
      fill_neutral(buffer + offset, static_cast<size_t>(r->elements()), r->dtype, r->op,
                   r->prescale);
    }
    phase_end(req, TimelinePhase::kMemcpyInFusionBuffer);
    phase_begin(req, TimelinePhase::kCollective, "ALLREDUCE");
    offset += bytes;
  }
  set.comm->allreduce(buffer, buffer, total, first.dtype, o);
  count_collective(total * esize);
  offset = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Response* r = batch[i];
    Request* req = reqs[i];
    const size_t bytes = static_cast<size_t>(r->elements()) * esize;
    phase_end(req, TimelinePhase::kCollective);
    phase_begin(req, TimelinePhase::kMemcpyOutFusionBuffer);
    if (req && bytes) std::memcpy(req->out.data, buffer + offset, bytes);
    phase_end(req, TimelinePhase::kMemcpyOutFusionBuffer);
    offset += bytes;
    finish(set, r->name, nullptr);
  }
}

void Engine::Impl::run_allgather(SetState& set, const std::vector<const Response*>& batch) {
  const int n = static_cast<int>(set.ranks.size());
  const int me = set.set_rank;
  struct Item {
    const Response* r;
    Request* req;
    TensorView out;
    std::exception_ptr error;
    size_t row_bytes;
    size_t total_rows;
  };
  std::vector<Item> items;
  size_t total_bytes = 0;
  for (const Response* r : batch) {
    Item it{r, local(set, r->name), {}, nullptr, 0, 0};
    it.row_bytes = static_cast<size_t>(r->row_elements()) * dtype_size(r->dtype);
    for (int64_t rows : r->rows) it.total_rows += static_cast<size_t>(rows);
    if (it.req) {
      std::vector<int64_t> shape = it.req->info.shape;
      shape[0] = static_cast<int64_t>(it.total_rows);
      it.out = allocate_output(it.req, shape, &it.error);
    }
    total_bytes += it.total_rows * it.row_bytes;
    items.push_back(it);
  }
  if (items.size() == 1) {
    Item& it = items.front();
    const size_t row_elements = static_cast<size_t>(it.r->row_elements());
    std::vector<size_t> counts(n);
    for (int k = 0; k < n; ++k) counts[k] = static_cast<size_t>(it.r->rows[k]) * row_elements;
    const void* in = it.req && it.req->in.data ? it.req->in.data : scratch.get(1);
    void* out = it.out.data && !it.error ? it.out.data : scratch_out.get(total_bytes + 1);
    phase_end(it.req, TimelinePhase::kQueue);
    phase_begin(it.req, TimelinePhase::kCollective, "ALLGATHER");
    set.comm->allgatherv(in, out, counts, it.r->dtype, CollectiveOptions{});
    count_collective(total_bytes);
    phase_end(it.req, TimelinePhase::kCollective);
  } else {
    // Rank k's block holds its rows of every tensor, in batch order.
    std::vector<size_t> block(n, 0);
    for (const Item& it : items) {
      for (int k = 0; k < n; ++k) block[k] += static_cast<size_t>(it.r->rows[k]) * it.row_bytes;
    }
    uint8_t* packed = fusion.get(block[me] + 1);
    uint8_t* gathered = fusion_out.get(total_bytes + 1);
    size_t offset = 0;
    for (Item& it : items) {
      const size_t bytes = static_cast<size_t>(it.r->rows[me]) * it.row_bytes;
      phase_end(it.req, TimelinePhase::kQueue);
      phase_begin(it.req, TimelinePhase::kMemcpyInFusionBuffer);
      if (bytes) std::memcpy(packed + offset, it.req->in.data, bytes);
      offset += bytes;
      phase_end(it.req, TimelinePhase::kMemcpyInFusionBuffer);
      phase_begin(it.req, TimelinePhase::kCollective, "ALLGATHER");
    }
    set.comm->allgatherv(packed, gathered, block, DType::kU8, CollectiveOptions{});
    count_collective(total_bytes);
    // Unpack: tensor t's rows from rank k follow the earlier tensors' rows in k's block.
    std::vector<size_t> block_start(n, 0);
    for (int k = 1; k < n; ++k) block_start[k] = block_start[k - 1] + block[k - 1];
    std::vector<size_t> within(n, 0);
    for (Item& it : items) {
      phase_end(it.req, TimelinePhase::kCollective);
      phase_begin(it.req, TimelinePhase::kMemcpyOutFusionBuffer);
      size_t out_offset = 0;
      for (int k = 0; k < n; ++k) {
        const size_t bytes = static_cast<size_t>(it.r->rows[k]) * it.row_bytes;
        if (it.req && !it.error && bytes) {
          std::memcpy(static_cast<uint8_t*>(it.out.data) + out_offset,
                      gathered + block_start[k] + within[k], bytes);
        }
        within[k] += bytes;
        out_offset += bytes;
      }
      phase_end(it.req, TimelinePhase::kMemcpyOutFusionBuffer);
    }
  }
  for (Item& it : items) {
    if (it.req) {
      std::lock_guard<std::mutex> lock(it.req->handle->mutex);
      it.req->handle->received_splits = it.r->rows;
      it.req->handle->output = it.out;
    }
    finish(set, it.r->name, it.error);
  }
}

void Engine::Impl::run_broadcast(SetState& set, const std::vector<const Response*>& batch) {
  const Response& first = *batch.front();
  const int root = first.root;
  const bool is_root = set.set_rank == root;
  BroadcastOptions bo;
  bo.root = root;
  if (batch.size() == 1) {
    Request* req = local(set, first.name);
    const size_t count = static_cast<size_t>(first.elements());
    void* buffer = req ? req->in.data : scratch.get(count * dtype_size(first.dtype) + 1);
    if (buffer == nullptr) buffer = scratch.get(1);
    phase_end(req, TimelinePhase::kQueue);
    phase_begin(req, TimelinePhase::kCollective, "BROADCAST");
    set.comm->broadcast(buffer, count, first.dtype, bo);
    count_collective(count * dtype_size(first.dtype));
    phase_end(req, TimelinePhase::kCollective);
    finish(set, first.name, nullptr);
    return;
  }
  size_t total = 0;
  for (const Response* r : batch)
    total += static_cast<size_t>(r->elements()) * dtype_size(r->dtype);
  uint8_t* buffer = fusion.get(total + 1);
  size_t offset = 0;
  for (const Response* r : batch) {
    Request* req = local(set, r->name);
    const size_t bytes = static_cast<size_t>(r->elements()) * dtype_size(r->dtype);
    phase_end(req, TimelinePhase::kQueue);
    if (is_root) {
      phase_begin(req, TimelinePhase::kMemcpyInFusionBuffer);
      if (bytes) std::memcpy(buffer + offset, req->in.data, bytes);
      phase_end(req, TimelinePhase::kMemcpyInFusionBuffer);
    }
    phase_begin(req, TimelinePhase::kCollective, "BROADCAST");
    offset += bytes;
  }
  set.comm->broadcast(buffer, total, DType::kU8, bo);
  count_collective(total);
  offset = 0;
  for (const Response* r : batch) {
    Request* req = local(set, r->name);
    const size_t bytes = static_cast<size_t>(r->elements()) * dtype_size(r->dtype);
    phase_end(req, TimelinePhase::kCollective);
    if (!is_root && req) {
      phase_begin(req, TimelinePhase::kMemcpyOutFusionBuffer);
      if (bytes) std::memcpy(req->in.data, buffer + offset, bytes);
      phase_end(req, TimelinePhase::kMemcpyOutFusionBuffer);
    }
    offset += bytes;
    finish(set, r->name, nullptr);
  }
}

void Engine::Impl::run_reducescatter(SetState& set, const Response& r) {
  const int n = static_cast<int>(set.ranks.size());
  const int me = set.set_rank;
  const AllreduceOptions o = reduce_options(r, n);
  const size_t esize = dtype_size(r.dtype);
  const size_t rows = static_cast<size_t>(r.shape[0]);
  const size_t row_elements = static_cast<size_t>(r.row_elements());
  const size_t base = rows / n;
  const size_t extra = rows % n;
  auto rows_of = [&](int k) { return base + (static_cast<size_t>(k) < extra ? 1 : 0); };

  Request* req = local(set, r.name);
  const void* in;
  void* out;
  if (req) {
    in = req->in.data;
    out = req->out.data;
  } else {
    void* neutral = scratch.get(rows * row_elements * esize + 1);
    fill_neutral(neutral, rows * row_elements, r.dtype, r.op, r.prescale);
    in = neutral;
    out = scratch_out.get(rows_of(me) * row_elements * esize + 1);
  }
  phase_end(req, TimelinePhase::kQueue);
  if (extra == 0) {
    phase_begin(req, TimelinePhase::kCollective, "REDUCESCATTER");
    set.comm->reducescatter(in ? in : scratch.get(1), out ? out : scratch_out.get(1),
                            base * row_elements, r.dtype, o);
    phase_end(req, TimelinePhase::kCollective);
  } else {
    // Uneven split: pad every rank's share to base + 1 rows, reduce-scatter
    // the padded buffer in place, copy this rank's rows out.
    const size_t block = (base + 1) * row_elements * esize;
    uint8_t* padded = fusion.get(block * n);
    phase_begin(req, TimelinePhase::kMemcpyInFusionBuffer);
    size_t from = 0;
    for (int k = 0; k < n; ++k) {
      const size_t bytes = rows_of(k) * row_elements * esize;
      if (bytes) std::memcpy(padded + k * block, static_cast<const uint8_t*>(in) + from, bytes);
      if (bytes < block) std::memset(padded + k * block + bytes, 0, block - bytes);
      from += bytes;
    }
    phase_end(req, TimelinePhase::kMemcpyInFusionBuffer);
    phase_begin(req, TimelinePhase::kCollective, "REDUCESCATTER");
    set.comm->reducescatter(padded, padded, (base + 1) * row_elements, r.dtype, o);
    phase_end(req, TimelinePhase::kCollective);
    phase_begin(req, TimelinePhase::kMemcpyOutFusionBuffer);
    const size_t mine = rows_of(me) * row_elements * esize;
    if (mine) std::memcpy(out, padded, mine);
    phase_end(req, TimelinePhase::kMemcpyOutFusionBuffer);
  }
  count_collective(rows * row_elements * esize);
  finish(set, r.name, nullptr);
}

void Engine::Impl::run_alltoall(SetState& set, const Response& r) {
  const int n = static_cast<int>(set.ranks.size());
  const int me = set.set_rank;
  const size_t row_elements = static_cast<size_t>(r.row_elements());
  const size_t esize = dtype_size(r.dtype);
  std::vector<size_t> send(n), recv(n);
  std::vector<int64_t> received(n);
  size_t recv_rows = 0;
  for (int k = 0; k < n; ++k) {
    send[k] = static_cast<size_t>(r.splits[me * n + k]) * row_elements;
    received[k] = r.splits[k * n + me];
    recv[k] = static_cast<size_t>(received[k]) * row_elements;
    recv_rows += static_cast<size_t>(received[k]);
  }
  Request* req = local(set, r.name);
  TensorView out;
  std::exception_ptr error;
  if (req) {
    std::vector<int64_t> shape = req->info.shape;
    shape[0] = static_cast<int64_t>(recv_rows);
    out = allocate_output(req, shape, &error);
  }
  const void* in = req && req->in.data ? req->in.data : scratch.get(1);
  void* out_data =
      out.data && !error ? out.data : scratch_out.get(recv_rows * row_elements * esize + 1);
  phase_end(req, TimelinePhase::kQueue);
  phase_begin(req, TimelinePhase::kCollective, "ALLTOALL");
  set.comm->alltoallv(in, send, out_data, recv, r.dtype, CollectiveOptions{});
  phase_end(req, TimelinePhase::kCollective);
  size_t bytes = 0;
  for (int k = 0; k < n; ++k) bytes += (send[k] + recv[k]) * esize;
  count_collective(bytes / 2);
  if (req) {
    std::lock_guard<std::mutex> lock(req->handle->mutex);
    req->handle->received_splits = received;
    req->handle->output = out;
  }
  finish(set, r.name, error);
}

// ---- process sets ---------------------------------------------------------------

void Engine::Impl::add_set(const Response& r, SetState& world_set) {
  const int id = next_set_id++;
  std::vector<int> ranks(r.splits.begin(), r.splits.end());
  {
    std::lock_guard<std::mutex> lock(mutex);
    sets[id] = ranks;
  }
  std::exception_ptr error;
  auto pos = std::find(ranks.begin(), ranks.end(), rank);
  if (pos != ranks.end()) {
    try {
      if (!factory) {
        throw ContractError(
            "kolo::Engine::add_process_set: this engine has no CommunicatorFactory to build the "
            "set's communicator; construct the Engine with one (Runtime::engine() does)");
      }
      auto state = std::make_unique<SetState>();
      state->id = id;
      state->ranks = ranks;
      state->set_rank = static_cast<int>(pos - ranks.begin());
      state->own_comm = factory(ranks, id);
      if (!state->own_comm || state->own_comm->size() != static_cast<int>(ranks.size()) ||
          state->own_comm->rank() != state->set_rank) {
        throw ContractError(
            "kolo::Engine::add_process_set: the CommunicatorFactory returned a "
            "communicator that is not rank " +
            std::to_string(state->set_rank) + " of " + std::to_string(ranks.size()));
      }
      state->comm = state->own_comm.get();
      ControllerOptions co;
      co.process_set = id;
      co.world_ranks = ranks;
      co.set_rank = state->set_rank;
      co.cache_capacity = options.cache_capacity;
      co.stall_warning_seconds = options.stall_warning_seconds;
      co.stall_shutdown_seconds = options.stall_shutdown_seconds;
      state->controller = std::make_unique<Controller>(*state->comm, co, logger);
      active.push_back(std::move(state));
    } catch (const std::exception& e) {
      logger.error("process set " + std::to_string(id) + " " + world_ranks_text(ranks) +
                   " could not be created on this rank: " + e.what());
      error = std::current_exception();
      std::lock_guard<std::mutex> lock(mutex);
      sets.erase(id);
    }
  }
  Request* req = local(world_set, r.name);
  if (req) req->handle->value = id;
  finish(world_set, r.name, error);
}

void Engine::Impl::remove_set(const Response& r, SetState& world_set) {
  const int id = r.root;
  {
    std::lock_guard<std::mutex> lock(mutex);
    sets.erase(id);
  }
  for (size_t i = 1; i < active.size(); ++i) {
    if (active[i]->id != id) continue;
    SetState& doomed = *active[i];
    std::vector<std::string> names;
    for (auto& [name, request] : doomed.pending) names.emplace_back(name);
    for (const auto& name : names) {
      finish(doomed, name,
             std::make_exception_ptr(ContractError("kolo::Engine: process set " +
                                                   std::to_string(id) + " was removed while '" +
                                                   name + "' was pending on it")));
    }
    active.erase(active.begin() + static_cast<long>(i));
    break;
  }
  finish(world_set, r.name, nullptr);
}

// ---- timeline ---------------------------------------------------------------------

void Engine::Impl::phase_begin(Request* r, TimelinePhase phase, const char* op) {
  if (!timeline || !r) return;
  timeline->begin(r->info.name, phase, op);
  r->open_phases.push_back(phase);
}

void Engine::Impl::phase_end(Request* r, TimelinePhase phase) {
  if (!timeline || !r) return;
  // Ends `phase` and anything still open inside it (strict nesting).
  auto it = std::find(r->open_phases.begin(), r->open_phases.end(), phase);
  if (it == r->open_phases.end()) return;
  while (r->open_phases.size() > static_cast<size_t>(it - r->open_phases.begin())) {
    timeline->end(r->info.name, r->open_phases.back());
    r->open_phases.pop_back();
  }
}

void Engine::Impl::phases_close(Request* r) {
  if (!timeline || !r) return;
  while (!r->open_phases.empty()) {
    timeline->end(r->info.name, r->open_phases.back());
    r->open_phases.pop_back();
  }
}

void Engine::Impl::mark_ready(Request* r) {
  if (!timeline || !r) return;
  phases_close(r);  // NEGOTIATE (and WAIT_FOR_OTHER_RANKS inside it)
  phase_begin(r, TimelinePhase::kQueue);
}

// ---------------------------------------------------------------------------
// Engine: argument checks at the API boundary, then submit.

namespace {

void check_view(const std::string& op, const std::string& name, const char* argument,
                const TensorView& view) {
  for (int64_t d : view.shape) {
    if (d < 0) {
      throw ContractError("kolo::Engine::" + op + " of '" + name + "': " + argument +
                          " has a negative dimension in shape " + detail::shape_text(view.shape));
    }
  }
  if (static_cast<int>(view.dtype) >= kNumDTypes) {
    throw ContractError("kolo::Engine::" + op + " of '" + name + "': " + argument +
                        " has an unknown dtype " + std::to_string(static_cast<int>(view.dtype)));
  }
  if (view.numel() > 0 && view.data == nullptr) {
    throw ContractError("kolo::Engine::" + op + " of '" + name + "': " + argument +
                        ".data is null but its shape " + detail::shape_text(view.shape) + " has " +
                        std::to_string(view.numel()) + " elements");
  }
}

void check_reduce(const std::string& op, const std::string& name, const RequestOptions& o) {
  if (static_cast<int>(o.op) >= kNumReduceOps) {
    throw ContractError("kolo::Engine::" + op + " of '" + name + "': op " +
                        std::to_string(static_cast<int>(o.op)) +
                        " is not a ReduceOp; use sum, average, min, max or product");
  }
  if (!std::isfinite(o.prescale) || !std::isfinite(o.postscale)) {
    throw ContractError("kolo::Engine::" + op + " of '" + name + "': prescale " +
                        std::to_string(o.prescale) + " and postscale " +
                        std::to_string(o.postscale) + " must be finite (1.0 for none)");
  }
}

// The buffer and dtype of a view; the shape lives in the request's info.
TensorView data_only(const TensorView& view) { return TensorView{view.data, view.dtype, {}}; }

RequestInfo make_info(RequestKind kind, const std::string& name, const TensorView& in,
                      const RequestOptions& o) {
  RequestInfo info;
  info.kind = kind;
  info.name = name;
  info.dtype = in.dtype;
  info.shape = in.shape;
  info.op = o.op;
  info.prescale = o.prescale;
  info.postscale = o.postscale;
  info.root = o.root;
  return info;
}

}  // namespace

Engine::Engine(std::unique_ptr<Communicator> world, CommunicatorFactory factory,
               const EngineOptions& options)
    : impl_(std::make_unique<Impl>(std::move(world), std::move(factory), options)) {}

Engine::~Engine() = default;

int Engine::rank() const { return impl_->rank; }
int Engine::size() const { return impl_->size; }

Handle Engine::allreduce_async(const std::string& name, const TensorView& in, const TensorView& out,
                               const RequestOptions& options) {
  const std::string op = "allreduce_async";
  impl_->check_name(op, name);
  impl_->set_size_checked(op, options.process_set, nullptr);
  check_view(op, name, "in", in);
  check_view(op, name, "out", out);
  check_reduce(op, name, options);
  if (out.dtype != in.dtype || out.numel() != in.numel()) {
    throw ContractError("kolo::Engine::allreduce_async of '" + name + "': out (" +
                        dtype_name(out.dtype) + " " + detail::shape_text(out.shape) +
                        ") must have the dtype and element count of in (" + dtype_name(in.dtype) +
                        " " + detail::shape_text(in.shape) + ")");
  }
  auto request = std::make_unique<Request>();
  request->info = make_info(RequestKind::kAllreduce, name, in, options);
  request->info.root = 0;
  request->process_set = options.process_set;
  request->in = data_only(in);
  request->out = data_only(out);
  return impl_->submit(std::move(request));
}

Handle Engine::allgather_async(const std::string& name, const TensorView& in,
                               AllocateOutput allocate, const RequestOptions& options) {
  const std::string op = "allgather_async";
  impl_->check_name(op, name);
  impl_->set_size_checked(op, options.process_set, nullptr);
  check_view(op, name, "in", in);
  if (in.shape.empty()) {
    throw ContractError("kolo::Engine::allgather_async of '" + name +
                        "': in is a scalar; allgather concatenates along the first dimension, "
                        "so pass a tensor of at least one dimension (e.g. shape [1])");
  }
  if (!allocate) {
    throw ContractError("kolo::Engine::allgather_async of '" + name +
                        "': allocate is empty; pass a function that returns the output buffer");
  }
  auto request = std::make_unique<Request>();
  request->info = make_info(RequestKind::kAllgather, name, in, RequestOptions{});
  request->info.op = ReduceOp::kSum;
  request->process_set = options.process_set;
  request->in = data_only(in);
  request->allocate = std::move(allocate);
  return impl_->submit(std::move(request));
}

Handle Engine::broadcast_async(const std::string& name, const TensorView& buffer,
                               const RequestOptions& options) {
  const std::string op = "broadcast_async";
  impl_->check_name(op, name);
  const int n = impl_->set_size_checked(op, options.process_set, nullptr);
  check_view(op, name, "buffer", buffer);
  if (options.root < 0 || options.root >= n) {
    throw ContractError("kolo::Engine::broadcast_async of '" + name + "': root " +
                        std::to_string(options.root) + " is not a rank of process set " +
                        std::to_string(options.process_set) + " (" + std::to_string(n) +
                        " ranks); use 0 <= root < " + std::to_string(n));
  }
  auto request = std::make_unique<Request>();
  request->info = make_info(RequestKind::kBroadcast, name, buffer, RequestOptions{});
  request->info.op = ReduceOp::kSum;
  request->info.root = options.root;
  request->process_set = options.process_set;
  request->in = data_only(buffer);
  return impl_->submit(std::move(request));
}

Handle Engine::reducescatter_async(const std::string& name, const TensorView& in,
                                   const TensorView& out, const RequestOptions& options) {
  const std::string op = "reducescatter_async";
  impl_->check_name(op, name);
  int set_rank = 0;
  const int n = impl_->set_size_checked(op, options.process_set, &set_rank);
  check_view(op, name, "in", in);
  check_view(op, name, "out", out);
  check_reduce(op, name, options);
  if (in.shape.empty()) {
    throw ContractError("kolo::Engine::reducescatter_async of '" + name +
                        "': in is a scalar; reducescatter splits the first dimension across the "
                        "ranks, so pass a tensor of at least one dimension");
  }
  const std::vector<int64_t> expected = reducescatter_shape(in.shape, n, set_rank);
  int64_t expected_numel = 1;
  for (int64_t d : expected) expected_numel *= d;
  if (out.dtype != in.dtype || out.numel() != expected_numel) {
    throw ContractError("kolo::Engine::reducescatter_async of '" + name + "': out (" +
                        dtype_name(out.dtype) + " " + detail::shape_text(out.shape) +
                        ") must have dtype " + dtype_name(in.dtype) + " and shape " +
                        detail::shape_text(expected) +
                        " (Engine::reducescatter_shape of the input for this rank)");
  }
  auto request = std::make_unique<Request>();
  request->info = make_info(RequestKind::kReducescatter, name, in, options);
  request->info.root = 0;
  request->process_set = options.process_set;
  request->in = data_only(in);
  request->out = data_only(out);
  return impl_->submit(std::move(request));
}

Handle Engine::alltoall_async(const std::string& name, const TensorView& in,
                              const std::vector<int64_t>& splits, AllocateOutput allocate,
                              const RequestOptions& options) {
  const std::string op = "alltoall_async";
  impl_->check_name(op, name);
  const int n = impl_->set_size_checked(op, options.process_set, nullptr);
  check_view(op, name, "in", in);
  if (in.shape.empty()) {
    throw ContractError("kolo::Engine::alltoall_async of '" + name +
                        "': in is a scalar; alltoall splits the first dimension, so pass a "
                        "tensor of at least one dimension");
  }
  if (!allocate) {
    throw ContractError("kolo::Engine::alltoall_async of '" + name +
                        "': allocate is empty; pass a function that returns the output buffer");
  }
  std::vector<int64_t> rows = splits;
  const int64_t first = in.shape[0];
  if (rows.empty()) {
    if (first % n != 0) {
      throw ContractError("kolo::Engine::alltoall_async of '" + name + "': splits is empty, so " +
                          "the first dimension " + std::to_string(first) +
                          " must divide evenly by the " + std::to_string(n) +
                          " ranks; pass explicit splits");
    }
    rows.assign(n, first / n);
  }
  if (static_cast<int>(rows.size()) != n) {
    throw ContractError("kolo::Engine::alltoall_async of '" + name + "': splits has " +
                        std::to_string(rows.size()) + " entries but the process set has " +
                        std::to_string(n) + " ranks; pass one row count per rank");
  }
  int64_t sum = 0;
  for (int64_t v : rows) {
    if (v < 0) {
      throw ContractError("kolo::Engine::alltoall_async of '" + name + "': splits " +
                          detail::shape_text(rows) + " has a negative entry");
    }
    sum += v;
  }
  if (sum != first) {
    throw ContractError("kolo::Engine::alltoall_async of '" + name + "': splits " +
                        detail::shape_text(rows) + " add up to " + std::to_string(sum) +
                        " rows but in has " + std::to_string(first) + " (shape " +
                        detail::shape_text(in.shape) + ")");
  }
  auto request = std::make_unique<Request>();
  request->info = make_info(RequestKind::kAlltoall, name, in, RequestOptions{});
  request->info.op = ReduceOp::kSum;
  request->info.splits = rows;
  request->process_set = options.process_set;
  request->in = data_only(in);
  request->allocate = std::move(allocate);
  return impl_->submit(std::move(request));
}

void Engine::allreduce(const std::string& name, const TensorView& in, const TensorView& out,
                       const RequestOptions& options) {
  allreduce_async(name, in, out, options).wait();
}

void Engine::broadcast(const std::string& name, const TensorView& buffer,
                       const RequestOptions& options) {
  broadcast_async(name, buffer, options).wait();
}

std::vector<int64_t> Engine::reducescatter_shape(const std::vector<int64_t>& shape, int set_size,
                                                 int set_rank) {
  if (shape.empty()) {
    throw ContractError(
        "kolo::Engine::reducescatter_shape: the shape is a scalar; reducescatter "
        "splits the first dimension, so it needs at least one dimension");
  }
  if (set_size < 1 || set_rank < 0 || set_rank >= set_size) {
    throw ContractError("kolo::Engine::reducescatter_shape: set_rank " + std::to_string(set_rank) +
                        " is not in [0, " + std::to_string(set_size) + ")");
  }
  if (shape[0] < 0) {
    throw ContractError("kolo::Engine::reducescatter_shape: negative first dimension in " +
                        detail::shape_text(shape));
  }
  std::vector<int64_t> out = shape;
  out[0] = shape[0] / set_size + (set_rank < shape[0] % set_size ? 1 : 0);
  return out;
}

int Engine::join(int process_set) {
  impl_->set_size_checked("join", process_set, nullptr);
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->joining.count(process_set) != 0) {
      throw ContractError(
          "kolo::Engine::join: this rank is already inside join() on process "
          "set " +
          std::to_string(process_set));
    }
    impl_->joining.insert(process_set);
  }
  struct Unjoin {
    Impl* impl;
    int set;
    ~Unjoin() {
      std::lock_guard<std::mutex> lock(impl->mutex);
      impl->joining.erase(set);
    }
  } unjoin{impl_.get(), process_set};
  auto request = std::make_unique<Request>();
  request->info.kind = RequestKind::kJoin;
  request->info.name = detail::kJoinName;
  request->process_set = process_set;
  auto state = std::make_shared<HandleState>();
  request->handle = state;
  impl_->submit(std::move(request)).wait();
  // The engine stored the last rank to join in the state's value.
  std::lock_guard<std::mutex> lock(state->mutex);
  return static_cast<int>(state->value);
}

int Engine::add_process_set(const std::vector<int>& ranks) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty()) {
    throw ContractError(
        "kolo::Engine::add_process_set: ranks is empty; a process set needs at "
        "least one rank");
  }
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= size()) {
      throw ContractError("kolo::Engine::add_process_set: rank " + std::to_string(sorted[i]) +
                          " is not a world rank (0 <= rank < " + std::to_string(size()) + ")");
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      throw ContractError("kolo::Engine::add_process_set: rank " + std::to_string(sorted[i]) +
                          " appears twice in " + world_ranks_text(ranks));
    }
  }
  int call = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    call = impl_->add_calls++;
  }
  auto request = std::make_unique<Request>();
  request->info.kind = RequestKind::kAddProcessSet;
  request->info.name = "__kolo/add_process_set/" + std::to_string(call);
  request->info.splits.assign(sorted.begin(), sorted.end());
  request->process_set = 0;
  auto state = std::make_shared<HandleState>();
  request->handle = state;
  impl_->submit(std::move(request)).wait();
  std::lock_guard<std::mutex> lock(state->mutex);
  return static_cast<int>(state->value);
}

void Engine::remove_process_set(int process_set) {
  if (process_set == 0) {
    throw ContractError("kolo::Engine::remove_process_set: set 0 (all ranks) cannot be removed");
  }
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    if (impl_->sets.count(process_set) == 0) {
      throw ContractError("kolo::Engine::remove_process_set: process set " +
                          std::to_string(process_set) + " does not exist");
    }
  }
  auto request = std::make_unique<Request>();
  request->info.kind = RequestKind::kRemoveProcessSet;
  request->info.name = "__kolo/remove_process_set/" + std::to_string(process_set);
  request->info.root = process_set;
  request->process_set = 0;
  impl_->submit(std::move(request)).wait();
}

double Engine::cycle_time_ms() const { return impl_->current_cycle_time_ms; }
int64_t Engine::fusion_threshold_bytes() const { return impl_->current_fusion_threshold_bytes; }

Engine::Stats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stats;
}

}  // namespace kolo

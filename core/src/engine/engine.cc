// The Engine's API (engine.h): arguments are checked here, at the boundary,
// and requests queued for the background thread (engine_thread.cc).
//
// One background thread per engine runs in cycles:
//   drain the queue -> for each process set this rank is in (set 0 first, then
//   by id): negotiate (controller.h) -> execute the agreed responses, fused
//   (execute.cc) -> complete the handles -> sleep the rest of the cycle.
// Everything that touches communicators runs on that thread, so the
// communicators need no locking. Nothing here is process state: every engine
// owns its communicators, queue, caches and timeline.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_impl.h"
#include "kolo/core/errors.h"
#include "kolo/core/split.h"

namespace kolo {

namespace {

constexpr const char* kReservedPrefix = "__kolo/";

}  // namespace

namespace detail {

std::string world_ranks_text(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

}  // namespace detail

using detail::world_ranks_text;

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
  o.cuda_comm = config.get_string("KOLO_CUDA_COMM");
  return o;
}

// ---------------------------------------------------------------------------

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
  if (process_set == 0) {  // all ranks, and never removed: no lookup (the common case)
    if (set_rank) *set_rank = rank;
    return size;
  }
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

DeviceRuntime& Engine::Impl::device_runtime(const std::string& what) {
  std::lock_guard<std::mutex> lock(device_mutex);
  if (!device) {
    try {
      device = options.device_runtime ? options.device_runtime : cuda_runtime();
    } catch (const ContractError& e) {
      throw ContractError(what + " is a CUDA tensor, but " + e.what());
    }
    staging = std::make_unique<detail::Staging>(device.get());
  }
  return *device;
}

void Engine::Impl::bind_device(const std::string& what, const Device& d) {
  std::lock_guard<std::mutex> lock(device_mutex);
  if (bound_device < 0) bound_device = d.index;
  if (d.index != bound_device) {
    throw ContractError(what + " is on " + d.str() +
                        ", but this rank's earlier CUDA tensors are "
                        "on cuda:" +
                        std::to_string(bound_device) +
                        "; kolo runs each rank on one GPU (as Horovod and DDP do): move the "
                        "tensor there, or pin the rank to one device (torch::cuda::set_device "
                        "with the local rank)");
  }
}

Handle Engine::Impl::submit(std::unique_ptr<Request> request) {
  if (!request->handle) request->handle = std::make_shared<HandleState>();
  if (!request->in.device.is_cpu()) {
    const std::string what = std::string("kolo::Engine: ") + request_kind_name(request->info.kind) +
                             " of tensor '" + request->info.name + "'";
    if (request->in.device.type != DeviceType::kCUDA) {
      throw ContractError(what + " is on device " + request->in.device.str() +
                          ", which kolo does not support; use CPU or CUDA tensors");
    }
    DeviceRuntime& runtime = device_runtime(what);
    if (runtime.type() != DeviceType::kCUDA) {
      throw ContractError(what +
                          " is a CUDA tensor, but this engine's device runtime is not CUDA's");
    }
    bind_device(what, request->in.device);
    // Readiness: the work queued on the producer's stream up to this call.
    request->ready = runtime.record(request->in.device.index, request->in.stream);
    request->info.device = DeviceType::kCUDA;
  } else {
    request->info.device = DeviceType::kCPU;
  }
  if (request->handle->waker != waker) request->handle->waker = waker;
  std::shared_ptr<HandleState> handle = request->handle;
  // No engine-wide lock on this per-tensor path: the join check takes it only
  // while some join() runs, and a stopped engine is seen by the queue, which
  // the engine thread closes (after setting `stopped`) before failing what
  // it holds.
  if (request->info.kind != RequestKind::kJoin &&
      joins_in_progress.load(std::memory_order_acquire) > 0) {
    std::lock_guard<std::mutex> lock(mutex);
    if (joining.count(request->process_set) != 0) {
      throw ContractError(std::string("kolo::Engine: ") + request_kind_name(request->info.kind) +
                          " of tensor '" + request->info.name + "' submitted while this rank is " +
                          "inside join() on process set " + std::to_string(request->process_set) +
                          "; a rank that joined submits nothing until join() returns");
    }
  }
  if (!queue.push(std::move(request))) {
    std::lock_guard<std::mutex> lock(mutex);
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
  return Handle(std::move(handle));
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

// An output lives where its input does (allreduce, reducescatter).
void check_same_device(const std::string& op, const std::string& name, const TensorView& in,
                       const TensorView& out) {
  if (out.device != in.device) {
    throw ContractError("kolo::Engine::" + op + " of '" + name + "': out is on " +
                        out.device.str() + " but in is on " + in.device.str() +
                        "; pass an output on the input's device");
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
void set_data_only(TensorView& target, const TensorView& view) {
  target.data = view.data;
  target.dtype = view.dtype;
  target.shape.clear();
  target.device = view.device;
  target.stream = view.stream;
}

// A request for `kind` of `name` on `in`, in a recycled Request when the
// queue has one (its name and shape buffers keep their capacity, so a
// training step's submissions allocate nothing but the handle).
std::unique_ptr<Request> make_request(detail::TensorQueue& queue, RequestKind kind,
                                      const std::string& name, const TensorView& in,
                                      const RequestOptions& o) {
  std::unique_ptr<Request> request = queue.take_request();
  RequestInfo& info = request->info;
  info.kind = kind;
  info.name.assign(name);
  info.dtype = in.dtype;
  info.shape.assign(in.shape.begin(), in.shape.end());
  info.op = o.op;
  info.prescale = o.prescale;
  info.postscale = o.postscale;
  info.root = o.root;
  info.splits.clear();
  request->process_set = o.process_set;
  set_data_only(request->in, in);
  return request;
}

}  // namespace

Engine::Engine(std::unique_ptr<Communicator> world, CommunicatorFactory factory,
               const EngineOptions& options)
    : impl_(std::make_unique<Impl>(std::move(world), std::move(factory), options)) {}

Engine::~Engine() = default;

std::unique_ptr<Engine> make_solo_engine(const EngineOptions& options) {
  CommunicatorFactory one_rank = [](const std::vector<int>&, int) {
    return std::move(make_thread_communicators(1).front());
  };
  return std::make_unique<Engine>(std::move(make_thread_communicators(1).front()), one_rank,
                                  options);
}

int Engine::rank() const { return impl_->rank; }
int Engine::size() const { return impl_->size; }

bool Engine::stopped() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stopped;
}

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
  check_same_device(op, name, in, out);
  auto request = make_request(impl_->queue, RequestKind::kAllreduce, name, in, options);
  request->info.root = 0;
  request->process_set = options.process_set;
  set_data_only(request->out, out);
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
  auto request = make_request(impl_->queue, RequestKind::kAllgather, name, in, RequestOptions{});
  request->info.op = ReduceOp::kSum;
  request->process_set = options.process_set;
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
  auto request =
      make_request(impl_->queue, RequestKind::kBroadcast, name, buffer, RequestOptions{});
  request->info.op = ReduceOp::kSum;
  request->info.root = options.root;
  request->process_set = options.process_set;
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
  check_same_device(op, name, in, out);
  auto request = make_request(impl_->queue, RequestKind::kReducescatter, name, in, options);
  request->info.root = 0;
  request->process_set = options.process_set;
  set_data_only(request->out, out);
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
  auto request = make_request(impl_->queue, RequestKind::kAlltoall, name, in, RequestOptions{});
  request->info.op = ReduceOp::kSum;
  request->info.splits = rows;
  request->process_set = options.process_set;
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
  out[0] = even_split(shape[0], set_size, set_rank).count;
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
    impl_->joins_in_progress.fetch_add(1, std::memory_order_acq_rel);
  }
  struct Unjoin {
    Impl* impl;
    int set;
    ~Unjoin() {
      std::lock_guard<std::mutex> lock(impl->mutex);
      impl->joining.erase(set);
      impl->joins_in_progress.fetch_sub(1, std::memory_order_acq_rel);
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

ProcessSet::ProcessSet(int id, std::vector<int> ranks, int world_rank)
    : id_(id), ranks_(std::move(ranks)) {
  auto pos = std::find(ranks_.begin(), ranks_.end(), world_rank);
  rank_ = pos == ranks_.end() ? -1 : static_cast<int>(pos - ranks_.begin());
}

ProcessSet Engine::process_set(int id) const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto it = impl_->sets.find(id);
  if (it == impl_->sets.end()) {
    std::string known;
    for (const auto& item : impl_->sets) {
      known += (known.empty() ? "" : ", ") + std::to_string(item.first);
    }
    throw ContractError("kolo::Engine::process_set: process set " + std::to_string(id) +
                        " does not exist (known sets: " + known +
                        "); create it with add_process_set() on every rank first");
  }
  return ProcessSet(id, it->second, impl_->rank);
}

ProcessSet Engine::add_process_set(const std::vector<int>& ranks) {
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
  int id = 0;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    id = static_cast<int>(state->value);
  }
  return process_set(id);
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

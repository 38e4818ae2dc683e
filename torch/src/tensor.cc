// Tensor adapter and collectives on torch::Tensor (kolo/torch/tensor.h).
#include "kolo/torch/tensor.h"

#include <torch/serialize/archive.h>
#if KOLO_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include "common.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"

namespace kolo {

namespace {

constexpr const char* kSupportedDtypes =
    "uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64";

std::string shape_text(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < sizes.size(); ++i) out << (i ? ", " : "") << sizes[i];
  out << "]";
  return out.str();
}

std::string described(const std::string& what) { return "tensor '" + what + "'"; }

// The stream this thread queues work of `device` on now (PyTorch's current
// stream: the producer of a tensor the caller just computed).
void* current_cuda_stream(const c10::Device& device, const std::string& op,
                          const std::string& what) {
#if KOLO_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  throw ContractError(op + ": " + described(what) + " is on " + device.str() +
                      ", but kolo's torch frontend was built against a libtorch without CUDA; "
                      "build kolo against a CUDA build of torch (pip's default)");
#endif
}

// Checks what every view needs except the dtype.
void check_layout(const torch::Tensor& tensor, const std::string& op, const std::string& what) {
  if (!tensor.defined()) {
    throw ContractError(op + ": " + described(what) +
                        " is undefined; pass a tensor created with torch::empty/zeros/...");
  }
  if (!tensor.device().is_cpu() && !tensor.device().is_cuda()) {
    throw ContractError(op + ": " + described(what) + " is on device " + tensor.device().str() +
                        "; kolo collectives take CPU and CUDA tensors: move it with .cpu() or "
                        ".cuda() first");
  }
  if (tensor.layout() != torch::kStrided) {
    throw ContractError(op + ": " + described(what) +
                        " is not a dense strided tensor (sparse or other layout); call "
                        ".to_dense() first");
  }
  if (!tensor.is_contiguous()) {
    throw ContractError(op + ": " + described(what) + " is not contiguous (sizes " +
                        shape_text(tensor.sizes()) + ", strides " + shape_text(tensor.strides()) +
                        "); call .contiguous() first");
  }
}

std::vector<int64_t> shape_of(const torch::Tensor& tensor) {
  return std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end());
}

// A view of any contiguous CPU tensor for a bitwise copy: the engine's dtype
// when it has one, otherwise bytes (the last dimension widened by the element
// size) so that bool, int16 and complex tensors can be broadcast too.
TensorView byte_compatible_view(const torch::Tensor& tensor, const std::string& op,
                                const std::string& what) {
  check_layout(tensor, op, what);
  switch (tensor.scalar_type()) {
    case torch::kByte:
    case torch::kChar:
    case torch::kInt:
    case torch::kLong:
    case torch::kHalf:
    case torch::kBFloat16:
    case torch::kFloat:
    case torch::kDouble:
      return tensor_view(tensor, op, what);
    default:
      break;
  }
  TensorView view;
  view.data = tensor.data_ptr();
  view.dtype = DType::kU8;
  view.shape = shape_of(tensor);
  const auto item = static_cast<int64_t>(tensor.element_size());
  if (view.shape.empty()) {
    view.shape.push_back(item);
  } else {
    view.shape.back() *= item;
  }
  return view;
}

RequestOptions request_options(const TensorOpOptions& options) {
  RequestOptions r;
  r.op = options.op;
  r.prescale = options.prescale;
  r.postscale = options.postscale;
  r.root = options.root;
  r.process_set = options.process_set;
  return r;
}

void check_name(const std::string& name, const std::string& op) {
  if (name.empty()) {
    throw ContractError(op +
                        ": the name is empty; every collective needs a name that is the same on "
                        "every rank (e.g. \"grad/fc1.weight\")");
  }
}

// The storages of tensors that requests in flight read or write. The engine
// holds raw pointers into them until the request completes, so while one is
// pinned its memory must stay where it is: a pinned storage is made
// non-resizable (a resize_ that would grow it, reallocating, raises torch's
// "Trying to resize storage that is not resizable" instead of freeing memory
// the engine is about to use), and the request holds a reference to it (a
// set_ that gives the tensor another storage leaves this one alive). Counted
// per storage, so that overlapping requests on views of one buffer restore
// the flag only when the last of them completes. Process-wide, as storages
// are.
class StoragePins {
 public:
  static StoragePins& instance() {
    static StoragePins pins;
    return pins;
  }
  void pin(const c10::Storage& storage) {
    std::lock_guard<std::mutex> lock(mutex_);
    Pin& p = pins_[storage.unsafeGetStorageImpl()];
    if (p.count++ == 0) {
      p.was_resizable = storage.resizable();
      storage.unsafeGetStorageImpl()->set_resizable(false);
    }
  }
  void unpin(const c10::Storage& storage) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pins_.find(storage.unsafeGetStorageImpl());
    if (it == pins_.end() || --it->second.count > 0) return;
    storage.unsafeGetStorageImpl()->set_resizable(it->second.was_resizable);
    pins_.erase(it);
  }

 private:
  struct Pin {
    int count = 0;
    bool was_resizable = true;
  };
  std::mutex mutex_;
  std::map<const c10::StorageImpl*, Pin> pins_;
};

// Keeps `tensors` and their storages alive and pinned (StoragePins) until
// `handle` completes (the callback and what it captured are released by the
// engine right after running it). An in-place request hands its tensor in
// twice (input and output): each storage is pinned once per request.
void keep_alive(const Handle& handle, std::vector<torch::Tensor> tensors) {
  std::vector<c10::Storage> storages;
  for (const torch::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    const bool seen = std::any_of(storages.begin(), storages.end(), [&](const c10::Storage& s) {
      return s.unsafeGetStorageImpl() == impl;
    });
    if (seen) continue;
    storages.push_back(t.storage());
    StoragePins::instance().pin(storages.back());
  }
  handle.on_complete(
      [tensors = std::move(tensors), storages = std::move(storages)](std::exception_ptr) {
        for (const c10::Storage& storage : storages) StoragePins::instance().unpin(storage);
      });
}

// An AllocateOutput that creates a torch tensor of the input's dtype and
// device in `slot`.
AllocateOutput allocate_like(std::shared_ptr<torch::Tensor> slot, const torch::Tensor& input,
                             std::string op, std::string what) {
  return [slot = std::move(slot), options = input.options(), op = std::move(op),
          what = std::move(what)](const std::vector<int64_t>& shape) {
    *slot = torch::empty(shape, options);
    return tensor_view(*slot, op, what);
  };
}

// Allgather input: a 0-dim tensor is one row.
TensorView row_view(const torch::Tensor& tensor, const std::string& op, const std::string& what) {
  TensorView view = tensor_view(tensor, op, what);
  if (view.shape.empty()) view.shape.push_back(1);
  return view;
}

}  // namespace

Engine& engine_of(const CallOptions& options, const std::string& operation) {
  if (options.engine) return *options.engine;
  return runtime_for(operation).engine();
}

DType to_kolo_dtype(c10::ScalarType type, const std::string& op, const std::string& what) {
  switch (type) {
    case torch::kByte:
      return DType::kU8;
    case torch::kChar:
      return DType::kI8;
    case torch::kShort:
      return DType::kI16;
    case torch::kInt:
      return DType::kI32;
    case torch::kLong:
      return DType::kI64;
    case torch::kHalf:
      return DType::kF16;
    case torch::kBFloat16:
      return DType::kBF16;
    case torch::kFloat:
      return DType::kF32;
    case torch::kDouble:
      return DType::kF64;
    default:
      break;
  }
  throw ContractError(op + ": " + described(what) + " has dtype " + c10::toString(type) +
                      ", which kolo collectives do not support; supported: " + kSupportedDtypes +
                      " (convert with .to(torch::kFloat32) or similar)");
}

c10::ScalarType to_torch_dtype(DType dtype) {
  switch (dtype) {
    case DType::kU8:
      return torch::kByte;
    case DType::kI8:
      return torch::kChar;
    case DType::kI16:
      return torch::kShort;
    case DType::kI32:
      return torch::kInt;
    case DType::kI64:
      return torch::kLong;
    case DType::kF16:
      return torch::kHalf;
    case DType::kBF16:
      return torch::kBFloat16;
    case DType::kF32:
      return torch::kFloat;
    case DType::kF64:
      return torch::kDouble;
  }
  throw ContractError("kolo::to_torch_dtype: unknown dtype " +
                      std::to_string(static_cast<int>(dtype)));
}

TensorView tensor_view(const torch::Tensor& tensor, const std::string& op,
                       const std::string& what) {
  check_layout(tensor, op, what);
  TensorView view;
  view.dtype = to_kolo_dtype(tensor.scalar_type(), op, what);
  view.data = tensor.data_ptr();
  view.shape = shape_of(tensor);
  if (tensor.device().is_cuda()) {
    view.device.type = DeviceType::kCUDA;
    view.device.index = tensor.device().index();
    view.stream = current_cuda_stream(tensor.device(), op, what);
  }
  return view;
}

// --- TensorHandle -----------------------------------------------------------

TensorHandle::TensorHandle(Handle handle, std::shared_ptr<torch::Tensor> result)
    : handle_(std::move(handle)), result_(std::move(result)) {
  if (result_ && result_->defined() && result_->has_storage()) {
    result_storage_ = result_->storage().unsafeGetStorageImpl();
  }
}

bool TensorHandle::poll() const { return handle_.poll(); }

torch::Tensor TensorHandle::wait(std::chrono::milliseconds timeout) const {
  handle_.wait(timeout);
  if (result_storage_ != nullptr &&
      (!result_->has_storage() || result_->storage().unsafeGetStorageImpl() != result_storage_)) {
    throw ContractError(
        "kolo: the tensor of an in-place request was given another storage (set_) while the "
        "request ran; the result went to the storage it had when it was submitted. Leave a "
        "tensor alone until its request is waited for");
  }
  return result_ ? *result_ : torch::Tensor();
}

std::vector<int64_t> TensorHandle::received_splits() const { return handle_.received_splits(); }

// --- Allreduce --------------------------------------------------------------

namespace {

TensorHandle submit_allreduce(const torch::Tensor& in, const torch::Tensor& out,
                              const std::string& name, const TensorOpOptions& options,
                              const std::string& op) {
  check_name(name, op);
  TensorView in_view = tensor_view(in, op, name);
  TensorView out_view = in.is_same(out) ? in_view : tensor_view(out, op, name + " (output)");
  Engine& engine = engine_of(options, op);
  Handle handle = engine.allreduce_async(name, in_view, out_view, request_options(options));
  keep_alive(handle, {in, out});
  return TensorHandle(handle, std::make_shared<torch::Tensor>(out));
}

}  // namespace

TensorHandle allreduce_async(const torch::Tensor& tensor, const std::string& name,
                             const TensorOpOptions& options) {
  const std::string op = "kolo::allreduce_async";
  check_layout(tensor, op, name);
  return submit_allreduce(tensor, torch::empty_like(tensor, at::MemoryFormat::Contiguous), name,
                          options, op);
}

TensorHandle allreduce_async_(const torch::Tensor& tensor, const std::string& name,
                              const TensorOpOptions& options) {
  return submit_allreduce(tensor, tensor, name, options, "kolo::allreduce_async_");
}

torch::Tensor allreduce(const torch::Tensor& tensor, const std::string& name,
                        const TensorOpOptions& options) {
  const std::string op = "kolo::allreduce";
  check_layout(tensor, op, name);
  return submit_allreduce(tensor, torch::empty_like(tensor, at::MemoryFormat::Contiguous), name,
                          options, op)
      .wait(options.timeout);
}

torch::Tensor allreduce_(const torch::Tensor& tensor, const std::string& name,
                         const TensorOpOptions& options) {
  return submit_allreduce(tensor, tensor, name, options, "kolo::allreduce_").wait(options.timeout);
}

// --- Allgather --------------------------------------------------------------

namespace {

TensorHandle submit_allgather(const torch::Tensor& tensor, const std::string& name,
                              const TensorOpOptions& options, const std::string& op) {
  check_name(name, op);
  TensorView view = row_view(tensor, op, name);
  auto result = std::make_shared<torch::Tensor>();
  Engine& engine = engine_of(options, op);
  Handle handle = engine.allgather_async(
      name, view, allocate_like(result, tensor, op, name + " (output)"), request_options(options));
  keep_alive(handle, {tensor});
  return TensorHandle(handle, result);
}

}  // namespace

TensorHandle allgather_async(const torch::Tensor& tensor, const std::string& name,
                             const TensorOpOptions& options) {
  return submit_allgather(tensor, name, options, "kolo::allgather_async");
}

torch::Tensor allgather(const torch::Tensor& tensor, const std::string& name,
                        const TensorOpOptions& options) {
  return submit_allgather(tensor, name, options, "kolo::allgather").wait(options.timeout);
}

// --- Broadcast --------------------------------------------------------------

namespace {

TensorHandle submit_broadcast(const torch::Tensor& buffer, const std::string& name,
                              const TensorOpOptions& options, const std::string& op) {
  check_name(name, op);
  TensorView view = byte_compatible_view(buffer, op, name);
  Engine& engine = engine_of(options, op);
  Handle handle = engine.broadcast_async(name, view, request_options(options));
  keep_alive(handle, {buffer});
  return TensorHandle(handle, std::make_shared<torch::Tensor>(buffer));
}

}  // namespace

TensorHandle broadcast_async(const torch::Tensor& tensor, const std::string& name,
                             const TensorOpOptions& options) {
  const std::string op = "kolo::broadcast_async";
  check_layout(tensor, op, name);
  return submit_broadcast(tensor.clone(at::MemoryFormat::Contiguous), name, options, op);
}

TensorHandle broadcast_async_(const torch::Tensor& tensor, const std::string& name,
                              const TensorOpOptions& options) {
  return submit_broadcast(tensor, name, options, "kolo::broadcast_async_");
}

torch::Tensor broadcast(const torch::Tensor& tensor, const std::string& name,
                        const TensorOpOptions& options) {
  const std::string op = "kolo::broadcast";
  check_layout(tensor, op, name);
  return submit_broadcast(tensor.clone(at::MemoryFormat::Contiguous), name, options, op)
      .wait(options.timeout);
}

torch::Tensor broadcast_(const torch::Tensor& tensor, const std::string& name,
                         const TensorOpOptions& options) {
  return submit_broadcast(tensor, name, options, "kolo::broadcast_").wait(options.timeout);
}

// --- Reducescatter ----------------------------------------------------------

namespace {

TensorHandle submit_reducescatter(const torch::Tensor& tensor, const std::string& name,
                                  const TensorOpOptions& options, const std::string& op) {
  check_name(name, op);
  TensorView in_view = tensor_view(tensor, op, name);
  if (in_view.shape.empty()) {
    throw ContractError(op + ": " + described(name) +
                        " is 0-dimensional; reducescatter splits dim 0, so pass a tensor with "
                        "at least one dimension");
  }
  Engine& engine = engine_of(options, op);
  const detail::SetPosition position = detail::set_position(engine, options.process_set, name);
  const std::vector<int64_t> out_shape =
      Engine::reducescatter_shape(in_view.shape, position.size, position.rank);
  auto out = std::make_shared<torch::Tensor>(torch::empty(out_shape, tensor.options()));
  TensorView out_view = tensor_view(*out, op, name + " (output)");
  Handle handle = engine.reducescatter_async(name, in_view, out_view, request_options(options));
  keep_alive(handle, {tensor, *out});
  return TensorHandle(handle, out);
}

}  // namespace

TensorHandle reducescatter_async(const torch::Tensor& tensor, const std::string& name,
                                 const TensorOpOptions& options) {
  return submit_reducescatter(tensor, name, options, "kolo::reducescatter_async");
}

torch::Tensor reducescatter(const torch::Tensor& tensor, const std::string& name,
                            const TensorOpOptions& options) {
  return submit_reducescatter(tensor, name, options, "kolo::reducescatter").wait(options.timeout);
}

// --- Alltoall ---------------------------------------------------------------

namespace {

TensorHandle submit_alltoall(const torch::Tensor& tensor, const std::vector<int64_t>& splits,
                             const std::string& name, const TensorOpOptions& options,
                             const std::string& op) {
  check_name(name, op);
  TensorView view = tensor_view(tensor, op, name);
  if (view.shape.empty()) {
    throw ContractError(op + ": " + described(name) +
                        " is 0-dimensional; alltoall sends rows of dim 0, so pass a tensor "
                        "with at least one dimension");
  }
  auto result = std::make_shared<torch::Tensor>();
  Engine& engine = engine_of(options, op);
  Handle handle = engine.alltoall_async(name, view, splits,
                                        allocate_like(result, tensor, op, name + " (output)"),
                                        request_options(options));
  keep_alive(handle, {tensor});
  return TensorHandle(handle, result);
}

}  // namespace

TensorHandle alltoall_async(const torch::Tensor& tensor, const std::vector<int64_t>& splits,
                            const std::string& name, const TensorOpOptions& options) {
  return submit_alltoall(tensor, splits, name, options, "kolo::alltoall_async");
}

AlltoallResult alltoall(const torch::Tensor& tensor, const std::vector<int64_t>& splits,
                        const std::string& name, const TensorOpOptions& options) {
  TensorHandle handle = submit_alltoall(tensor, splits, name, options, "kolo::alltoall");
  AlltoallResult result;
  result.output = handle.wait(options.timeout);
  result.received_splits = handle.received_splits();
  return result;
}

// --- Broadcast of objects ---------------------------------------------------

std::string broadcast_bytes(const std::string& bytes, const std::string& name,
                            const TensorOpOptions& options) {
  check_name(name, "kolo::broadcast_bytes");
  torch::Tensor size = torch::tensor(static_cast<int64_t>(bytes.size()), torch::kLong);
  broadcast_(size, name + ".size", options);
  const int64_t n = size.item<int64_t>();
  if (n == 0) return std::string();
  torch::Tensor data = torch::empty({n}, torch::kByte);
  if (static_cast<int64_t>(bytes.size()) == n) std::memcpy(data.data_ptr(), bytes.data(), n);
  broadcast_(data, name + ".data", options);
  return std::string(static_cast<const char*>(data.data_ptr()), static_cast<size_t>(n));
}

c10::IValue broadcast_object(const c10::IValue& value, const std::string& name,
                             const TensorOpOptions& options) {
  const std::string op = "kolo::broadcast_object";
  check_name(name, op);
  Engine& engine = engine_of(options, "kolo::broadcast_object");
  const detail::SetPosition position = detail::set_position(engine, options.process_set, name);
  const std::string bytes = detail::broadcast_from_root(
      [&] {
        torch::serialize::OutputArchive archive;
        archive.write("value", value);
        return detail::archive_to_bytes(archive);
      },
      options.root, position, name, options);
  torch::serialize::InputArchive archive;
  detail::archive_from_bytes(bytes, archive);
  c10::IValue result;
  archive.read("value", result);
  return result;
}

std::string broadcast_from_root(const std::function<std::string()>& produce,
                                const std::string& name, const TensorOpOptions& options) {
  check_name(name, "kolo::broadcast_from_root");
  Engine& engine = engine_of(options, "kolo::broadcast_from_root");
  const detail::SetPosition position =
      detail::set_position(engine, options.process_set, "kolo::broadcast_from_root");
  return detail::broadcast_from_root(produce, options.root, position, name, options);
}

std::vector<std::string> allgather_bytes(const std::string& bytes, const std::string& name,
                                         const CallOptions& options) {
  TensorOpOptions o;
  static_cast<CallOptions&>(o) = options;
  TensorHandle handle = allgather_async(detail::bytes_tensor(bytes), name, o);
  const torch::Tensor all = handle.wait(options.timeout);
  const char* data = static_cast<const char*>(all.data_ptr());
  std::vector<std::string> out;
  int64_t offset = 0;
  for (int64_t rows : handle.received_splits()) {
    out.emplace_back(data + offset, static_cast<size_t>(rows));
    offset += rows;
  }
  return out;
}

// --- Synchronisation and process sets -----------------------------------------

void barrier(const CallOptions& options) {
  TensorOpOptions o;
  static_cast<CallOptions&>(o) = options;
  o.engine = &engine_of(options, "kolo::barrier");
  o.op = ReduceOp::kSum;
  allreduce_(torch::zeros({1}, torch::kInt), "kolo.barrier", o);
}

int join(const CallOptions& options) {
  return engine_of(options, "kolo::join").join(options.process_set);
}

ProcessSet add_process_set(const std::vector<int>& ranks, const CallOptions& options) {
  return engine_of(options, "kolo::add_process_set").add_process_set(ranks);
}

void remove_process_set(const ProcessSet& set, const CallOptions& options) {
  engine_of(options, "kolo::remove_process_set").remove_process_set(set.id());
}

// --- Internal helpers -------------------------------------------------------

namespace detail {

SetPosition set_position(Engine& engine, int process_set, const std::string& op) {
  if (process_set == 0) return SetPosition{engine.rank(), engine.size()};
  const ProcessSet set = engine.process_set(process_set);
  if (!set.included()) {
    std::string ranks;
    for (int r : set.ranks()) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    throw ContractError("kolo: " + op + ": rank " + std::to_string(engine.rank()) +
                        " is not a member of process set " + std::to_string(process_set) +
                        " (world ranks " + ranks + "); only its members may call it");
  }
  return SetPosition{set.rank(), set.size()};
}

torch::Tensor bytes_tensor(const std::string& bytes) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kByte);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

std::string tensor_bytes(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.nbytes()));
}

std::string what_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

std::string archive_to_bytes(torch::serialize::OutputArchive& archive) {
  std::string bytes;
  archive.save_to([&bytes](const void* data, size_t size) -> size_t {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  return bytes;
}

void archive_from_bytes(const std::string& bytes, torch::serialize::InputArchive& archive) {
  archive.load_from(bytes.data(), bytes.size());
}

std::string broadcast_from_root(const std::function<std::string()>& produce, int root,
                                const SetPosition& position, const std::string& name,
                                const CallOptions& options) {
  Engine& engine = engine_of(options, "kolo: " + name);
  TensorOpOptions o;
  static_cast<CallOptions&>(o) = options;
  o.engine = &engine;
  o.root = root;
  if (root < 0 || root >= position.size) {
    throw ContractError("kolo: " + name + ": root " + std::to_string(root) +
                        " is not a rank of the process set (size " + std::to_string(position.size) +
                        ")");
  }
  // Root's message: a kind byte ('+' success, 'C' ContractError, 'R'
  // RuntimeFault, 'E' any other error), then the payload or the error text.
  std::string message;
  std::exception_ptr root_error;
  if (position.rank == root) {
    try {
      message = "+" + produce();
    } catch (const ContractError& e) {
      root_error = std::current_exception();
      message = std::string("C") + e.what();
    } catch (const RuntimeFault& e) {
      root_error = std::current_exception();
      message = std::string("R") + e.what();
    } catch (const std::exception& e) {
      root_error = std::current_exception();
      message = std::string("E") + what_of(e);
    }
  }
  std::string received = broadcast_bytes(message, name, o);
  if (root_error) std::rethrow_exception(root_error);
  if (received.empty()) {
    throw RuntimeFault("kolo: " + name + ": received an empty message from root rank " +
                       std::to_string(root));
  }
  const char kind = received[0];
  received.erase(0, 1);
  if (kind == '+') return received;
  const std::string text = received + " (reported by root rank " + std::to_string(root) + ")";
  if (kind == 'R') throw RuntimeFault(text);
  throw ContractError(text);
}

}  // namespace detail

void agree_on_outcome(const std::string& local_error, const std::string& op,
                      const std::string& name, const CallOptions& options) {
  // Each rank contributes a status byte and its error text.
  CallOptions o = options;
  o.engine = &engine_of(options, op);
  const std::vector<std::string> outcomes =
      allgather_bytes((local_error.empty() ? "+" : "-") + local_error, name + ".status", o);
  // Ranks that failed with the same message are named together.
  std::vector<std::pair<std::string, std::vector<size_t>>> failures;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (outcomes[r].empty() || outcomes[r][0] != '-') continue;
    std::string message = outcomes[r].substr(1);
    auto same = std::find_if(failures.begin(), failures.end(),
                             [&](const auto& f) { return f.first == message; });
    if (same == failures.end()) {
      failures.push_back({std::move(message), {r}});
    } else {
      same->second.push_back(r);
    }
  }
  if (failures.empty()) return;
  std::string text = op + " failed";
  for (const auto& [message, ranks] : failures) {
    text += ranks.size() == 1 ? " on rank " : " on ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
    text += ": " + message + (failures.size() > 1 ? ";" : "");
  }
  throw ContractError(text);
}

}  // namespace kolo

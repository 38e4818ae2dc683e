// Collectives on torch::Tensor through the engine (kolo/core/engine.h).
//
// Tensors handed to kolo must be CPU, strided and contiguous, of a dtype the
// engine knows (uint8, int8, int16, int32, int64, float16, bfloat16, float32,
// float64); anything else is a ContractError naming the operation and the
// tensor. Every call is named: a request runs once every rank of the process
// set has submitted the same name, and names may be reused once the previous
// request of that name has finished (steady-state training reuses them every
// step).
//
// Every call that talks to other ranks takes its engine from
// CallOptions::engine; nullptr means kolo::runtime().engine() (call
// kolo::init() first). Tests running ranks as threads pass their own.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/dtype.h"
#include "kolo/core/engine.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

// CallOptions (kolo/core/engine.h): engine, process_set, timeout (0 = no
// limit of the call's own), the base of every options struct below.

// Options of the tensor collectives. op, prescale and postscale apply to
// allreduce and reducescatter; root (a rank of the process set) to broadcast.
struct TensorOpOptions : CallOptions {
  ReduceOp op = ReduceOp::kAverage;
  double prescale = 1.0;   // applied to each rank's input before reducing
  double postscale = 1.0;  // applied to the reduced result
  int root = 0;
};

// The engine selected by `options` (options.engine or the default runtime's).
// `operation` (e.g. "kolo::allreduce") names the call in the ContractError
// when options.engine is null and kolo::init() has not run.
Engine& engine_of(const CallOptions& options, const std::string& operation);

// --- Tensor adapter ---------------------------------------------------------

// torch dtype -> kolo dtype; ContractError listing the supported dtypes,
// naming `op` and `what` (the tensor) in the message.
DType to_kolo_dtype(c10::ScalarType type, const std::string& op, const std::string& what);
c10::ScalarType to_torch_dtype(DType dtype);

// A view of a defined, CPU, strided, contiguous tensor of a supported dtype
// (ContractError otherwise, saying to call .contiguous() / .cpu()). The view
// aliases the tensor's memory: keep the tensor alive while the view is used.
// A 0-dim tensor gives an empty shape (one element).
TensorView tensor_view(const torch::Tensor& tensor, const std::string& op, const std::string& what);

// --- Asynchronous results ---------------------------------------------------

// The caller's side of an asynchronous tensor collective. It keeps the input
// and output tensors alive until the request finished, even if the handle is
// dropped earlier; do not modify them before then. Copyable; copies share the
// request.
class TensorHandle {
 public:
  TensorHandle() = default;
  TensorHandle(Handle handle, std::shared_ptr<torch::Tensor> result);

  bool valid() const { return handle_.valid(); }
  // True once the request finished (successfully or not). Never blocks.
  bool poll() const;
  // Blocks until finished (TimeoutError after `timeout`, 0 = no limit of its
  // own; the request keeps going), rethrows the request's error, returns the
  // result tensor (for the in-place forms, the tensor that was handed in).
  torch::Tensor wait(std::chrono::milliseconds timeout = std::chrono::milliseconds{0}) const;
  // Rows contributed by each rank (allgather) or received from each rank
  // (alltoall); valid after success.
  std::vector<int64_t> received_splits() const;
  const Handle& handle() const { return handle_; }

 private:
  Handle handle_;
  std::shared_ptr<torch::Tensor> result_;
  // The storage the result tensor had at submission (in-place forms): wait()
  // refuses a result whose tensor was given another one meanwhile.
  const void* result_storage_ = nullptr;
};

// --- Allreduce --------------------------------------------------------------

// Reduces `tensor` across the ranks into a new tensor (the input is unchanged).
torch::Tensor allreduce(const torch::Tensor& tensor, const std::string& name,
                        const TensorOpOptions& options = {});
// In place: `tensor` holds the result afterwards. Returns `tensor`.
torch::Tensor allreduce_(const torch::Tensor& tensor, const std::string& name,
                         const TensorOpOptions& options = {});
TensorHandle allreduce_async(const torch::Tensor& tensor, const std::string& name,
                             const TensorOpOptions& options = {});
TensorHandle allreduce_async_(const torch::Tensor& tensor, const std::string& name,
                              const TensorOpOptions& options = {});

// --- Allgather --------------------------------------------------------------

// Concatenates every rank's tensor along dim 0, in rank order. The first
// dimension may differ per rank; the others and the dtype must agree. A 0-dim
// tensor counts as one row.
torch::Tensor allgather(const torch::Tensor& tensor, const std::string& name,
                        const TensorOpOptions& options = {});
TensorHandle allgather_async(const torch::Tensor& tensor, const std::string& name,
                             const TensorOpOptions& options = {});

// --- Broadcast --------------------------------------------------------------

// Returns a copy of root's tensor on every rank (the input is unchanged).
// Shapes and dtypes must agree across ranks. Broadcast is a bitwise copy, so
// besides the engine's dtypes it also accepts bool, int16 and complex tensors
// (sent as bytes).
torch::Tensor broadcast(const torch::Tensor& tensor, const std::string& name,
                        const TensorOpOptions& options = {});
// In place: every rank's `tensor` becomes root's. Returns `tensor`.
torch::Tensor broadcast_(const torch::Tensor& tensor, const std::string& name,
                         const TensorOpOptions& options = {});
TensorHandle broadcast_async(const torch::Tensor& tensor, const std::string& name,
                             const TensorOpOptions& options = {});
TensorHandle broadcast_async_(const torch::Tensor& tensor, const std::string& name,
                              const TensorOpOptions& options = {});

// --- Reducescatter ----------------------------------------------------------

// Reduces `tensor` across the ranks and returns this rank's rows of the result:
// dim 0 is split as evenly as possible, the first `rows % n` ranks get one
// more row (Engine::reducescatter_shape). On a process set other than 0 this
// costs one extra small allgather to learn the set's membership.
torch::Tensor reducescatter(const torch::Tensor& tensor, const std::string& name,
                            const TensorOpOptions& options = {});
TensorHandle reducescatter_async(const torch::Tensor& tensor, const std::string& name,
                                 const TensorOpOptions& options = {});

// --- Alltoall ---------------------------------------------------------------

struct AlltoallResult {
  torch::Tensor output;                  // rows received, in source-rank order
  std::vector<int64_t> received_splits;  // rows received from each rank
};

// splits[k] rows of `tensor` (taken in order along dim 0) go to rank k of the
// set; empty splits = equal split (dim 0 must divide by the set size).
AlltoallResult alltoall(const torch::Tensor& tensor, const std::vector<int64_t>& splits,
                        const std::string& name, const TensorOpOptions& options = {});
TensorHandle alltoall_async(const torch::Tensor& tensor, const std::vector<int64_t>& splits,
                            const std::string& name, const TensorOpOptions& options = {});

// --- Broadcast of objects ---------------------------------------------------

// Returns root's `bytes` on every rank (the other ranks' argument is ignored):
// the size is broadcast first, then the data. Two requests, named
// "<name>.size" and "<name>.data".
std::string broadcast_bytes(const std::string& bytes, const std::string& name,
                            const TensorOpOptions& options = {});

// Returns root's value on every rank. Any value torch can serialise: tensors,
// numbers, strings, lists, dicts, tuples of those (through
// torch::serialize::OutputArchive).
c10::IValue broadcast_object(const c10::IValue& value, const std::string& name,
                             const TensorOpOptions& options = {});

// Root (options.root, a rank of the set) runs `produce`; its bytes reach
// every rank of the set, which do not call `produce`. If `produce` throws
// on root, the error reaches every rank instead: root rethrows its own
// exception, the others throw the same kind (ContractError or RuntimeFault)
// with root's message. One request named "<name>" (see broadcast_bytes).
std::string broadcast_from_root(const std::function<std::string()>& produce,
                                const std::string& name, const TensorOpOptions& options = {});

// Every rank's `bytes`, in rank order of the process set (one allgather
// named "<name>"; the sizes may differ per rank).
std::vector<std::string> allgather_bytes(const std::string& bytes, const std::string& name,
                                         const CallOptions& options = {});

// --- Agreement --------------------------------------------------------------

// Every rank reports the outcome of a local step ("" = success). If any rank
// failed, every rank throws ContractError naming the failed ranks and their
// messages ("<op> failed on rank 1: ..."), so that no rank carries on alone.
// One allgather, "<name>.status".
void agree_on_outcome(const std::string& local_error, const std::string& op,
                      const std::string& name, const CallOptions& options = {});

// --- Synchronisation and process sets ---------------------------------------

// Returns once every rank of options.process_set called it (Horovod's
// hvd.barrier()): one allreduce named "kolo.barrier".
void barrier(const CallOptions& options = {});
// Engine::join on options.process_set (Horovod's hvd.join()): this rank has
// no more work; until every rank joined, it contributes zeros to the others'
// allreduces. Returns the last rank to join.
int join(const CallOptions& options = {});
// Engine::add_process_set on options.engine: collective over every world
// rank, each passing the same world ranks. The set's id goes into
// CallOptions::process_set.
ProcessSet add_process_set(const std::vector<int>& ranks, const CallOptions& options = {});
void remove_process_set(const ProcessSet& set, const CallOptions& options = {});

}  // namespace kolo
#pragma GCC visibility pop

// Submitted requests on their way from the caller's thread to the engine
// thread (internal).
//
// push() runs on any thread; drain() on the engine thread. The queue also
// owns the set of names pending on this rank per process set, so a second
// request under a name still pending is refused at submit (the name would be
// ambiguous in the negotiation); release() frees a name once its request has
// finished, before its handle completes, so a completion callback may reuse it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/device_path.h"
#include "engine/handle.h"
#include "engine/message.h"
#include "engine/timeline.h"
#include "kolo/core/engine.h"

namespace kolo::detail {

// What this rank keeps per (process set, name) across steps: whether a
// request of the name is pending (under the queue's mutex), and where the
// controller last found the name in its response cache (engine thread only;
// a hint it checks before use).
struct NameState {
  bool pending = false;
  int cache_slot = -1;
};

// One request of this rank, with its buffers.
struct Request {
  RequestInfo info;
  int process_set = 0;
  TensorView in;            // allreduce, allgather, reducescatter, alltoall; broadcast: buffer
  TensorView out;           // allreduce, reducescatter
  AllocateOutput allocate;  // allgather, alltoall
  std::shared_ptr<HandleState> handle;
  // CUDA tensors: the event recorded on the producer's stream at submit
  // (the engine reads `in` once it has passed), and, while the request runs
  // through host staging, its device views (engine/device_path.h).
  DeviceRuntime::Event ready;
  std::unique_ptr<StagedRequest> staged;
  // Timeline phases begun and not yet ended, innermost last (engine thread).
  std::vector<TimelinePhase> open_phases;
  bool negotiated_once = false;  // has been through one negotiation round
  // The queue's state of this name (TensorQueue::pending_), set by push():
  // release_all() clears its flag without a name lookup, and the controller
  // keeps its cache-slot hint there. Entries of the map are stable until
  // erased, and an entry whose flag is set is never swept.
  NameState* name_state = nullptr;
  // The engine's PendingList of its set (engine thread).
  Request* pending_prev = nullptr;
  Request* pending_next = nullptr;
  bool in_pending = false;
};

// A request the engine has finished with (or failed), waiting for its
// handle to be completed; error = null on success.
struct Finished {
  std::unique_ptr<Request> request;
  std::exception_ptr error;
};

class TensorQueue {
 public:
  // Throws ContractError if `request`'s name is already pending in its set.
  // Returns false (and drops the request) once close() was called.
  bool push(std::unique_ptr<Request> request);
  // Refuses every later push(): the engine has stopped; it then drains what
  // was queued before, so no request is left behind uncompleted.
  void close();
  // Takes every queued request, in submission order.
  std::vector<std::unique_ptr<Request>> drain();
  // The request named `name` of `process_set` has finished.
  void release(int process_set, const std::string& name);
  // release() of every request in `finished`, under one lock.
  void release_all(const std::vector<Finished>& finished);
  // A Request to fill in: one recycled from an earlier step, or a new one.
  // Its `handle` is a fresh HandleState: the recycled request's own, reset,
  // when nobody else holds it any more (the caller dropped its Handle), else
  // a new one.
  std::unique_ptr<Request> take_request();
  // Keeps the requests of `finished` (whose handles are complete) for
  // take_request(), up to a bound, and clears `finished`. Reuse keeps their
  // name and shape buffers and, once the caller has let go of it, their
  // HandleState: steady-state training resubmits the same names every step.
  void recycle(std::vector<Finished>& finished);
  // Blocks until something is queued or `timeout` passes (idle engine).
  // Returns true if something is queued.
  bool wait_for_work(std::chrono::microseconds timeout);
  // Wakes wait_for_work (shutdown).
  void wake();

 private:
  void release_locked(int process_set, const std::string& name);  // mutex_ held
  void release_locked(Request& request);                          // mutex_ held

  std::mutex mutex_;
  std::condition_variable work_;
  bool woken_ = false;
  bool closed_ = false;
  std::vector<std::unique_ptr<Request>> queue_;
  // (set, name) -> pending on this rank. Released names stay in the map as
  // false: training resubmits the same names every step, so steady state
  // allocates nothing here. Swept when it holds many released names (a
  // program that makes up a new name per call).
  std::unordered_map<int, std::unordered_map<std::string, NameState>> pending_;
  size_t released_ = 0;  // entries that are false
  // pending_[0], looked up once (elements of an unordered_map stay put).
  std::unordered_map<std::string, NameState>* names0_ = &pending_[0];
  // Spare requests have their own lock: taking one does not contend with the
  // engine thread's drain() or release_all().
  std::mutex spare_mutex_;
  std::vector<std::unique_ptr<Request>> spare_;  // for take_request(), most recent last
};

}  // namespace kolo::detail

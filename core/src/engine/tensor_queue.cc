#include "engine/tensor_queue.h"

#include <iterator>

#include "kolo/core/errors.h"

namespace kolo::detail {

namespace {

// Released names kept before push() sweeps them out.
constexpr size_t kMaxReleasedNames = 8192;
// Finished Requests kept for reuse (a few hundred bytes each).
constexpr size_t kMaxSpareRequests = 4096;

}  // namespace

bool TensorQueue::push(std::unique_ptr<Request> request) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return false;
    // Set 0 (the world, every request in plain data parallelism) skips the
    // lookup of its map.
    auto& names = request->process_set == 0 ? *names0_ : pending_[request->process_set];
    auto [it, inserted] = names.try_emplace(request->info.name);
    if (inserted) {
      it->second.pending = true;
    } else {
      if (it->second.pending) {
        throw ContractError(
            std::string("kolo engine: ") + request_kind_name(request->info.kind) + " of tensor '" +
            request->info.name + "': a request with this name is still pending on this rank" +
            (request->process_set != 0 ? " in process set " + std::to_string(request->process_set)
                                       : std::string()) +
            "; wait for its handle before reusing the name, or use a unique name");
      }
      it->second.pending = true;
      --released_;
    }
    request->name_state = &it->second;
    if (released_ > kMaxReleasedNames) {
      for (auto& [set, set_names] : pending_) {
        for (auto n = set_names.begin(); n != set_names.end();)
          n = n->second.pending ? std::next(n) : set_names.erase(n);
      }
      released_ = 0;
    }
    queue_.push_back(std::move(request));
  }
  work_.notify_one();
  return true;
}

void TensorQueue::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
}

std::vector<std::unique_ptr<Request>> TensorQueue::drain() {
  std::vector<std::unique_ptr<Request>> taken;
  std::lock_guard<std::mutex> lock(mutex_);
  taken.swap(queue_);
  return taken;
}

void TensorQueue::release(int process_set, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  release_locked(process_set, name);
}

void TensorQueue::release_all(const std::vector<Finished>& finished) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Finished& f : finished) release_locked(*f.request);
}

void TensorQueue::release_locked(Request& request) {
  if (request.name_state == nullptr) {  // never pushed, or released by name
    release_locked(request.process_set, request.info.name);
    return;
  }
  if (request.name_state->pending) {
    request.name_state->pending = false;
    ++released_;
  }
  request.name_state = nullptr;
}

void TensorQueue::release_locked(int process_set, const std::string& name) {
  auto set = pending_.find(process_set);
  if (set == pending_.end()) return;
  auto it = set->second.find(name);
  if (it == set->second.end() || !it->second.pending) return;
  it->second.pending = false;
  ++released_;
}

std::unique_ptr<Request> TensorQueue::take_request() {
  std::unique_ptr<Request> request;
  {
    std::lock_guard<std::mutex> lock(spare_mutex_);
    if (!spare_.empty()) {
      request = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  if (!request) request = std::make_unique<Request>();
  // use_count() == 1: no Handle refers to the state any more and none can
  // appear (only a holder could copy it), so it is ours to reset. Its mutex
  // orders the reset after whatever the last holder did under it.
  if (request->handle && request->handle.use_count() == 1) {
    HandleState& h = *request->handle;
    std::lock_guard<std::mutex> lock(h.mutex);
    h.done = false;
    h.completing = false;
    h.error = nullptr;
    h.callbacks.clear();
    h.received_splits.clear();
    h.output = TensorView{};
    h.value = 0;
  } else {
    request->handle = std::make_shared<HandleState>();
  }
  return request;
}

void TensorQueue::recycle(std::vector<Finished>& finished) {
  // Reset outside the lock: callers' submissions need not wait for it.
  for (Finished& f : finished) {
    Request& r = *f.request;
    r.allocate = nullptr;
    r.name_state = nullptr;
    r.open_phases.clear();
    r.negotiated_once = false;
    r.out = TensorView{};
    r.in.device = Device{};
    r.in.stream = nullptr;
    r.ready.reset();
    r.staged.reset();
    r.info.splits.clear();
  }
  std::lock_guard<std::mutex> lock(spare_mutex_);
  for (Finished& f : finished) {
    if (spare_.size() >= kMaxSpareRequests) break;
    spare_.push_back(std::move(f.request));
  }
  finished.clear();
}

bool TensorQueue::wait_for_work(std::chrono::microseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  work_.wait_for(lock, timeout, [&] { return !queue_.empty() || woken_; });
  return !queue_.empty();
}

void TensorQueue::wake() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_ = true;
  }
  work_.notify_all();
}

}  // namespace kolo::detail

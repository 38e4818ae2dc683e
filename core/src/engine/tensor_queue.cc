#include "engine/tensor_queue.h"

#include "kolo/core/errors.h"

namespace kolo::detail {

void TensorQueue::push(std::unique_ptr<Request> request) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& names = pending_[request->process_set];
    if (names.count(request->info.name) != 0) {
      throw ContractError(
          std::string("kolo engine: ") + request_kind_name(request->info.kind) + " of tensor '" +
          request->info.name + "': a request with this name is still pending on this rank" +
          (request->process_set != 0 ? " in process set " + std::to_string(request->process_set)
                                     : std::string()) +
          "; wait for its handle before reusing the name, or use a unique name");
    }
    names.insert(request->info.name);
    queue_.push_back(std::move(request));
  }
  work_.notify_one();
}

std::vector<std::unique_ptr<Request>> TensorQueue::drain() {
  std::vector<std::unique_ptr<Request>> taken;
  std::lock_guard<std::mutex> lock(mutex_);
  taken.swap(queue_);
  return taken;
}

void TensorQueue::release(int process_set, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pending_.find(process_set);
  if (it != pending_.end()) it->second.erase(name);
}

void TensorQueue::wait_for_work(std::chrono::microseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  work_.wait_for(lock, timeout, [&] { return !queue_.empty() || woken_; });
}

void TensorQueue::wake() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    woken_ = true;
  }
  work_.notify_all();
}

}  // namespace kolo::detail

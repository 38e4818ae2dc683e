// This rank's requests of one process set that are in negotiation or
// execution (internal, engine thread only).
//
// An intrusive, owning list: the engine reaches a request through the pointer
// the controller hands back with its response (Controller::Outcome::owners),
// so the per-tensor hot path does no lookup by name. Lookup by name is linear
// and kept for the rare paths (join, process-set changes, shutdown).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "engine/tensor_queue.h"

namespace kolo::detail {

class PendingList {
 public:
  PendingList() = default;
  PendingList(const PendingList&) = delete;
  PendingList& operator=(const PendingList&) = delete;
  ~PendingList() {
    while (head_) take(head_);  // deleted with the unique_ptr
  }

  bool empty() const { return head_ == nullptr; }
  size_t size() const { return size_; }
  // Iteration: for (Request* r = first(); r; r = r->pending_next).
  Request* first() const { return head_; }

  // Appends `request` (it must not be in a list).
  void push(std::unique_ptr<Request> request) {
    Request* r = request.release();
    r->pending_prev = tail_;
    r->pending_next = nullptr;
    r->in_pending = true;
    if (tail_) {
      tail_->pending_next = r;
    } else {
      head_ = r;
    }
    tail_ = r;
    ++size_;
  }

  // Unlinks `request` and hands back its ownership; null if it is not in a
  // list (already finished).
  std::unique_ptr<Request> take(Request* request) {
    if (!request || !request->in_pending) return nullptr;
    if (request->pending_prev) {
      request->pending_prev->pending_next = request->pending_next;
    } else {
      head_ = request->pending_next;
    }
    if (request->pending_next) {
      request->pending_next->pending_prev = request->pending_prev;
    } else {
      tail_ = request->pending_prev;
    }
    request->pending_prev = request->pending_next = nullptr;
    request->in_pending = false;
    --size_;
    return std::unique_ptr<Request>(request);
  }

  // The request named `name`, or null. Linear.
  Request* find(const std::string& name) const {
    for (Request* r = head_; r; r = r->pending_next) {
      if (r->info.name == name) return r;
    }
    return nullptr;
  }

 private:
  Request* head_ = nullptr;
  Request* tail_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kolo::detail

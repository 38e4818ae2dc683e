// Stage 3 (kolo/torch/zero.h): ShardedUnit, and gathering / releasing a
// unit's parameters around its forward and backward.
//
// A unit's parameters are views of one flat buffer (ZeroBucket::full). To
// release them, the buffer's storage is given a 0-byte allocation; to gather,
// a fresh allocation of the full size is filled by an allgather of every
// rank's slice. Changing the storage (rather than the parameters' data)
// matters: autograd keeps views of the parameters (Linear saves weight.t()),
// and those must see the released and re-gathered memory too, or the saved
// views would keep every unit's parameters alive until backward.
#include <c10/core/CPUAllocator.h>
#include <torch/optim/optimizer.h>

#include "kolo/core/errors.h"
#include "zero_state.h"

namespace kolo {

namespace {
constexpr const char* kOp = "kolo::ShardedUnit";
}

void ShardedUnitImpl::adopt_children() {
  torch::nn::Module& inner = *inner_.ptr();
  for (const auto& item : inner.named_parameters(/*recurse=*/false)) {
    if (item.value().defined()) {
      register_parameter(item.key(), item.value(), item.value().requires_grad());
    }
  }
  for (const auto& item : inner.named_buffers(/*recurse=*/false)) {
    if (item.value().defined()) register_buffer(item.key(), item.value());
  }
  for (const auto& item : inner.named_children()) register_module(item.key(), item.value());
}

torch::Tensor ShardedUnitImpl::forward(const torch::Tensor& input) {
  if (auto state = state_.lock()) return state->unit_forward(unit_, state_, inner_, input);
  return inner_.forward(input);
}

void ShardedUnitImpl::train(bool on) {
  torch::nn::Module::train(on);
  inner_.ptr()->train(on);
}

void ShardedUnitImpl::attach(std::weak_ptr<detail::ZeroState> state, int unit) {
  state_ = std::move(state);
  unit_ = unit;
}

void ShardedUnitImpl::detach() {
  state_.reset();
  unit_ = -1;
}

namespace detail {

void ZeroState::start_gather(int b) {
  ZeroBucket& bucket = buckets[b];
  // Stages 1 and 2 (unit < 0) always hold `full`.
  if (bucket.unit < 0 || bucket.gathered || bucket.gathering) return;
  c10::StorageImpl* storage = bucket.full.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::GetCPUAllocator()->allocate(bucket.full_nbytes));
  storage->set_nbytes(bucket.full_nbytes);
  const std::string name = request_name("gather", bucket);
  torch::Tensor full = bucket.full;
  bucket.gather = engine->allgather_async(
      name, tensor_view(bucket.shard, kOp, name),
      [full, name](const std::vector<int64_t>&) { return tensor_view(full, kOp, name); }, request);
  bucket.gathering = true;
}

void ZeroState::finish_gather(int b) {
  ZeroBucket& bucket = buckets[b];
  if (!bucket.gathering) {
    if (!bucket.gathered) {
      start_gather(b);
    } else {
      return;
    }
  }
  bucket.gathering = false;
  Handle handle = std::move(bucket.gather);
  bucket.gather = Handle();
  handle.wait(options.timeout);
  bucket.gathered = true;
}

void ZeroState::release(int b) {
  ZeroBucket& bucket = buckets[b];
  if (bucket.unit < 0) return;  // stages 1 and 2 never release the parameters
  if (bucket.gathering) {
    // The engine may be writing into the buffer: wait before freeing it.
    try {
      finish_gather(b);
    } catch (...) {
    }
  }
  if (!bucket.gathered) return;
  c10::StorageImpl* storage = bucket.full.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::GetCPUAllocator()->allocate(0));
  storage->set_nbytes(0);
  bucket.gathered = false;
}

void ZeroState::release_all() {
  for (size_t b = 0; b < buckets.size(); ++b) release(static_cast<int>(b));
}

torch::Tensor ZeroState::unit_forward(int b, const std::weak_ptr<ZeroState>& self,
                                      torch::nn::AnyModule& inner, const torch::Tensor& x) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    finish_gather(b);
    order.push_back(b);
    // The unit that came next in the previous step's forward.
    const size_t position = order.size();
    if (options.prefetch && !pinned && position < last_order.size()) {
      const int next = last_order[position];
      if (next != b) start_gather(next);
    }
    sample();
  }
  torch::Tensor out = inner.forward(x);
  if (out.requires_grad()) {
    std::weak_ptr<ZeroState> weak = self;
    out.register_hook([weak, b](const torch::Tensor&) {
      if (auto state = weak.lock()) state->before_backward(b);
    });
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!pinned) release(b);
  }
  return out;
}

void ZeroState::before_backward(int b) {
  std::lock_guard<std::mutex> lock(mutex);
  finish_gather(b);
  // Backward runs the units in reverse: prefetch the one before this in
  // this step's forward order.
  if (options.prefetch && !pinned) {
    for (size_t i = order.size(); i-- > 1;) {
      if (order[i] == b) {
        if (order[i - 1] != b) start_gather(order[i - 1]);
        break;
      }
    }
  }
  sample();
}

}  // namespace detail
}  // namespace kolo

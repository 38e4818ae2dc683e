// ZeroOptimizer (kolo/torch/zero.h): construction and its cross-rank check,
// the gradient hooks that start each bucket's reduce-scatter inside backward
// (stages 2 and 3), and the step.
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include <deque>
#include <exception>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "kolo/core/errors.h"
#include "kolo/torch/layerwise.h"
#include "zero_state.h"

namespace kolo {

namespace {

constexpr const char* kOp = "kolo::ZeroOptimizer";

using detail::ZeroBucket;
using detail::ZeroParam;
using detail::ZeroState;

class AfterAccumulateHook : public torch::autograd::FunctionPostHook {
 public:
  AfterAccumulateHook(std::weak_ptr<ZeroState> state, size_t index)
      : state_(std::move(state)), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (auto state = state_.lock()) state->after_accumulate(index_);
    return outputs;
  }

 private:
  std::weak_ptr<ZeroState> state_;
  size_t index_;
};

bool supported_dtype(c10::ScalarType t) {
  return t == torch::kFloat || t == torch::kDouble || t == torch::kHalf || t == torch::kBFloat16;
}

}  // namespace

namespace detail {

void ZeroState::after_accumulate(size_t index) {
  torch::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(mutex);
  ZeroParam& p = params[index];
  ZeroBucket& bucket = buckets[p.bucket];
  if (bucket.submitted) {
    throw ContractError(std::string(kOp) + ": the gradient of '" + p.name +
                        "' was computed again after its bucket's reduce-scatter started (two "
                        "backward passes without step()); ZeroOptimizer does not accumulate "
                        "gradients locally: call step() after every backward pass");
  }
  if (p.ready) return;
  p.ready = true;
  if (++bucket.ready < static_cast<int>(bucket.params.size())) return;
  // Stage 3: the unit's backward is done (the last AccumulateGrad of its
  // parameters ran); its parameters go before its gradients are packed.
  if (bucket.unit >= 0 && !pinned) release(p.bucket);
  reap_reductions(&bucket);
  submit_reduce(bucket);
  sample();
}

// Caller holds the mutex. Starts the reduce-scatter of the bucket's
// gradients (zeros where a parameter has none) into this rank's slice.
// Stage 1: in place on flat_grad, after moving back into it any gradient
// that is not a view of it (Module::zero_grad(true) and a create_graph
// backward make new ones). Stages 2 and 3: packed into full_grad (or, for a
// bucket of one parameter, from its gradient as it is), the parameters'
// .grad() released.
void ZeroState::submit_reduce(ZeroBucket& bucket) {
  torch::NoGradGuard no_grad;
  const std::string name = request_name("reduce", bucket);
  if (bucket.flat_grad.defined()) {
    for (int index : bucket.params) {
      ZeroParam& p = params[index];
      torch::Tensor slot = slot_of(bucket.flat_grad, p);
      const torch::Tensor& grad = p.param.grad();
      if (occupies(grad, slot)) continue;
      if (grad.defined()) {
        slot.copy_(grad);
      } else {
        slot.zero_();
      }
      p.param.mutable_grad() = slot;
    }
    bucket.submitted = true;
    bucket.submitted_seq = ++submissions;
    // Communicator contract: out == in is the in-place reduce-scatter, the
    // result written over the first shard_numel elements.
    bucket.reduce = engine->reducescatter_async(name, tensor_view(bucket.flat_grad, kOp, name),
                                                tensor_view(bucket.grad_shard, kOp, name), request);
    return;
  }
  if (bucket.params.size() == 1) {
    // One parameter (a large one has a bucket of its own): reduce-scatter
    // its gradient where it lies rather than from a packed copy.
    ZeroParam& p = params[bucket.params[0]];
    const torch::Tensor& grad = p.param.grad();
    if (grad.defined() && grad.is_contiguous()) {
      bucket.full_grad = grad.view({-1});
      p.param.mutable_grad() = torch::Tensor();
      bucket.submitted = true;
      bucket.submitted_seq = ++submissions;
      bucket.reduce =
          engine->reducescatter_async(name, tensor_view(bucket.full_grad, kOp, name),
                                      tensor_view(bucket.grad_shard, kOp, name), request);
      return;
    }
  }
  bucket.full_grad = torch::empty({bucket.numel}, torch::TensorOptions().dtype(bucket.dtype));
  for (int index : bucket.params) {
    ZeroParam& p = params[index];
    torch::Tensor target = bucket.full_grad.narrow(0, p.offset, p.numel);
    const torch::Tensor& grad = p.param.grad();
    if (grad.defined()) {
      target.copy_(grad.reshape({-1}));
    } else {
      target.zero_();
    }
    p.param.mutable_grad() = torch::Tensor();
  }
  bucket.submitted = true;
  bucket.submitted_seq = ++submissions;
  bucket.reduce = engine->reducescatter_async(name, tensor_view(bucket.full_grad, kOp, name),
                                              tensor_view(bucket.grad_shard, kOp, name), request);
}

// Caller holds the mutex. A bucket's full gradient (its packed copy, or the
// .grad() of a one-parameter bucket) is needed only until its reduce-scatter
// finished. Without freeing it then, backward would hold every bucket's full
// gradient until step(). Inside backward (`keep` = the bucket about to be
// handed to the engine) it also waits for the others: a bucket is packed
// with no other in flight, and while autograd computes the next gradient
// only that bucket is, so stages 2 and 3 peak at 4/N + two buckets of
// gradients, not a full gradient. Waiting in
// the hook is safe because every rank hands the buckets over in the same
// order (its backward runs the same graph; stage 3 relies on it for its
// gathers too). The handle stays, for step() to collect an error.
void ZeroState::reap_reductions(const ZeroBucket* keep) {
  for (;;) {
    ZeroBucket* oldest = nullptr;
    for (ZeroBucket& bucket : buckets) {
      if (!bucket.full_grad.defined() || !bucket.reduce.valid()) continue;
      if (bucket.reduce.poll()) {
        bucket.full_grad = torch::Tensor();
      } else if (&bucket != keep &&
                 (oldest == nullptr || bucket.submitted_seq < oldest->submitted_seq)) {
        oldest = &bucket;
      }
    }
    if (keep == nullptr || oldest == nullptr) return;
    try {
      oldest->reduce.wait(options.timeout);
    } catch (...) {
      // step() rethrows it; the buffer is free only once the request finished.
      if (!oldest->reduce.poll()) return;
    }
  }
}

void ZeroState::finish_reductions() {
  std::unique_lock<std::mutex> lock(mutex);
  std::exception_ptr error;
  std::deque<ZeroBucket*> running;
  auto finish_one = [&](ZeroBucket& bucket) {
    try {
      if (bucket.reduce.valid()) bucket.reduce.wait(options.timeout);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    bucket.full_grad = torch::Tensor();
    bucket.reduce = Handle();
    bucket.submitted = false;
    bucket.ready = 0;
    for (int index : bucket.params) params[index].ready = false;
  };
  // Buckets backward submitted first; then the rest, last bucket first (the
  // order backward would have produced them). Stage 1 reduces in place, so
  // all of them run at once; stages 2 and 3 pack a copy of each, so at most
  // two are in flight (not a second full gradient).
  const size_t in_flight = options.stage == 1 ? buckets.size() : 2;
  for (ZeroBucket& bucket : buckets) {
    if (bucket.submitted) running.push_back(&bucket);
  }
  for (auto it = buckets.rbegin(); it != buckets.rend(); ++it) {
    if (it->submitted) continue;
    try {
      submit_reduce(*it);
      running.push_back(&*it);
    } catch (...) {
      if (!error) error = std::current_exception();
      continue;
    }
    sample();
    while (running.size() > in_flight) {
      finish_one(*running.front());
      running.pop_front();
    }
  }
  sample();
  while (!running.empty()) {
    finish_one(*running.front());
    running.pop_front();
  }
  if (error) std::rethrow_exception(error);
}

void ZeroState::adopt_params() {
  torch::NoGradGuard no_grad;
  for (ZeroParam& p : params) {
    ZeroBucket& bucket = buckets[p.bucket];
    if (p.numel == 0) continue;
    if (p.param.numel() != p.numel) {
      throw ContractError(std::string(kOp) + ": parameter '" + p.name + "' now has " +
                          std::to_string(p.param.numel()) + " elements; it had " +
                          std::to_string(p.numel) +
                          " when the ZeroOptimizer was built (parameters must keep their size)");
    }
    torch::Tensor slot = bucket.full.narrow(0, p.offset, p.numel).view(p.param.sizes());
    if (occupies(p.param, slot)) continue;
    // Its storage was replaced (torch::load into the model, set_data): take
    // the new values and make it a view again.
    slot.copy_(p.param);
    p.param.set_data(slot);
  }
}

void ZeroState::zero_flat_grads() {
  torch::NoGradGuard no_grad;
  for (ZeroBucket& bucket : buckets) {
    if (!bucket.flat_grad.defined()) continue;
    bucket.flat_grad.zero_();
    for (int index : bucket.params) {
      ZeroParam& p = params[index];
      torch::Tensor slot = slot_of(bucket.flat_grad, p);
      if (!occupies(p.param.grad(), slot)) p.param.mutable_grad() = slot;
    }
  }
}

// In place: each bucket's slice is already at its position in `full`, and
// the output is `full` itself. That is the communicator's in-place allgatherv
// (MPI_IN_PLACE layout: in == out + the earlier ranks' elements), which the
// engine passes straight to the communicator for a tensor it runs alone and,
// for small tensors it fuses, packs the input before writing the output. So
// no gathered copy exists, and all buckets can be in flight at once.
void ZeroState::allgather_into_params() {
  torch::NoGradGuard no_grad;
  std::exception_ptr error;
  std::vector<Handle> running;
  for (ZeroBucket& bucket : buckets) {
    const std::string name = request_name("gather", bucket);
    try {
      torch::Tensor full = bucket.full;
      running.push_back(engine->allgather_async(
          name, tensor_view(bucket.shard, kOp, name),
          [full, name](const std::vector<int64_t>&) { return tensor_view(full, kOp, name); },
          request));
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  for (Handle& handle : running) {
    try {
      handle.wait(options.timeout);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void ZeroState::point_piece_grads() {
  for (ZeroPiece& piece : pieces) {
    piece.value.mutable_grad() =
        buckets[piece.bucket].grad_shard.narrow(0, piece.begin, piece.numel);
  }
}

}  // namespace detail

namespace {

std::string check_options(const ZeroOptions& o) {
  std::ostringstream error;
  if (o.stage < 1 || o.stage > 3) {
    error << "options.stage is " << o.stage
          << "; use 1, 2 or 3 (stage 0, plain data parallelism, is kolo::DistributedOptimizer)";
  } else if (o.bucket_bytes <= 0) {
    error << "options.bucket_bytes is " << o.bucket_bytes << "; it must be > 0";
  }
  return error.str();
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(torch::optim::Optimizer& optimizer, torch::nn::Module& model,
                             const ZeroOptions& options)
    : optimizer_(optimizer), model_(model), state_(std::make_shared<ZeroState>()) {
  ZeroState& state = *state_;
  state.options = options;
  state.optimizer = &optimizer;
  state.model = &model;
  state.call.engine = options.engine;
  state.call.process_set = options.process_set;
  state.call.timeout = options.timeout;
  state.engine = &engine_of(state.call);
  state.call.engine = state.engine;
  state.request.op = ReduceOp::kAverage;
  state.request.process_set = options.process_set;

  // Local checks; the outcome is agreed on below so every rank fails together.
  std::string error = check_options(options);
  if (error.empty() && !optimizer.state().empty()) {
    error =
        "the optimizer has state already (it has stepped); construct the ZeroOptimizer before "
        "the first step";
  }
  if (error.empty() && dynamic_cast<LayerwiseOptimizer*>(&optimizer) != nullptr) {
    // Its trust ratios need norms over whole layers, which a rank's slices
    // do not hold; per-slice norms would be a silently different optimizer.
    error =
        "LARS and LAMB (layer-wise trust ratios) are not supported by ZeroOptimizer yet; use "
        "them with kolo::DistributedOptimizer";
  }
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : model.named_parameters()) {
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  std::unordered_set<const c10::TensorImpl*> seen;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size() && error.empty(); ++g) {
    const auto& group_params = groups[g].params();
    for (size_t j = 0; j < group_params.size() && error.empty(); ++j) {
      const torch::Tensor& p = group_params[j];
      const std::string where =
          "parameter " + std::to_string(j) + " of parameter group " + std::to_string(g);
      auto it = names.find(p.unsafeGetTensorImpl());
      if (it == names.end()) {
        error = where + " is not a parameter of the model passed to the ZeroOptimizer";
      } else if (!seen.insert(p.unsafeGetTensorImpl()).second) {
        error = where + " ('" + it->second + "') appears twice in the optimizer";
      } else if (!p.requires_grad()) {
        continue;  // frozen: dropped from the optimizer, never stepped
      } else if (!p.is_leaf()) {
        error = where + " ('" + it->second + "') is not a leaf tensor";
      } else if (!p.device().is_cpu() || !supported_dtype(p.scalar_type())) {
        error = where + " ('" + it->second + "') is " +
                std::string(c10::toString(p.scalar_type())) + " on " + p.device().str() +
                "; ZeroOptimizer shards float32, float64, float16 and bfloat16 CPU parameters";
      } else {
        ZeroParam zp;
        zp.name = it->second;
        zp.param = p;
        zp.group = static_cast<int>(g);
        zp.numel = p.numel();
        state.params.push_back(std::move(zp));
      }
    }
  }

  std::vector<std::pair<std::string, ShardedUnitImpl*>> units;
  if (error.empty() && options.stage == 3) {
    // The model itself (which may live on the stack) and its submodules.
    std::vector<std::pair<std::string, torch::nn::Module*>> modules{{"", &model}};
    for (const auto& item : model.named_modules("", /*include_self=*/false)) {
      modules.emplace_back(item.key(), item.value().get());
    }
    for (const auto& item : modules) {
      auto* unit = dynamic_cast<ShardedUnitImpl*>(item.second);
      if (unit == nullptr) continue;
      for (const auto& inner : unit->named_modules("", /*include_self=*/false)) {
        if (dynamic_cast<ShardedUnitImpl*>(inner.value().get()) != nullptr) {
          error = "ShardedUnit '" + item.first + "' contains another ShardedUnit ('" + item.first +
                  "." + inner.key() + "'); units must not nest";
        }
      }
      units.emplace_back(item.first, unit);
    }
    std::unordered_set<const c10::TensorImpl*> in_units;
    for (const auto& unit : units) {
      for (const auto& p : unit.second->parameters()) in_units.insert(p.unsafeGetTensorImpl());
    }
    for (const ZeroParam& p : state.params) {
      if (error.empty() && in_units.count(p.param.unsafeGetTensorImpl()) == 0) {
        error = "stage 3: parameter '" + p.name +
                "' is in no kolo::ShardedUnit; wrap every submodule with parameters in a "
                "ShardedUnit (or the whole model in one)";
      }
    }
    for (const ZeroParam& p : state.params) {
      if (error.empty() && p.param.scalar_type() != state.params[0].param.scalar_type()) {
        error = "stage 3: parameter '" + p.name + "' is " +
                std::string(c10::toString(p.param.scalar_type())) + ", '" + state.params[0].name +
                "' is " + std::string(c10::toString(state.params[0].param.scalar_type())) +
                "; use one dtype for the model's parameters";
      }
    }
  }

  // Compare with rank 0 of the set.
  std::vector<std::pair<std::string, torch::Tensor>> described;
  for (const ZeroParam& p : state.params) {
    described.emplace_back("group" + std::to_string(p.group) + "/" + p.name, p.param);
  }
  std::ostringstream manifest;
  manifest << "options stage=" << options.stage << " bucket_bytes=" << options.bucket_bytes
           << " units=" << units.size() << "\n"
           << detail::tensor_manifest(described);
  const std::string mine = manifest.str();
  const std::string check_name = "ZeroOptimizer[" + options.name_prefix + "]";
  const detail::SetPosition position =
      detail::set_position(*state.engine, options.process_set, check_name, state.call);
  state.rank = position.rank;
  state.size = position.size;
  const std::string roots = detail::broadcast_from_root([&] { return mine; }, /*root=*/0, position,
                                                        check_name + ".manifest", state.call);
  if (error.empty()) {
    error = detail::manifest_difference(roots, mine);
    if (!error.empty()) error = "differs from rank 0 of the process set: " + error;
  }
  detail::agree_on_outcome(error, kOp, check_name + ".check", state.call);

  state.build(units);
  std::weak_ptr<ZeroState> weak = state_;
  for (size_t b = 0; b < state.units.size(); ++b) state.units[b]->attach(weak, static_cast<int>(b));
  if (options.stage >= 2) {
    for (size_t i = 0; i < state.params.size(); ++i) {
      ZeroParam& p = state.params[i];
      p.accumulator = torch::autograd::impl::grad_accumulator(p.param);
      p.post_hook_key =
          p.accumulator->add_post_hook(std::make_unique<AfterAccumulateHook>(weak, i));
      p.hooked = true;
    }
  }
  state.sample();
}

ZeroOptimizer::~ZeroOptimizer() {
  ZeroState& state = *state_;
  for (ZeroParam& p : state.params) {
    if (p.hooked) p.accumulator->del_post_hook(p.post_hook_key);
  }
  // Requests still running write into our buffers: wait for them (the engine
  // fails them if a peer is gone, so this ends).
  for (ZeroBucket& bucket : state.buckets) {
    for (Handle* h : {&bucket.reduce, &bucket.gather}) {
      try {
        if (h->valid()) h->wait(state.options.timeout);
      } catch (...) {
      }
    }
  }
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < state.buckets.size(); ++b) {
    ZeroBucket& bucket = state.buckets[b];
    if (bucket.unit < 0) continue;
    state.units[b]->detach();
    if (bucket.gathering || !bucket.gathered) {
      // The parameters' storage is released: give them an empty shape rather
      // than leave views of 0 bytes (call gather_parameters() before
      // destroying to keep the full model).
      for (int index : bucket.params) {
        state.params[index].param.set_data(
            torch::empty({0}, torch::TensorOptions().dtype(bucket.dtype)));
      }
    }
  }
}

torch::Tensor ZeroOptimizer::step() {
  ZeroState& state = *state_;
  state.finish_reductions();
  torch::Tensor result;
  if (state.options.stage == 3) {
    {
      std::lock_guard<std::mutex> lock(state.mutex);
      state.release_all();
    }
    state.point_piece_grads();
    result = optimizer_.step();
    state.last_order = std::move(state.order);
    state.order.clear();
    state.sample();
    if (state.pinned) {
      for (size_t b = 0; b < state.buckets.size(); ++b) state.start_gather(static_cast<int>(b));
      for (size_t b = 0; b < state.buckets.size(); ++b) state.finish_gather(static_cast<int>(b));
    }
  } else {
    // The pieces the wrapped optimizer steps are views of the parameters.
    state.adopt_params();
    state.point_piece_grads();
    result = optimizer_.step();
    state.sample();
    state.allgather_into_params();
    // Stage 1: the gradients' buffer held the reduce-scatter's output;
    // zero it so the model's .grad() reads 0 after step() (not a mix of
    // this rank's reduced slice and its local gradient elsewhere).
    state.zero_flat_grads();
  }
  state.sample();
  return result;
}

void ZeroOptimizer::zero_grad() {
  ZeroState& state = *state_;
  std::lock_guard<std::mutex> lock(state.mutex);
  for (const ZeroBucket& bucket : state.buckets) {
    if (bucket.submitted) {
      throw ContractError(std::string(kOp) +
                          "::zero_grad: called after backward() started the reduce-scatter of "
                          "bucket '" +
                          bucket.name + "' but before step() waited for it; call step() first");
    }
  }
  torch::NoGradGuard no_grad;
  for (ZeroParam& p : state.params) {
    p.ready = false;
    if (state.options.stage != 1) p.param.mutable_grad() = torch::Tensor();
  }
  // Stage 1 keeps full gradients, as libtorch does, as views of flat_grad
  // (a gradient set to none or replaced becomes a view again).
  if (state.options.stage == 1) state.zero_flat_grads();
  for (ZeroBucket& bucket : state.buckets) bucket.ready = 0;
}

void ZeroOptimizer::gather_parameters() {
  ZeroState& state = *state_;
  if (state.options.stage != 3) return;
  state.pinned = true;
  for (size_t b = 0; b < state.buckets.size(); ++b) state.start_gather(static_cast<int>(b));
  for (size_t b = 0; b < state.buckets.size(); ++b) state.finish_gather(static_cast<int>(b));
  state.sample();
}

void ZeroOptimizer::release_parameters() {
  ZeroState& state = *state_;
  if (state.options.stage != 3) return;
  std::lock_guard<std::mutex> lock(state.mutex);
  state.pinned = false;
  state.release_all();
}

const ZeroOptions& ZeroOptimizer::options() const { return state_->options; }
int ZeroOptimizer::rank() const { return state_->rank; }
int ZeroOptimizer::world_size() const { return state_->size; }

std::vector<ZeroOptimizer::BucketInfo> ZeroOptimizer::buckets() const {
  std::vector<BucketInfo> out;
  for (const ZeroBucket& b : state_->buckets) {
    out.push_back({state_->options.name_prefix + b.name, b.numel, b.shard_begin, b.shard_numel});
  }
  return out;
}

}  // namespace kolo

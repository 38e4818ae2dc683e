// ZeroOptimizer (kolo/torch/zero.h): construction and its cross-rank check,
// the gradient hooks that start each bucket's reduce-scatter inside backward
// (stages 2 and 3), and the step.
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <limits>
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

bool supported_dtype(c10::ScalarType t) {
  return t == torch::kFloat || t == torch::kDouble || t == torch::kHalf || t == torch::kBFloat16;
}

}  // namespace

namespace detail {

ZeroState::ZeroState(const ZeroOptions& o) : options(o), pipeline(pipeline_options(o), *this) {}

GradientPipeline::Options ZeroState::pipeline_options(const ZeroOptions& o) {
  GradientPipeline::Options p;
  p.op = kOp;
  p.backward_passes_per_step = o.backward_passes_per_step;
  p.exchange = "reduce-scatter";
  p.too_many_passes = "Call step() (or synchronize()) after every " +
                      std::to_string(o.backward_passes_per_step) +
                      " backward passes, or raise ZeroOptions::backward_passes_per_step";
  // Stage 1 reduces everything at step(), in place (docs/zero.md).
  p.launch_in_backward = o.stage >= 2;
  p.timeout = o.timeout;
  return p;
}

void ZeroState::launch(int b, bool in_backward) {
  if (in_backward) {
    // Stage 3: the unit's backward is done (the last AccumulateGrad of its
    // parameters ran); its parameters go before its gradients are packed.
    if (buckets[b].unit >= 0 && !pinned) release(b);
    // A bucket's full gradient (its packed copy, or the .grad() of a
    // one-parameter bucket) is needed only until its reduce-scatter
    // finished: wait for the others before packing this one, so that while
    // autograd computes the next gradient only this bucket is in flight and
    // stages 2 and 3 peak at 4/N + two buckets of gradients, not a full
    // gradient. Waiting inside backward is safe because every rank hands the
    // buckets over in the same order (its backward runs the same graph;
    // stage 3 relies on it for its gathers too).
    pipeline.wait_for_others(b);
  }
  submit_reduce(b);
  sample();
}

void ZeroState::finished(int b, bool /*ok*/) { buckets[b].full_grad = torch::Tensor(); }

// Caller holds the mutex. Starts the reduce-scatter of the bucket's
// gradients (zeros where a parameter has none) into this rank's slice.
// Stage 1: in place on flat_grad, after moving back into it any gradient
// that is not a view of it (Module::zero_grad(true) and a create_graph
// backward make new ones). Stages 2 and 3: packed into full_grad (or, for a
// bucket of one parameter, from its gradient as it is), the parameters'
// .grad() released.
void ZeroState::submit_reduce(int b) {
  torch::NoGradGuard no_grad;
  ZeroBucket& bucket = buckets[b];
  const std::string name = request_name("reduce", bucket);
  auto start = [&](const torch::Tensor& in) {
    // Communicator contract: out == in is the in-place reduce-scatter, the
    // result written over the first shard_numel elements.
    pipeline.buckets[b].work.push_back(engine->reducescatter_async(
        name, tensor_view(in, kOp, name), tensor_view(bucket.grad_shard, kOp, name), request));
  };
  if (bucket.flat_grad.defined()) {
    pipeline.pack(b, bucket.flat_grad, AfterPack::kView);
    start(bucket.flat_grad);
    return;
  }
  if (bucket.params.size() == 1) {
    // One parameter (a large one has a bucket of its own): reduce-scatter
    // its gradient where it lies rather than from a packed copy.
    ZeroParam& p = params[bucket.params[0]];
    const torch::Tensor& grad = p.param.grad();
    if (grad.defined() && !grad.is_sparse() && grad.is_contiguous()) {
      bucket.full_grad = grad.view({-1});
      p.param.mutable_grad() = torch::Tensor();
      start(bucket.full_grad);
      return;
    }
  }
  bucket.full_grad = torch::empty({bucket.numel}, bucket.options());
  pipeline.pack(b, bucket.full_grad, AfterPack::kRelease);
  start(bucket.full_grad);
}

// Buckets backward submitted first; then the rest, last bucket first (the
// order backward would have produced them). Stage 1 reduces in place, so all
// of them run at once; stages 2 and 3 pack a copy of each, so at most two
// are in flight (not a second full gradient).
void ZeroState::finish_reductions() {
  pipeline.finish(options.stage == 1 ? std::numeric_limits<size_t>::max() : 2);
  sample();
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
      const torch::Tensor slot = pipeline.grad_slot(bucket.flat_grad, index);
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
  } else if (o.backward_passes_per_step < 1) {
    error << "options.backward_passes_per_step is " << o.backward_passes_per_step
          << "; it must be at least 1";
  }
  return error.str();
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(torch::optim::Optimizer& optimizer, torch::nn::Module& model,
                             const ZeroOptions& options)
    : optimizer_(optimizer), model_(model), state_(std::make_shared<ZeroState>(options)) {
  ZeroState& state = *state_;
  state.optimizer = &optimizer;
  state.model = &model;
  state.call.engine = options.engine;
  state.call.process_set = options.process_set;
  state.call.timeout = options.timeout;
  state.engine = &engine_of(state.call, kOp);
  state.call.engine = state.engine;
  state.request.op = ReduceOp::kAverage;
  state.request.prescale = 1.0 / std::max(1, options.backward_passes_per_step);
  state.request.process_set = options.process_set;

  // Local checks; the outcome is agreed on below so every rank fails together.
  std::string error = check_options(options);
  if (error.empty() && !optimizer.state().empty()) {
    error =
        "the optimizer has state already (it has stepped); construct the ZeroOptimizer before "
        "the first step";
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
      } else if (!(p.device().is_cpu() || p.device().is_cuda()) ||
                 !supported_dtype(p.scalar_type())) {
        error = where + " ('" + it->second + "') is " +
                std::string(c10::toString(p.scalar_type())) + " on " + p.device().str() +
                "; ZeroOptimizer shards float32, float64, float16 and bfloat16 parameters on "
                "the CPU or a CUDA device";
      } else {
        state.pipeline.add(it->second, p, static_cast<int>(g));
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
           << " backward_passes_per_step=" << options.backward_passes_per_step
           << " units=" << units.size() << "\n"
           << detail::tensor_manifest(described);
  const std::string mine = manifest.str();
  const std::string check_name = "ZeroOptimizer[" + options.name_prefix + "]";
  const detail::SetPosition position =
      detail::set_position(*state.engine, options.process_set, check_name);
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
  state.pipeline.install_hooks(std::shared_ptr<detail::GradientPipeline>(state_, &state.pipeline));
  state.sample();
}

ZeroOptimizer::~ZeroOptimizer() {
  ZeroState& state = *state_;
  state.pipeline.remove_hooks();
  // A layer-wise optimizer no longer has partners to reduce its norms with.
  if (auto* layerwise = dynamic_cast<LayerwiseOptimizer*>(&optimizer_)) layerwise->clear_layout();
  // Requests still running write into our buffers: wait for them (the engine
  // fails them if a peer is gone, so this ends).
  auto wait = [&](const Handle& h) {
    try {
      if (h.valid()) h.wait(state.options.timeout);
    } catch (...) {
    }
  };
  for (const detail::GradBucket& bucket : state.pipeline.buckets) {
    for (const Handle& h : bucket.work) wait(h);
  }
  for (const ZeroBucket& bucket : state.buckets) wait(bucket.gather);
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
        state.params[index].param.set_data(torch::empty({0}, bucket.options()));
      }
    }
  }
}

void ZeroOptimizer::synchronize() {
  ZeroState& state = *state_;
  state.finish_reductions();
  if (state.options.stage == 3) {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.release_all();
  } else {
    // The pieces the wrapped optimizer steps are views of the parameters.
    state.adopt_params();
  }
  state.point_piece_grads();
}

torch::Tensor ZeroOptimizer::step() {
  ZeroState& state = *state_;
  if (!state.pipeline.exchanged()) synchronize();
  state.pipeline.clear_exchanged();
  const torch::Tensor result = optimizer_.step();
  state.sample();
  if (state.options.stage == 3) {
    state.last_order = std::move(state.order);
    state.order.clear();
    if (state.pinned) {
      for (size_t b = 0; b < state.buckets.size(); ++b) state.start_gather(static_cast<int>(b));
      for (size_t b = 0; b < state.buckets.size(); ++b) state.finish_gather(static_cast<int>(b));
    }
  } else {
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
  state.pipeline.restart("zero_grad");
  std::lock_guard<std::mutex> lock(state.mutex);
  torch::NoGradGuard no_grad;
  // Stage 1 keeps full gradients, as libtorch does, as views of flat_grad
  // (a gradient set to none or replaced becomes a view again).
  if (state.options.stage == 1) {
    state.zero_flat_grads();
  } else {
    for (ZeroParam& p : state.params) p.param.mutable_grad() = torch::Tensor();
  }
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
int ZeroOptimizer::zero_stage() const { return state_->options.stage; }
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

// DistributedOptimizer (kolo/torch/optimizer.h): data parallelism as a policy
// over the gradient pipeline (gradient_pipeline.h).
#include "kolo/torch/optimizer.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "common.h"
#include "gradient_pipeline.h"
#include "kolo/core/errors.h"
#include "kolo/torch/compat.h"
#include "sharded_checkpoint.h"

namespace kolo {

namespace {

constexpr const char* kOp = "kolo::DistributedOptimizer";

// Whether a gradient of this dtype is sent compressed: float32 and float64
// are, under kFp16 / kBf16; other dtypes go as they are.
bool compresses(Compression compression, c10::ScalarType type) {
  const bool floating = type == torch::kFloat || type == torch::kDouble;
  return compression != Compression::kNone && floating;
}

}  // namespace

Compression parse_compression(const std::string& name) {
  if (name == "none") return Compression::kNone;
  if (name == "fp16") return Compression::kFp16;
  if (name == "bf16") return Compression::kBf16;
  throw ContractError("kolo::parse_compression: unknown compression '" + name +
                      "'; use none, fp16 or bf16");
}

const char* compression_name(Compression compression) {
  switch (compression) {
    case Compression::kNone:
      return "none";
    case Compression::kFp16:
      return "fp16";
    case Compression::kBf16:
      return "bf16";
  }
  return "?";
}

// The hook the options ask for: comm_hook, or compression's ("" error if both).
std::shared_ptr<CommHook> hook_of(const DistributedOptimizerOptions& o) {
  switch (o.compression) {
    case Compression::kFp16:
      return fp16_compress_hook();
    case Compression::kBf16:
      return bf16_compress_hook();
    case Compression::kNone:
      break;
  }
  return o.comm_hook;
}

// The DistributedOptimizer's policy over the gradient pipeline
// (gradient_pipeline.h): buckets laid out by readiness. Without a hook, each
// gradient of a launched bucket is allreduced as its own request
// "<prefix><name>" (the engine fuses a bucket's requests into one collective;
// on shm it reads and writes them in place, so nothing is packed on the
// way). With a hook, the bucket is packed into a flat buffer for it and its
// future's result unpacked into the gradients. With bucket views the
// gradients live in that flat buffer: it is allreduced in place as one
// request, or handed to the hook as it is.
struct DistributedOptimizer::Impl : detail::GradientPipeline::Policy {
  explicit Impl(const DistributedOptimizerOptions& o)
      : options(o), hook(hook_of(o)), pipeline(pipeline_options(o, hook != nullptr), *this) {}

  static detail::GradientPipeline::Options pipeline_options(const DistributedOptimizerOptions& o,
                                                            bool hooked) {
    detail::GradientPipeline::Options p;
    // A hook's future may start collectives when it is waited for: every
    // rank must wait in the same order (readiness order differs by rank).
    p.complete_in_bucket_order = hooked;
    p.op = kOp;
    p.name_prefix = o.name_prefix;
    p.backward_passes_per_step = o.backward_passes_per_step;
    p.exchange = "allreduce";
    p.too_many_passes = "Call step() (or synchronize()) after every " +
                        std::to_string(o.backward_passes_per_step) +
                        " backward passes, or raise "
                        "DistributedOptimizerOptions::backward_passes_per_step";
    p.timeout = o.timeout;
    return p;
  }

  DistributedOptimizerOptions options;
  std::shared_ptr<CommHook> hook;  // null: a request per gradient
  Engine* engine = nullptr;
  CallOptions call;         // engine, process set, timeout
  TensorOpOptions request;  // every gradient's allreduce
  detail::SetPosition position;
  torch::optim::Optimizer* optimizer = nullptr;  // null: synchronize only
  torch::nn::Module* model = nullptr;            // null: not given (no checkpoints)
  detail::GradientPipeline pipeline;

  // Per parameter: the dense copy it is sent in when not contiguous or
  // sparse (kept across steps), and the .grad() it was filled from (copied
  // back; a sparse one replaced by the result made sparse).
  struct Staging {
    torch::Tensor buffer;
    torch::Tensor from;
  };
  std::vector<Staging> staging;
  // Per bucket: its flat buffer (with a hook or with bucket views; kept
  // across steps, with bucket views the memory of its gradients) and the
  // future of this step's hook result.
  struct BucketWork {
    torch::Tensor flat;
    CommFuture future;
  };
  std::vector<BucketWork> bucket_work;
  TensorOpOptions hook_reduce;  // request, with the 1/k already applied to the buffer
  int64_t steps = 0;            // synchronizations completed

  // The layout by readiness: at the first synchronize() every rank submits
  // rank 0's readiness order (a sum in which the other ranks add zeros)
  // alongside the gradients, and afterwards lays its buckets out by it.
  bool layout_requested = false;
  TensorHandle layout_request;

  // Bytes of parameter i's gradient as sent (after compression).
  int64_t sent_bytes(int i) const {
    const torch::Tensor& p = pipeline.params[i].param;
    return p.numel() * (compresses(options.compression, p.scalar_type())
                            ? int64_t{2}  // fp16 and bf16
                            : static_cast<int64_t>(p.element_size()));
  }

  // Buckets along `order` (parameter indices), one dtype each: a bucket
  // closes once it holds bucket_bytes (so 0 = every gradient alone).
  std::vector<std::vector<int>> layout_along(const std::vector<int>& order) const {
    std::vector<std::vector<int>> closed;
    std::vector<std::pair<c10::ScalarType, std::pair<std::vector<int>, int64_t>>> open;
    for (int i : order) {
      const c10::ScalarType type = pipeline.params[i].param.scalar_type();
      auto it =
          std::find_if(open.begin(), open.end(), [&](const auto& o) { return o.first == type; });
      if (it == open.end()) it = open.insert(open.end(), {type, {{}, 0}});
      auto& [members, bytes] = it->second;
      members.push_back(i);
      bytes += sent_bytes(i);
      if (bytes >= options.bucket_bytes) {
        closed.push_back(std::move(members));
        open.erase(it);
      }
    }
    for (auto& o : open) closed.push_back(std::move(o.second.first));
    return closed;
  }

  // Reverse parameter order: roughly the order backward() produces them.
  std::vector<int> reverse_order() const {
    std::vector<int> order(pipeline.params.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(order.size() - 1 - i);
    return order;
  }

  bool views() const { return options.gradient_as_bucket_view; }

  // The request-name stem of bucket b (the same on every rank: the layout is).
  std::string bucket_name(int b) const {
    return options.name_prefix + "bucket" + std::to_string(b);
  }

  // Bucket views: a new flat buffer per bucket of the current layout, and
  // every .grad() moved into its slot. At construction and after the layout
  // rebuild, between steps.
  void point_views() {
    std::lock_guard<std::mutex> lock(pipeline.mutex);
    for (size_t b = 0; b < pipeline.buckets.size(); ++b) {
      const detail::GradBucket& bucket = pipeline.buckets[b];
      torch::Tensor& flat = bucket_work[b].flat;
      flat = torch::empty({bucket.numel}, bucket.options());
      pipeline.point_grads(static_cast<int>(b), flat);
    }
  }

  void launch(int b, bool /*in_backward*/) override {
    if (hook) {
      launch_hook(b);
      return;
    }
    if (views()) {
      // The gradients are the buffer (a gradient moved out of its slot is
      // copied back first): reduced in place, nothing to unpack.
      BucketWork& work = bucket_work[b];
      pipeline.pack(b, work.flat, detail::AfterPack::kView);
      TensorHandle handle = allreduce_async_(work.flat, bucket_name(b), request);
      pipeline.buckets[b].work.push_back(handle.handle());
      return;
    }
    for (int i : pipeline.buckets[b].params) {
      torch::Tensor grad = pipeline.gradient_or_zeros(i, /*store=*/true);
      torch::Tensor target = grad;
      if (grad.is_sparse() || !grad.is_contiguous()) {
        Staging& s = staging[i];
        if (!s.buffer.defined() || s.buffer.scalar_type() != grad.scalar_type() ||
            s.buffer.sizes() != grad.sizes()) {
          s.buffer = torch::empty(
              grad.sizes(), torch::TensorOptions().dtype(grad.scalar_type()).device(grad.device()));
        }
        detail::GradientPipeline::to_dense(s.buffer, grad);
        pipeline.count_copy(s.buffer.nbytes());
        s.from = grad;
        target = s.buffer;
      }
      TensorHandle handle =
          allreduce_async_(target, options.name_prefix + pipeline.params[i].name, request);
      pipeline.buckets[b].work.push_back(handle.handle());
    }
  }

  void launch_hook(int b) {
    const detail::GradBucket& bucket = pipeline.buckets[b];
    BucketWork& work = bucket_work[b];
    if (!work.flat.defined() || work.flat.numel() != bucket.numel ||
        work.flat.scalar_type() != bucket.dtype) {
      work.flat = torch::empty({bucket.numel}, bucket.options());
    }
    CommBucket view;
    for (int i : bucket.params) {
      // Defined gradients, so that unpack() has somewhere to write (with
      // bucket views pack() makes them the slots).
      if (!views()) pipeline.gradient_or_zeros(i, /*store=*/true);
      const detail::GradParam& p = pipeline.params[i];
      view.parameters.push_back(p.name);
      view.shapes.push_back(p.param.sizes().vec());
      view.offsets.push_back(p.offset);
    }
    pipeline.pack(b, work.flat, views() ? detail::AfterPack::kView : detail::AfterPack::kKeep);
    const int k = options.backward_passes_per_step;
    if (k > 1) work.flat.div_(k);
    view.index = b;
    view.step = steps;
    view.last = std::all_of(pipeline.buckets.begin(), pipeline.buckets.end(),
                            [](const detail::GradBucket& x) { return x.launched; });
    view.name = bucket_name(b);
    view.buffer = work.flat;
    view.reduce = hook_reduce;
    view.rank = position.rank;
    view.size = position.size;
    work.future = hook->run(view);
    if (!work.future.valid()) {
      throw ContractError(std::string(kOp) + ": the communication hook '" + hook->describe() +
                          "' returned an empty CommFuture for bucket " + view.name);
    }
  }

  void finished(int b, bool ok) override {
    if (hook) {
      BucketWork& work = bucket_work[b];
      CommFuture future = std::move(work.future);
      work.future = CommFuture();
      if (!ok || !future.valid()) return;
      const torch::Tensor result = future.wait(options.timeout);
      if (!result.defined() || result.dim() != 1 || result.numel() != work.flat.numel()) {
        throw ContractError(
            std::string(kOp) + ": the communication hook '" + hook->describe() + "' returned " +
            (result.defined() ? "a tensor of shape " + c10::str(result.sizes())
                              : std::string("an undefined tensor")) +
            " for bucket " + bucket_name(b) + "; it must return a 1-D tensor of the bucket's " +
            std::to_string(work.flat.numel()) + " elements");
      }
      pipeline.unpack(b, result);
      return;
    }
    for (int i : pipeline.buckets[b].params) {
      Staging& s = staging[i];
      if (ok && s.from.defined()) {
        detail::GradientPipeline::write_back(pipeline.params[i].param.mutable_grad(), s.buffer);
        pipeline.count_copy(s.buffer.nbytes());
      }
      s.from = torch::Tensor();
    }
  }

  void synchronize() {
    if (!layout_requested) {
      layout_requested = true;
      // Position + 1 of each parameter in rank 0's order; 0 = not ready there.
      torch::Tensor positions =
          torch::zeros({static_cast<int64_t>(pipeline.params.size())}, torch::kLong);
      if (position.rank == 0) {
        const std::vector<int> order = pipeline.order();
        for (size_t k = 0; k < order.size(); ++k) positions[order[k]] = static_cast<int64_t>(k + 1);
      }
      TensorOpOptions sum = request;
      sum.op = ReduceOp::kSum;
      sum.prescale = sum.postscale = 1.0;
      // Named like the construction check: no parameter's request can clash.
      layout_request = allreduce_async_(
          positions, "DistributedOptimizer[" + options.name_prefix + "].layout", sum);
    }
    pipeline.finish(std::numeric_limits<size_t>::max());
    ++steps;
    if (layout_request.valid()) {
      const torch::Tensor positions = layout_request.wait(options.timeout);
      layout_request = TensorHandle();
      const int64_t* at = positions.data_ptr<int64_t>();
      std::vector<int> order = reverse_order();
      std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
        // Ready on rank 0 first, in its order; the rest as before.
        const int64_t px = at[x] > 0 ? at[x] : std::numeric_limits<int64_t>::max();
        const int64_t py = at[y] > 0 ? at[y] : std::numeric_limits<int64_t>::max();
        return px < py;
      });
      pipeline.set_layout(layout_along(order));
      bucket_work.assign(pipeline.buckets.size(), BucketWork());
      if (views()) point_views();
    }
  }
};

namespace {

// Local validity of the options ("" = fine).
std::string check_options(const DistributedOptimizerOptions& o) {
  std::ostringstream error;
  if (o.op != ReduceOp::kAverage && o.op != ReduceOp::kSum) {
    error << "options.op is " << reduce_op_name(o.op)
          << "; gradients are reduced with ReduceOp::kAverage or ReduceOp::kSum";
  } else if (o.backward_passes_per_step < 1) {
    error << "options.backward_passes_per_step is " << o.backward_passes_per_step
          << "; it must be at least 1";
  } else if (!(o.gradient_predivide_factor > 0) || !std::isfinite(o.gradient_predivide_factor)) {
    error << "options.gradient_predivide_factor is " << o.gradient_predivide_factor
          << "; it must be a finite number > 0";
  } else if (o.bucket_bytes < 0) {
    error << "options.bucket_bytes is " << o.bucket_bytes
          << "; it must be at least 0 (0 = start each gradient's allreduce the moment it is "
             "ready)";
  } else if (o.comm_hook != nullptr && o.compression != Compression::kNone) {
    error << "options.compression is " << compression_name(o.compression)
          << " and options.comm_hook is '" << o.comm_hook->describe()
          << "'; compression is a hook itself (fp16_compress_hook, bf16_compress_hook): set one "
             "of the two";
  } else if (o.gradient_predivide_factor != 1.0 && o.op != ReduceOp::kAverage) {
    error << "options.gradient_predivide_factor is " << o.gradient_predivide_factor << " with op "
          << reduce_op_name(o.op) << "; a predivide factor other than 1 needs ReduceOp::kAverage";
  }
  return error.str();
}

std::string options_manifest(const DistributedOptimizerOptions& o) {
  std::ostringstream out;
  out << "options op=" << reduce_op_name(o.op) << " compression=" << compression_name(o.compression)
      << " backward_passes_per_step=" << o.backward_passes_per_step
      << " gradient_predivide_factor=" << o.gradient_predivide_factor
      << " comm_hook=" << (o.comm_hook ? o.comm_hook->describe() : "none")
      << " gradient_as_bucket_view=" << o.gradient_as_bucket_view << "\n";
  return out.str();
}

std::vector<std::pair<std::string, torch::Tensor>> to_vector(
    const torch::OrderedDict<std::string, torch::Tensor>& named) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  out.reserve(named.size());
  for (const auto& item : named) out.emplace_back(item.key(), item.value());
  return out;
}

// "<g>.<j>" names for every parameter of the optimizer.
std::vector<std::pair<std::string, torch::Tensor>> index_names(
    const torch::optim::Optimizer& optimizer) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t j = 0; j < params.size(); ++j) {
      out.emplace_back(std::to_string(g) + "." + std::to_string(j), params[j]);
    }
  }
  return out;
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(
    torch::optim::Optimizer& optimizer,
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    const DistributedOptimizerOptions& options)
    : DistributedOptimizer(optimizer, to_vector(named_parameters), options) {}

DistributedOptimizer::DistributedOptimizer(torch::optim::Optimizer& optimizer,
                                           const DistributedOptimizerOptions& options)
    : DistributedOptimizer(optimizer, index_names(optimizer), options) {}

DistributedOptimizer::DistributedOptimizer(torch::optim::Optimizer& optimizer,
                                           torch::nn::Module& model,
                                           const DistributedOptimizerOptions& options)
    : DistributedOptimizer(optimizer, to_vector(model.named_parameters()), options) {
  impl_->model = &model;
}

DistributedOptimizer::DistributedOptimizer(
    const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
    const DistributedOptimizerOptions& options)
    : impl_(std::make_shared<Impl>(options)) {
  std::string error;
  std::unordered_map<const c10::TensorImpl*, int> seen;
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (size_t j = 0; j < named_parameters.size() && error.empty(); ++j) {
    const auto& [name, p] = named_parameters[j];
    const std::string where = "parameter " + std::to_string(j) + " ('" + name + "')";
    if (!p.defined()) {
      error = where + " is an undefined tensor";
    } else if (!seen.emplace(p.unsafeGetTensorImpl(), 0).second) {
      error = where + " appears twice";
    } else if (p.requires_grad() && !p.is_leaf()) {
      error = where + " is not a leaf tensor (it was computed from other tensors)";
    } else {
      params.emplace_back(name, p);
    }
  }
  build(params, std::vector<int>(params.size(), 0), error);
}

DistributedOptimizer::DistributedOptimizer(
    torch::optim::Optimizer& optimizer,
    const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
    const DistributedOptimizerOptions& options)
    : impl_(std::make_shared<Impl>(options)) {
  impl_->optimizer = &optimizer;
  // Every optimizer parameter, named; problems are collected, not thrown, so
  // that every rank still takes part in the check in build().
  std::string error;
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& [name, tensor] : named_parameters) {
    if (tensor.defined()) names.emplace(tensor.unsafeGetTensorImpl(), name);
  }
  std::vector<std::pair<std::string, torch::Tensor>> params;  // optimizer order
  std::vector<int> groups;                                    // each one's parameter group
  std::unordered_map<const c10::TensorImpl*, int> seen;
  const auto& param_groups = optimizer.param_groups();
  for (size_t g = 0; g < param_groups.size() && error.empty(); ++g) {
    const auto& group_params = param_groups[g].params();
    for (size_t j = 0; j < group_params.size(); ++j) {
      const torch::Tensor& p = group_params[j];
      const std::string where =
          "parameter " + std::to_string(j) + " of parameter group " + std::to_string(g);
      auto it = names.find(p.unsafeGetTensorImpl());
      if (it == names.end()) {
        error = where +
                " has no name in named_parameters; pass model->named_parameters() of the "
                "model whose parameters the optimizer holds";
        break;
      }
      if (!seen.emplace(p.unsafeGetTensorImpl(), 0).second) {
        error = where + " ('" + it->second + "') appears twice in the optimizer";
        break;
      }
      if (p.requires_grad() && !p.is_leaf()) {
        error = where + " ('" + it->second +
                "') is not a leaf tensor (it was computed from other tensors); optimizers "
                "step leaf parameters only";
        break;
      }
      params.emplace_back(it->second, p);
      groups.push_back(static_cast<int>(g));
    }
  }
  build(params, groups, error);
}

void DistributedOptimizer::build(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                                 const std::vector<int>& groups, std::string error) {
  Impl& impl = *impl_;
  const DistributedOptimizerOptions& options = impl.options;
  impl.call.engine = options.engine;
  impl.call.process_set = options.process_set;
  impl.call.timeout = options.timeout;
  impl.engine = &engine_of(impl.call, kOp);
  impl.call.engine = impl.engine;
  if (error.empty()) error = check_options(options);

  // Compare with rank 0 of the set: names, dtypes, shapes, requires_grad and
  // options, so that a difference is an error everywhere rather than a stall
  // on the first gradient one rank never submits.
  std::vector<std::pair<std::string, torch::Tensor>> described;
  described.reserve(params.size());
  for (const auto& [name, p] : params) {
    described.emplace_back(
        options.name_prefix + name + (p.requires_grad() ? "" : " (requires_grad=false)"), p);
  }
  const std::string mine = options_manifest(options) + detail::tensor_manifest(described);
  const std::string check_name = "DistributedOptimizer[" + options.name_prefix + "]";
  impl.position = detail::set_position(*impl.engine, options.process_set, check_name);
  const std::string roots = detail::broadcast_from_root(
      [&] { return mine; }, /*root=*/0, impl.position, check_name + ".manifest", impl.call);
  if (error.empty()) {
    error = detail::manifest_difference(roots, mine);
    if (!error.empty()) error = "differs from rank 0 of the process set: " + error;
  }
  detail::agree_on_outcome(error, kOp, check_name + ".check", impl.call);

  const int k = options.backward_passes_per_step;
  static_cast<CallOptions&>(impl.request) = impl.call;
  impl.request.op = options.op;
  if (options.op == ReduceOp::kAverage) {
    impl.request.prescale = 1.0 / (options.gradient_predivide_factor * k);
    impl.request.postscale = options.gradient_predivide_factor;
  } else {
    impl.request.prescale = 1.0 / k;
  }
  // A hook's buffer is already divided by k.
  impl.hook_reduce = impl.request;
  impl.hook_reduce.prescale = impl.request.prescale * k;

  // Parameters with requires_grad == false are skipped on every rank.
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    if (p.requires_grad()) impl.pipeline.add(name, p, groups[i]);
  }
  impl.staging.resize(impl.pipeline.params.size());
  impl.pipeline.set_layout(impl.layout_along(impl.reverse_order()));
  impl.bucket_work.resize(impl.pipeline.buckets.size());
  if (impl.views()) impl.point_views();
  impl.pipeline.install_hooks(std::shared_ptr<detail::GradientPipeline>(impl_, &impl.pipeline));
}

DistributedOptimizer::~DistributedOptimizer() { impl_->pipeline.remove_hooks(); }

torch::Tensor DistributedOptimizer::step() {
  if (impl_->optimizer == nullptr) {
    throw ContractError(std::string(kOp) +
                        "::step: this DistributedOptimizer was built without a "
                        "torch::optim::Optimizer (synchronize only); call synchronize(), then "
                        "step your optimizer");
  }
  if (!impl_->pipeline.exchanged()) impl_->synchronize();
  impl_->pipeline.clear_exchanged();
  return impl_->optimizer->step();
}

void DistributedOptimizer::synchronize() { impl_->synchronize(); }

void DistributedOptimizer::zero_grad() {
  impl_->pipeline.restart("zero_grad");
  if (impl_->optimizer != nullptr) {
    compat::zero_grad_in_place(*impl_->optimizer);
    return;
  }
  // As compat::zero_grad_in_place().
  for (detail::GradParam& p : impl_->pipeline.params) {
    torch::Tensor& grad = p.param.mutable_grad();
    if (grad.defined()) {
      grad = grad.detach();
      grad.zero_();
    }
  }
}

torch::optim::Optimizer& DistributedOptimizer::optimizer() {
  if (impl_->optimizer == nullptr) {
    throw ContractError(std::string(kOp) +
                        "::optimizer: this DistributedOptimizer was built without a "
                        "torch::optim::Optimizer (synchronize only)");
  }
  return *impl_->optimizer;
}

int DistributedOptimizer::rank() const { return impl_->position.rank; }
int DistributedOptimizer::world_size() const { return impl_->position.size; }

const DistributedOptimizerOptions& DistributedOptimizer::options() const { return impl_->options; }

std::vector<std::string> DistributedOptimizer::gradient_names() const {
  std::vector<std::string> names;
  names.reserve(impl_->pipeline.params.size());
  for (const detail::GradParam& p : impl_->pipeline.params) {
    names.push_back(impl_->options.name_prefix + p.name);
  }
  return names;
}

std::vector<std::vector<std::string>> DistributedOptimizer::buckets() const {
  std::lock_guard<std::mutex> lock(impl_->pipeline.mutex);
  std::vector<std::vector<std::string>> out;
  for (const detail::GradBucket& bucket : impl_->pipeline.buckets) {
    out.emplace_back();
    for (int i : bucket.params) {
      out.back().push_back(impl_->options.name_prefix + impl_->pipeline.params[i].name);
    }
  }
  return out;
}

DistributedOptimizer::Stats DistributedOptimizer::stats() const {
  const detail::PipelineStats s = impl_->pipeline.stats();
  Stats out;
  out.steps = s.exchanges;
  out.hook_submissions = s.hook_launched;
  out.step_submissions = s.finish_launched;
  out.zero_filled = s.zero_filled;
  out.copies = s.copies;
  out.copied_bytes = s.copied_bytes;
  return out;
}

detail::ReplicatedCheckpoint DistributedOptimizer::checkpoint_of(const char* call) {
  if (impl_->model == nullptr || impl_->optimizer == nullptr) {
    throw ContractError(std::string("kolo::") + call + ": this DistributedOptimizer " +
                        (impl_->optimizer == nullptr ? "has no torch::optim::Optimizer"
                                                     : "was built without the model") +
                        "; construct it from (optimizer, model, options), as "
                        "make_parallel_optimizer does");
  }
  return {impl_->pipeline.params,
          *impl_->optimizer,
          *impl_->model,
          impl_->position,
          impl_->call,
          "DistributedOptimizer[" + impl_->options.name_prefix + "]",
          impl_->hook.get(),
          &impl_->steps};
}

void DistributedOptimizer::save(const std::string& dir, const CheckpointState& state) {
  detail::save_replicated(dir, checkpoint_of("save_checkpoint"), state);
}

CheckpointState DistributedOptimizer::load(const std::string& dir) {
  return detail::load_replicated(dir, checkpoint_of("load_checkpoint"));
}

}  // namespace kolo

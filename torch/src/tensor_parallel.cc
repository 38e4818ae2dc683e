// Tensor parallelism (kolo/torch/tensor_parallel.h).
#include "kolo/torch/tensor_parallel.h"

#include <torch/autograd.h>
#include <torch/nn/functional/embedding.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>

#include "common.h"
#include "kolo/core/errors.h"

namespace kolo {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A group's collectives, as autograd saves them (IValues: no C++ objects).
struct Group {
  Engine* engine = nullptr;
  int process_set = 0;
  int64_t timeout_ms = 0;

  void save(AutogradContext* ctx, const std::string& name) const {
    ctx->saved_data["engine"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(engine));
    ctx->saved_data["set"] = static_cast<int64_t>(process_set);
    ctx->saved_data["timeout"] = timeout_ms;
    ctx->saved_data["name"] = name;
  }
  static Group load(AutogradContext* ctx, std::string* name) {
    Group g;
    g.engine = reinterpret_cast<Engine*>(static_cast<intptr_t>(ctx->saved_data["engine"].toInt()));
    g.process_set = static_cast<int>(ctx->saved_data["set"].toInt());
    g.timeout_ms = ctx->saved_data["timeout"].toInt();
    *name = ctx->saved_data["name"].toStringRef();
    return g;
  }
  TensorOpOptions options() const {
    TensorOpOptions o;
    o.engine = engine;
    o.process_set = process_set;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    o.op = ReduceOp::kSum;
    return o;
  }
  torch::Tensor sum(const torch::Tensor& x, const std::string& name) const {
    return kolo::allreduce(x.contiguous(), name, options());
  }
  // Concatenates every rank's x along the last dimension (sizes may differ).
  torch::Tensor gather_last(const torch::Tensor& x, const std::string& name) const {
    const int64_t width = x.size(-1);
    const torch::Tensor columns = x.reshape({-1, width}).t().contiguous();  // (width, rows)
    const torch::Tensor all = kolo::allgather(columns, name, options());    // (total, rows)
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = all.size(0);
    return all.t().reshape(shape);
  }
};

Group group_of(const TensorParallelOptions& options) {
  Group g;
  g.engine = &engine_of(options, "kolo tensor-parallel layer");
  g.process_set = options.process_set;
  g.timeout_ms = options.timeout.count();  // 0 = no limit of its own
  return g;
}

// Megatron's f: identity forward, the gradient summed over the group backward.
struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const Group& group,
                               const std::string& name) {
    group.save(ctx, name);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    std::string name;
    const Group group = Group::load(ctx, &name);
    return {group.sum(grads[0], name), torch::Tensor(), torch::Tensor()};
  }
};

// Megatron's g: summed over the group forward, identity backward.
struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, const Group& group,
                               const std::string& name) {
    return group.sum(x, name);
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

// Gathered along the last dimension forward; this rank's columns backward.
struct GatherFromGroup : torch::autograd::Function<GatherFromGroup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const Group& group,
                               const std::string& name, int64_t start) {
    ctx->saved_data["start"] = start;
    ctx->saved_data["width"] = x.size(-1);
    return group.gather_last(x, name);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t start = ctx->saved_data["start"].toInt();
    const int64_t width = ctx->saved_data["width"].toInt();
    return {grads[0].narrow(-1, start, width), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// This rank's columns forward; the gradient's columns gathered backward.
struct ScatterToGroup : torch::autograd::Function<ScatterToGroup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const Group& group,
                               const std::string& name, int64_t start, int64_t width) {
    group.save(ctx, name);
    return x.narrow(-1, start, width).contiguous();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    std::string name;
    const Group group = Group::load(ctx, &name);
    return {group.gather_last(grads[0], name), torch::Tensor(), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

// This rank's place in the layer's group; collective for process sets other than 0.
void place_in_group(const TensorParallelOptions& options, const std::string& what, int* rank,
                    int* size) {
  if (options.name.empty()) {
    throw ContractError("kolo " + what +
                        ": TensorParallelOptions::name is empty; give each layer a name that is "
                        "unique in its group (its requests are named after it)");
  }
  const detail::SetPosition position =
      detail::set_position(engine_of(options, "kolo " + what), options.process_set, "kolo " + what);
  *rank = position.rank;
  *size = position.size;
}

// The first forward of a layer of a group of `size`: every rank's full
// dimensions must be the same (detail::ShapeAgreement), or every rank throws
// naming each rank's (a layer built with other dimensions on one rank would
// train on mismatched slices without an error). One small allgather, once.
void agree_on_shape(const TensorParallelOptions& options, const std::string& what, int size,
                    detail::ShapeAgreement& agreement) {
  if (agreement.checked || size == 1) return;
  CallOptions call;
  call.engine = &engine_of(options, "kolo " + what);
  call.process_set = options.process_set;
  call.timeout = options.timeout;
  const std::vector<std::string> shapes =
      allgather_bytes(agreement.shape, options.name + "/shape", call);
  if (!std::all_of(shapes.begin(), shapes.end(), [&](const auto& s) { return s == shapes[0]; })) {
    std::string each;
    for (size_t r = 0; r < shapes.size(); ++r) {
      each += (r ? "; " : "") + std::string("rank ") + std::to_string(r) +
              " of the group: " + shapes[r];
    }
    throw ContractError("kolo " + what + " '" + options.name +
                        "': the ranks of its tensor-parallel group built it with different "
                        "dimensions (" +
                        each + "); build the same layer on every rank of the group");
  }
  agreement.checked = true;
}

std::string linear_shape(int64_t in_features, int64_t out_features, bool bias) {
  return "in_features " + std::to_string(in_features) + ", out_features " +
         std::to_string(out_features) + (bias ? ", bias" : ", no bias");
}

void check_split(int64_t n, int size, const std::string& what, const std::string& dimension) {
  if (n < size) {
    throw ContractError("kolo " + what + ": " + dimension + " = " + std::to_string(n) +
                        " cannot be split over a group of " + std::to_string(size) +
                        " ranks (each needs at least one)");
  }
}

void check_full(const torch::Tensor& t, std::vector<int64_t> shape, const std::string& what) {
  if (!t.defined() || t.sizes() != c10::IntArrayRef(shape)) {
    std::string expected = "[";
    for (size_t i = 0; i < shape.size(); ++i)
      expected += (i ? ", " : "") + std::to_string(shape[i]);
    throw ContractError("kolo " + what + ": from_full needs a tensor of shape " + expected + "]");
  }
}

}  // namespace

Shard shard_of(int64_t n, int rank, int ranks) {
  Shard s;
  const int64_t base = n / ranks, extra = n % ranks;
  s.size = base + (rank < extra ? 1 : 0);
  s.start = rank * base + std::min<int64_t>(rank, extra);
  return s;
}

// ---- ColumnParallelLinear ------------------------------------------------------

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in_features, int64_t out_features,
                                                   const TensorParallelOptions& options, bool bias,
                                                   bool gather_output)
    : options_(options),
      in_features_(in_features),
      out_features_(out_features),
      gather_output_(gather_output) {
  place_in_group(options, "ColumnParallelLinear", &rank_, &size_);
  agreement_.shape =
      linear_shape(in_features, out_features, bias) + (gather_output ? ", gather_output" : "");
  check_split(out_features, size_, "ColumnParallelLinear '" + options.name + "'", "out_features");
  shard_ = shard_of(out_features, rank_, size_);
  // The whole layer as torch initialises it, then this rank's rows.
  torch::nn::Linear full(torch::nn::LinearOptions(in_features, out_features).bias(bias));
  weight = register_parameter("weight",
                              full->weight.detach().narrow(0, shard_.start, shard_.size).clone());
  if (bias) {
    this->bias = register_parameter(
        "bias", full->bias.detach().narrow(0, shard_.start, shard_.size).clone());
  }
}

void ColumnParallelLinearImpl::from_full(const torch::Tensor& full_weight,
                                         const torch::Tensor& full_bias) {
  check_full(full_weight, {out_features_, in_features_}, "ColumnParallelLinear");
  torch::NoGradGuard no_grad;
  weight.copy_(full_weight.narrow(0, shard_.start, shard_.size));
  if (bias.defined()) {
    check_full(full_bias, {out_features_}, "ColumnParallelLinear");
    bias.copy_(full_bias.narrow(0, shard_.start, shard_.size));
  }
}

torch::Tensor ColumnParallelLinearImpl::full_weight() {
  if (size_ == 1) return weight.detach().clone();
  return group_of(options_).gather_last(weight.detach().t(), options_.name + "/full_weight").t();
}

torch::Tensor ColumnParallelLinearImpl::full_bias() {
  if (!bias.defined() || size_ == 1) return bias.defined() ? bias.detach().clone() : bias;
  return group_of(options_).gather_last(bias.detach(), options_.name + "/full_bias");
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& input) {
  if (size_ == 1) return torch::nn::functional::linear(input, weight, bias);
  agree_on_shape(options_, "ColumnParallelLinear", size_, agreement_);
  const Group group = group_of(options_);
  const torch::Tensor x = CopyToGroup::apply(input, group, options_.name + "/f");
  torch::Tensor y = torch::nn::functional::linear(x, weight, bias);
  if (gather_output_) y = GatherFromGroup::apply(y, group, options_.name + "/gather", shard_.start);
  return y;
}

// ---- RowParallelLinear ---------------------------------------------------------

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in_features, int64_t out_features,
                                             const TensorParallelOptions& options, bool bias,
                                             bool input_is_parallel)
    : options_(options),
      in_features_(in_features),
      out_features_(out_features),
      input_is_parallel_(input_is_parallel) {
  place_in_group(options, "RowParallelLinear", &rank_, &size_);
  agreement_.shape = linear_shape(in_features, out_features, bias) +
                     (input_is_parallel ? ", input_is_parallel" : "");
  check_split(in_features, size_, "RowParallelLinear '" + options.name + "'", "in_features");
  shard_ = shard_of(in_features, rank_, size_);
  torch::nn::Linear full(torch::nn::LinearOptions(in_features, out_features).bias(bias));
  weight = register_parameter("weight",
                              full->weight.detach().narrow(1, shard_.start, shard_.size).clone());
  if (bias) this->bias = register_parameter("bias", full->bias.detach().clone());
}

void RowParallelLinearImpl::from_full(const torch::Tensor& full_weight,
                                      const torch::Tensor& full_bias) {
  check_full(full_weight, {out_features_, in_features_}, "RowParallelLinear");
  torch::NoGradGuard no_grad;
  weight.copy_(full_weight.narrow(1, shard_.start, shard_.size));
  if (bias.defined()) {
    check_full(full_bias, {out_features_}, "RowParallelLinear");
    bias.copy_(full_bias);
  }
}

torch::Tensor RowParallelLinearImpl::full_weight() {
  if (size_ == 1) return weight.detach().clone();
  return group_of(options_).gather_last(weight.detach(), options_.name + "/full_weight");
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& input) {
  if (size_ == 1) return torch::nn::functional::linear(input, weight, bias);
  agree_on_shape(options_, "RowParallelLinear", size_, agreement_);
  const Group group = group_of(options_);
  torch::Tensor x = input;
  if (!input_is_parallel_) {
    x = ScatterToGroup::apply(x, group, options_.name + "/scatter", shard_.start, shard_.size);
  }
  torch::Tensor y = torch::nn::functional::linear(x, weight);
  y = ReduceFromGroup::apply(y, group, options_.name + "/g");
  if (bias.defined()) y = y + bias;
  return y;
}

// ---- ParallelMLP ---------------------------------------------------------------

ParallelMLPImpl::ParallelMLPImpl(int64_t hidden, int64_t ffn_hidden,
                                 const TensorParallelOptions& options,
                                 std::function<torch::Tensor(const torch::Tensor&)> activation)
    : activation_(std::move(activation)) {
  TensorParallelOptions first = options, second = options;
  first.name = options.name + "/fc1";
  second.name = options.name + "/fc2";
  fc1 = register_module("fc1", ColumnParallelLinear(hidden, ffn_hidden, first, true, false));
  fc2 = register_module("fc2", RowParallelLinear(ffn_hidden, hidden, second, true, true));
  if (!activation_) activation_ = [](const torch::Tensor& x) { return torch::gelu(x); };
}

torch::Tensor ParallelMLPImpl::forward(const torch::Tensor& input) {
  return fc2(activation_(fc1(input)));
}

// ---- ParallelEmbedding ---------------------------------------------------------

ParallelEmbeddingImpl::ParallelEmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim,
                                             const TensorParallelOptions& options)
    : options_(options), num_embeddings_(num_embeddings), dim_(embedding_dim) {
  place_in_group(options, "ParallelEmbedding", &rank_, &size_);
  agreement_.shape = "num_embeddings " + std::to_string(num_embeddings) + ", embedding_dim " +
                     std::to_string(embedding_dim);
  check_split(num_embeddings, size_, "ParallelEmbedding '" + options.name + "'", "num_embeddings");
  shard_ = shard_of(num_embeddings, rank_, size_);
  torch::nn::Embedding full(num_embeddings, embedding_dim);
  weight = register_parameter("weight",
                              full->weight.detach().narrow(0, shard_.start, shard_.size).clone());
}

void ParallelEmbeddingImpl::from_full(const torch::Tensor& full_weight) {
  check_full(full_weight, {num_embeddings_, dim_}, "ParallelEmbedding");
  torch::NoGradGuard no_grad;
  weight.copy_(full_weight.narrow(0, shard_.start, shard_.size));
}

torch::Tensor ParallelEmbeddingImpl::full_weight() {
  if (size_ == 1) return weight.detach().clone();
  return group_of(options_).gather_last(weight.detach().t(), options_.name + "/full_weight").t();
}

torch::Tensor ParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  if (ids.scalar_type() != torch::kLong) {
    throw ContractError("kolo ParallelEmbedding '" + options_.name +
                        "': ids must be int64 (torch::kLong)");
  }
  if (size_ == 1) return torch::nn::functional::embedding(ids, weight);
  agree_on_shape(options_, "ParallelEmbedding", size_, agreement_);
  const torch::Tensor outside = (ids < shard_.start) | (ids >= shard_.start + shard_.size);
  const torch::Tensor local = (ids - shard_.start).masked_fill(outside, 0);
  torch::Tensor rows = torch::nn::functional::embedding(local, weight);
  rows = rows.masked_fill(outside.unsqueeze(-1), 0.0);
  return ReduceFromGroup::apply(rows, group_of(options_), options_.name + "/g");
}

}  // namespace kolo

// Tensor parallelism (Megatron-LM style): layers whose weight matrices are
// split across the ranks of a tensor-parallel group (an engine process set),
// with the collectives placed as in Megatron-LM:
//
//   ColumnParallelLinear  Y = X A^T + b, A split by rows (output features):
//                         rank i holds A_i and b_i and computes Y_i = X A_i^T + b_i.
//                         forward: X is used as is (every rank has all of it);
//                         backward: the gradient of X is summed over the group
//                         (Megatron's f). With gather_output, the Y_i are
//                         gathered into Y (backward: each rank keeps its columns).
//   RowParallelLinear     Y = X A^T + b, A split by columns (input features):
//                         rank i holds A_i and computes X_i A_i^T from its slice
//                         X_i of the input; forward: the partial products are
//                         summed over the group, then the (whole) bias is added
//                         (Megatron's g); backward: nothing to exchange. With
//                         input_is_parallel = false the layer slices X itself
//                         (backward: the gradient slices are gathered).
//   ParallelMLP           ColumnParallelLinear(h -> f) without gather,
//                         activation, RowParallelLinear(f -> h) on the parallel
//                         input: one allreduce in forward, one in backward.
//   ParallelEmbedding     the table split by rows (vocabulary): rank i looks up
//                         the ids in its rows, zeros for the others, and the
//                         results are summed over the group.
//
// Shards: a dimension of n split over t ranks gives the first n % t ranks one
// more (any n >= t works). Every collective is a named engine request
// ("<name>/..."), so every rank of the group must build the same layers with
// the same names and run them in the same order, as with any collective.
//
// Weights. The constructors initialise the whole matrix as the unsplit torch
// layer would (so every rank of the group must have the same generator
// state, e.g. torch::manual_seed(s) first), then keep their shard; or
// from_full() takes the shard of given full weights (tests, checkpoints of an
// unsplit model). full_weight() gathers the whole matrix back.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "kolo/torch/tensor.h"

#pragma GCC visibility push(default)

namespace kolo {

// Where a tensor-parallel layer runs.
struct TensorParallelOptions : CallOptions {
  // Prefix of the layer's request names; unique among the layers of a group
  // ("block3.mlp"). Required.
  std::string name;
};

// Rows [start, start + size) of rank `rank` when n rows are split over `ranks`.
struct Shard {
  int64_t start = 0;
  int64_t size = 0;
};
Shard shard_of(int64_t n, int rank, int ranks);

namespace detail {
// A layer's full dimensions as text ("in_features 512, out_features 2048,
// bias"), which every rank of its group must share: checked once,
// collectively, at the layer's first forward (not in the constructor, which
// ranks may run one at a time), where every rank of the group gets a
// ContractError naming each rank's dimensions if they differ.
struct ShapeAgreement {
  std::string shape;
  bool checked = false;
};
}  // namespace detail

class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  // Collective over the group (learns this rank's place in it).
  ColumnParallelLinearImpl(int64_t in_features, int64_t out_features,
                           const TensorParallelOptions& options, bool bias = true,
                           bool gather_output = false);
  // Copies this rank's shard of `weight` (out, in) and `bias` (out) or undefined.
  void from_full(const torch::Tensor& weight, const torch::Tensor& bias);
  torch::Tensor full_weight();  // collective: (out, in)
  torch::Tensor full_bias();    // collective: (out), or undefined without a bias

  // (*, in) -> (*, out) with gather_output, else (*, this rank's out shard).
  torch::Tensor forward(const torch::Tensor& input);

  int group_rank() const { return rank_; }
  int group_size() const { return size_; }
  Shard shard() const { return shard_; }
  torch::Tensor weight;  // (shard.size, in)
  torch::Tensor bias;    // (shard.size) or undefined

 private:
  TensorParallelOptions options_;
  int64_t in_features_, out_features_;
  bool gather_output_;
  int rank_ = 0, size_ = 1;
  Shard shard_;
  detail::ShapeAgreement agreement_;
};
TORCH_MODULE(ColumnParallelLinear);

class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(int64_t in_features, int64_t out_features,
                        const TensorParallelOptions& options, bool bias = true,
                        bool input_is_parallel = true);
  void from_full(const torch::Tensor& weight, const torch::Tensor& bias);
  torch::Tensor full_weight();  // collective: (out, in)

  // (*, this rank's in shard) with input_is_parallel, else (*, in) -> (*, out).
  torch::Tensor forward(const torch::Tensor& input);

  int group_rank() const { return rank_; }
  int group_size() const { return size_; }
  Shard shard() const { return shard_; }
  torch::Tensor weight;  // (out, shard.size)
  torch::Tensor bias;    // (out), the same on every rank, or undefined

 private:
  TensorParallelOptions options_;
  int64_t in_features_, out_features_;
  bool input_is_parallel_;
  int rank_ = 0, size_ = 1;
  Shard shard_;
  detail::ShapeAgreement agreement_;
};
TORCH_MODULE(RowParallelLinear);

// h -> ffn -> h with `activation` in between (default GELU).
class ParallelMLPImpl : public torch::nn::Module {
 public:
  ParallelMLPImpl(int64_t hidden, int64_t ffn_hidden, const TensorParallelOptions& options,
                  std::function<torch::Tensor(const torch::Tensor&)> activation = nullptr);
  torch::Tensor forward(const torch::Tensor& input);  // (*, hidden) -> (*, hidden)

  ColumnParallelLinear fc1{nullptr};
  RowParallelLinear fc2{nullptr};

 private:
  std::function<torch::Tensor(const torch::Tensor&)> activation_;
};
TORCH_MODULE(ParallelMLP);

class ParallelEmbeddingImpl : public torch::nn::Module {
 public:
  ParallelEmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim,
                        const TensorParallelOptions& options);
  void from_full(const torch::Tensor& weight);  // (num_embeddings, dim)
  torch::Tensor full_weight();                  // collective

  // int64 ids of any shape -> (*ids.shape, dim).
  torch::Tensor forward(const torch::Tensor& ids);

  int group_rank() const { return rank_; }
  int group_size() const { return size_; }
  Shard shard() const { return shard_; }
  torch::Tensor weight;  // (shard.size, dim): rows [shard.start, shard.start + shard.size)

 private:
  TensorParallelOptions options_;
  int64_t num_embeddings_, dim_;
  int rank_ = 0, size_ = 1;
  Shard shard_;
  detail::ShapeAgreement agreement_;
};
TORCH_MODULE(ParallelEmbedding);

}  // namespace kolo

#pragma GCC visibility pop

// ZeRO partitioning (zero_state.h): parameters -> buckets -> this rank's
// slices -> the pieces the wrapped optimizer steps.
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <unordered_map>

#include "kolo/core/errors.h"
#include "kolo/core/split.h"
#include "kolo/torch/layerwise.h"
#include "zero_state.h"

namespace kolo::detail {

namespace {

constexpr const char* kLayerwiseOp = "kolo::ZeroOptimizer (layer norms)";

// Cuts this rank's slice of `bucket` into pieces of one group each.
void add_pieces(ZeroState& state, int b) {
  ZeroBucket& bucket = state.buckets[b];
  const int64_t lo = bucket.shard_begin;
  const int64_t hi = bucket.shard_begin + bucket.shard_numel;
  for (int index : bucket.params) {
    const ZeroParam& p = state.params[index];
    const int64_t begin = std::max(lo, p.offset);
    const int64_t end = std::min(hi, p.offset + p.numel);
    if (begin >= end) continue;
    if (!state.pieces.empty()) {
      ZeroPiece& last = state.pieces.back();
      if (last.bucket == b && last.group == p.group && lo + last.begin + last.numel == begin) {
        last.numel += end - begin;
        continue;
      }
    }
    ZeroPiece piece;
    piece.bucket = b;
    piece.group = p.group;
    piece.begin = begin - lo;
    piece.numel = end - begin;
    state.pieces.push_back(piece);
  }
}

}  // namespace

void ZeroState::build(const std::vector<std::pair<std::string, ShardedUnitImpl*>>& named_units) {
  torch::NoGradGuard no_grad;
  const int stage = options.stage;
  // The partition: parameter indices per bucket, in flat order.
  std::vector<std::vector<int>> layout;
  if (stage == 3) {
    // One bucket per unit that holds parameters of the optimizer; the unit's
    // parameters in the optimizer's order.
    std::unordered_map<const c10::TensorImpl*, int> unit_of;
    for (size_t u = 0; u < named_units.size(); ++u) {
      for (const auto& p : named_units[u].second->parameters()) {
        unit_of[p.unsafeGetTensorImpl()] = static_cast<int>(u);
      }
    }
    std::vector<int> bucket_of_unit(named_units.size(), -1);
    for (size_t i = 0; i < params.size(); ++i) {
      const int u = unit_of.at(params[i].param.unsafeGetTensorImpl());
      if (bucket_of_unit[u] < 0) {
        bucket_of_unit[u] = static_cast<int>(layout.size());
        layout.emplace_back();
        ZeroBucket bucket;
        bucket.name = named_units[u].first.empty() ? "<model>" : named_units[u].first;
        bucket.unit = u;
        buckets.push_back(std::move(bucket));
        units.push_back(named_units[u].second);
      }
      layout[bucket_of_unit[u]].push_back(static_cast<int>(i));
    }
  } else {
    // Runs of whole parameters of one dtype, about bucket_bytes each.
    int64_t bytes = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& t = params[i].param;
      const int64_t size = t.numel() * static_cast<int64_t>(t.element_size());
      if (layout.empty() || params[layout.back().front()].param.scalar_type() != t.scalar_type() ||
          (bytes > 0 && bytes + size > options.bucket_bytes)) {
        layout.emplace_back();
        ZeroBucket bucket;
        bucket.name = "b" + std::to_string(buckets.size());
        buckets.push_back(std::move(bucket));
        bytes = 0;
      }
      bytes += size;
      layout.back().push_back(static_cast<int>(i));
    }
  }
  pipeline.set_layout(layout);

  for (size_t b = 0; b < buckets.size(); ++b) {
    ZeroBucket& bucket = buckets[b];
    bucket.params = pipeline.buckets[b].params;
    bucket.numel = pipeline.buckets[b].numel;
    bucket.dtype = pipeline.buckets[b].dtype;
    bucket.device = pipeline.buckets[b].device;
    pipeline.buckets[b].name = bucket.name;
    const EvenSplit slice = even_split(bucket.numel, size, rank);
    bucket.shard_begin = slice.begin;
    bucket.shard_numel = slice.count;
    const auto type = bucket.options();
    // The parameters become views of one flat buffer per bucket (set_data
    // keeps each parameter the same tensor the model and the user hold).
    bucket.full = torch::empty({bucket.numel}, type);
    bucket.full_nbytes = bucket.numel * static_cast<int64_t>(bucket.full.element_size());
    for (int index : bucket.params) {
      ZeroParam& p = params[index];
      torch::Tensor slot = slot_of(bucket.full, p);
      slot.copy_(p.param);
      p.param.set_data(slot);
    }
    if (stage == 3) {
      // This rank keeps a copy of its slice and the buffer's storage is
      // released until the unit runs.
      bucket.shard = bucket.full.narrow(0, bucket.shard_begin, bucket.shard_numel).clone();
      bucket.grad_shard = torch::zeros({bucket.shard_numel}, type);
      bucket.gathered = true;
      release(static_cast<int>(b));
    } else {
      // The slice is the parameters' own memory.
      bucket.shard = bucket.full.narrow(0, bucket.shard_begin, bucket.shard_numel);
      if (stage == 1) {
        // The gradients too (a gradient computed before construction is kept).
        bucket.flat_grad = torch::empty({bucket.numel}, type);
        pipeline.point_grads(static_cast<int>(b), bucket.flat_grad);
        bucket.grad_shard = bucket.flat_grad.narrow(0, 0, bucket.shard_numel);
      } else {
        bucket.grad_shard = torch::zeros({bucket.shard_numel}, type);
      }
    }
    add_pieces(*this, static_cast<int>(b));
  }

  // The wrapped optimizer steps the pieces.
  auto& groups = optimizer->param_groups();
  for (auto& group : groups) group.params().clear();
  for (ZeroPiece& piece : pieces) {
    ZeroBucket& bucket = buckets[piece.bucket];
    piece.value = bucket.shard.narrow(0, piece.begin, piece.numel);
    groups[piece.group].params().push_back(piece.value);
  }
  point_piece_grads();
  describe_layers();
}

std::vector<PieceRun> ZeroState::runs_of(const ZeroPiece& piece) const {
  const ZeroBucket& bucket = buckets[piece.bucket];
  // The piece covers bucket elements [lo, hi).
  const int64_t lo = bucket.shard_begin + piece.begin;
  const int64_t hi = lo + piece.numel;
  std::vector<PieceRun> runs;
  for (int index : bucket.params) {
    const ZeroParam& p = params[index];
    const int64_t begin = std::max(lo, p.offset);
    const int64_t end = std::min(hi, p.offset + p.numel);
    if (begin < end) runs.push_back({index, begin - p.offset, begin - lo, end - begin});
  }
  return runs;
}

void ZeroState::describe_layers() {
  auto* layerwise = dynamic_cast<LayerwiseOptimizer*>(optimizer);
  if (layerwise == nullptr) return;
  LayerLayout layout;
  layout.layers = static_cast<int64_t>(params.size());
  layout.runs.resize(optimizer->param_groups().size());
  // Pieces were appended to their groups in this order (build()).
  for (const ZeroPiece& piece : pieces) {
    std::vector<LayerRun> runs;
    for (const PieceRun& run : runs_of(piece)) runs.push_back({run.param, run.begin, run.numel});
    layout.runs[piece.group].push_back(std::move(runs));
  }
  // Every rank's partial sums of squares, summed: one request per step, the
  // same on every rank of the set (the layers are numbered alike everywhere,
  // and a rank without a piece of a layer adds zeros).
  Engine* engine_for_norms = engine;
  RequestOptions sum;
  sum.op = ReduceOp::kSum;
  sum.process_set = options.process_set;
  const std::string name = options.name_prefix + "layer_norms";
  const std::chrono::milliseconds timeout = options.timeout;
  layout.reduce_sum = [engine_for_norms, sum, name, timeout](torch::Tensor& sums) {
    const TensorView view = tensor_view(sums, kLayerwiseOp, name);
    engine_for_norms->allreduce_async(name, view, view, sum).wait(timeout);
  };
  layerwise->set_layout(std::move(layout));
}

}  // namespace kolo::detail

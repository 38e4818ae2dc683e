// kolo's sharded checkpoints (sharded_checkpoint.h), the one schema of every
// ParallelOptimizer. A ZeroOptimizer (kolo/torch/zero.h): every rank writes
// its slices, rank 0 the index; loading at any world size reads the shards
// that hold the new slices; consolidation merges every shard into one. A
// DistributedOptimizer: rank 0 writes the consolidated form; loading
// consolidates any checkpoint on rank 0 and hands it to every rank.
//
// The files and their checks: zero_format.h.
#include "sharded_checkpoint.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <typeinfo>
#include <unordered_map>

#include "archive_codec.h"
#include "kolo/core/errors.h"
#include "kolo/core/split.h"
#include "kolo/torch/compat.h"
#include "kolo/torch/layerwise.h"
#include "zero_format.h"
#include "zero_state.h"

namespace kolo {

namespace {

constexpr const char* kIndexFile = "index.kolo";

using detail::bytes_tensor;
using detail::tensor_bytes;
using detail::ZeroBucket;
using detail::ZeroParam;
using detail::ZeroPiece;
using detail::ZeroState;
using Segment = detail::ZeroSegment;
using Shard = detail::ZeroShardFile;
using ParamInfo = detail::ZeroParamInfo;
using SegmentRef = detail::ZeroSegmentRef;
using Index = detail::ZeroIndexFile;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  detail::zero_fail(source, what);
}

// A shard's file name carries its save's id, so that a save never
// overwrites a file the last complete save's index names. The index, written
// last (and renamed into place, as every checkpoint file), commits a save;
// only then are the shards of earlier saves removed. A save that fails on
// any rank (a full disk) thus leaves the last complete one loadable.
std::string shard_file(int rank, int world, const std::string& save_id) {
  return "shard-" + std::to_string(rank) + "-of-" + std::to_string(world) + "-" + save_id + ".kolo";
}

std::string join(const std::string& dir, const std::string& file) {
  return (std::filesystem::path(dir) / file).string();
}

// Removes `path` when it exists; errors are ignored (cleaning up after a
// failed save must not hide the failure).
void remove_quietly(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

// After `index` was committed in `dir`: removes the shard files of earlier
// saves (shard-*.kolo that the index does not name). Best effort: ranks that
// share the directory race to remove the same files, and a file that cannot
// be removed only costs space.
void remove_stale_shards(const std::string& dir, const Index& index) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool shard = name.rfind("shard-", 0) == 0 && name.size() > 5 &&
                       name.compare(name.size() - 5, 5, ".kolo") == 0;
    if (shard && std::find(index.files.begin(), index.files.end(), name) == index.files.end()) {
      remove_quietly(entry.path().string());
    }
  }
}

std::string index_source(const std::string& dir) { return "'" + join(dir, kIndexFile) + "'"; }

Index read_index(const std::string& dir) {
  const std::string path = join(dir, kIndexFile);
  return detail::decode_zero_index(read_checkpoint_file(path), "index '" + path + "'");
}

// Shard r of `index`, checked against it (same save, rank, parameters).
Shard read_shard(const std::string& dir, const Index& index, int r) {
  const std::string path = join(dir, index.files[r]);
  const std::string source = "shard of rank " + std::to_string(r) + " of " +
                             std::to_string(index.world) + " '" + path + "'";
  std::string payload;
  try {
    payload = read_checkpoint_file(path);
  } catch (const ContractError& e) {
    fail(source, e.what());
  }
  Shard shard = detail::decode_zero_shard(payload, source);
  detail::check_zero_shard(shard, r, index, index_source(dir), source);
  return shard;
}

// --- What both optimizers share --------------------------------------------------

// The optimizer's state of `key` (a tensor the optimizer steps) split into
// element-wise tensors (shaped like key, flattened) and the rest (an archive
// of scalars). False if it has none. `odd`, when given, receives the name of
// a state tensor that is neither (the state cannot be resharded).
bool split_state(const torch::optim::Optimizer& optimizer, const torch::Tensor& key,
                 std::map<std::string, torch::Tensor>& elementwise, std::string& scalars,
                 std::string* odd = nullptr) {
  auto it = optimizer.state().find(compat::optimizer_state_key(key));
  if (it == optimizer.state().end()) return false;
  torch::serialize::OutputArchive out;
  it->second->serialize(out);
  torch::serialize::InputArchive in;
  detail::archive_from_bytes(detail::archive_to_bytes(out), in);
  torch::serialize::OutputArchive rest;
  for (const std::string& k : in.keys()) {
    if (k == "training") continue;  // the archive module's own attribute
    c10::IValue value;
    if (!in.try_read(k, value)) continue;
    if (value.isTensor() && value.toTensor().sizes() == key.sizes()) {
      elementwise[k] = value.toTensor().reshape({-1});
    } else {
      if (odd && odd->empty() && value.isTensor() && value.toTensor().dim() > 0) *odd = k;
      rest.write(k, value);
    }
  }
  scalars = detail::encode_archive(rest);
  return true;
}

// The index's description of the parameters, the optimizer, the model's
// buffers and the training position.
Index describe(const std::vector<ZeroParam>& params, const torch::optim::Optimizer& optimizer,
               const torch::nn::Module& model, const CheckpointState& checkpoint) {
  Index index;
  for (const ZeroParam& p : params) {
    index.params.push_back({p.name, std::string(c10::toString(p.param.scalar_type())),
                            p.param.sizes().vec(), p.group});
  }
  index.optimizer_type = typeid(optimizer).name();
  for (const auto& group : optimizer.param_groups()) {
    torch::serialize::OutputArchive options;
    group.options().serialize(options);
    index.group_options.push_back(detail::encode_archive(options));
  }
  for (const auto& item : model.named_buffers()) {
    if (item.value().defined()) index.buffers.emplace_back(item.key(), item.value().clone());
  }
  index.state = checkpoint;
  index.state.rng_restored = false;
  return index;
}

// That the checkpoint describes these parameters and this optimizer.
void check_fits(const Index& index, const std::vector<ZeroParam>& params,
                const torch::optim::Optimizer& optimizer, const std::string& source) {
  std::unordered_map<std::string, const ParamInfo*> saved;
  for (const ParamInfo& p : index.params) saved[p.name] = &p;
  if (index.params.size() != params.size()) {
    fail(source, "holds " + std::to_string(index.params.size()) +
                     " optimized parameters, this model and optimizer " +
                     std::to_string(params.size()));
  }
  for (const ZeroParam& p : params) {
    auto it = saved.find(p.name);
    const std::string dtype = c10::toString(p.param.scalar_type());
    if (it == saved.end()) fail(source, "has no parameter '" + p.name + "'");
    if (it->second->shape != p.param.sizes().vec() || it->second->dtype != dtype ||
        it->second->group != p.group) {
      fail(source, "parameter '" + p.name + "' is " + it->second->dtype + " " +
                       c10::str(c10::IntArrayRef(it->second->shape)) + " in group " +
                       std::to_string(it->second->group) + ", the model's is " + dtype + " " +
                       c10::str(p.param.sizes()) + " in group " + std::to_string(p.group));
    }
  }
  if (index.optimizer_type != typeid(optimizer).name()) {
    fail(source, "was saved with optimizer " + index.optimizer_type + ", this one is " +
                     typeid(optimizer).name());
  }
  if (index.group_options.size() != optimizer.param_groups().size()) {
    fail(source, "has " + std::to_string(index.group_options.size()) +
                     " parameter groups, the optimizer " +
                     std::to_string(optimizer.param_groups().size()));
  }
}

// The saved optimizer state of one tensor the optimizer steps.
struct StateLoad {
  torch::Tensor key;                                 // the tensor (its values already loaded)
  std::map<std::string, torch::Tensor> elementwise;  // (numel) each
  std::string scalars;                               // archive bytes
  bool has_state = false;
};

// Replaces the optimizer's state with the saved one. The optimizer creates
// its state in a step on zero gradients whose parameter change is undone;
// then each key's state is overwritten with the saved values (element-wise
// tensors shaped like the key).
void restore_state(torch::optim::Optimizer& optimizer, const std::vector<StateLoad>& loads,
                   const std::string& source) {
  torch::NoGradGuard no_grad;
  bool any_state = false;
  for (const StateLoad& l : loads) any_state = any_state || l.has_state;
  optimizer.state().clear();
  if (!any_state) return;
  std::vector<torch::Tensor> values, grads;
  for (const StateLoad& l : loads) {
    torch::Tensor key = l.key;
    values.push_back(key.clone());
    grads.push_back(key.grad());
    key.mutable_grad() = torch::zeros_like(key);
  }
  // Without a layer-wise optimizer's cross-rank reduction: this step's
  // result is discarded, and a rank with no state to restore skips it.
  step_locally(optimizer);
  for (size_t i = 0; i < loads.size(); ++i) {
    torch::Tensor key = loads[i].key;
    key.copy_(values[i]);
    key.mutable_grad() = grads[i];
  }
  for (const StateLoad& l : loads) {
    auto it = optimizer.state().find(compat::optimizer_state_key(l.key));
    if (!l.has_state) {
      if (it != optimizer.state().end()) optimizer.state().erase(it);
      continue;
    }
    if (it == optimizer.state().end()) {
      fail(source, "the optimizer created no state for a parameter to restore into");
    }
    torch::serialize::InputArchive scalars;
    detail::decode_archive(l.scalars, scalars);
    torch::serialize::OutputArchive merged;
    for (const std::string& k : scalars.keys()) {
      if (k == "training") continue;
      c10::IValue v;
      if (scalars.try_read(k, v)) merged.write(k, v);
    }
    for (const auto& [k, t] : l.elementwise) merged.write(k, c10::IValue(t.view(l.key.sizes())));
    torch::serialize::InputArchive in;
    detail::archive_from_bytes(detail::archive_to_bytes(merged), in);
    it->second->serialize(in);
  }
}

// The parameter groups' options and the model's buffers.
void restore_groups_and_buffers(const Index& index, torch::optim::Optimizer& optimizer,
                                torch::nn::Module& model, const std::string& source) {
  torch::NoGradGuard no_grad;
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    torch::serialize::InputArchive options;
    detail::decode_archive(index.group_options[g], options);
    groups[g].options().serialize(options);
  }
  auto buffers = model.named_buffers();
  for (const auto& [name, value] : index.buffers) {
    torch::Tensor* target = buffers.find(name);
    if (target == nullptr || target->sizes() != value.sizes() ||
        target->scalar_type() != value.scalar_type()) {
      fail(source, "buffer '" + name + "' does not match the model's");
    }
    target->copy_(value);
  }
}

// --- A ZeroOptimizer's side ------------------------------------------------------

// The per-parameter runs of rank r's slices (computable on any rank).
std::vector<SegmentRef> runs_of(const ZeroState& state, int r) {
  std::vector<SegmentRef> out;
  for (const ZeroBucket& bucket : state.buckets) {
    const EvenSplit slice = even_split(bucket.numel, state.size, r);
    const int64_t lo = slice.begin;
    const int64_t hi = lo + slice.count;
    for (int index : bucket.params) {
      const ZeroParam& p = state.params[index];
      const int64_t begin = std::max(lo, p.offset);
      const int64_t end = std::min(hi, p.offset + p.numel);
      if (begin < end) out.push_back({p.name, begin - p.offset, end - begin});
    }
  }
  return out;
}

Shard my_shard(ZeroState& state) {
  Shard shard;
  shard.rank = state.rank;
  shard.world = state.size;
  for (const ZeroPiece& piece : state.pieces) {
    std::map<std::string, torch::Tensor> elementwise;
    std::string scalars;
    if (split_state(*state.optimizer, piece.value, elementwise, scalars)) {
      shard.group_scalars.emplace(piece.group, scalars);
    }
    for (const detail::PieceRun& run : state.runs_of(piece)) {
      const ZeroParam& p = state.params[run.param];
      Segment s;
      s.name = p.name;
      s.offset = run.offset;
      s.length = run.numel;
      s.group = p.group;
      s.values = piece.value.narrow(0, run.begin, run.numel).clone();
      for (const auto& [key, t] : elementwise) {
        s.state[key] = t.narrow(0, run.begin, run.numel).clone();
      }
      shard.segments.push_back(std::move(s));
    }
  }
  return shard;
}

Index my_index(ZeroState& state, const CheckpointState& checkpoint, const std::string& save_id) {
  Index index = describe(state.params, *state.optimizer, *state.model, checkpoint);
  index.world = state.size;
  index.stage = state.options.stage;
  index.save_id = save_id;
  for (int r = 0; r < state.size; ++r) {
    index.files.push_back(shard_file(r, state.size, save_id));
    index.segments.push_back(runs_of(state, r));
  }
  return index;
}

// Does run [offset, offset + length) of `name` overlap one of `wanted`?
bool overlaps(const std::vector<SegmentRef>& have, const std::vector<SegmentRef>& wanted) {
  for (const SegmentRef& h : have) {
    for (const SegmentRef& w : wanted) {
      if (h.name == w.name && h.offset < w.offset + w.length && w.offset < h.offset + h.length) {
        return true;
      }
    }
  }
  return false;
}

// Loads this rank's slices and optimizer state from `dir`; no collectives.
CheckpointState load_local(const std::string& dir, ZeroState& state) {
  torch::NoGradGuard no_grad;
  const Index index = read_index(dir);
  const std::string source = "'" + dir + "'";
  check_fits(index, state.params, *state.optimizer, source);

  // What this rank needs: per piece, per key, a (piece.numel) tensor.
  const std::vector<SegmentRef> wanted = runs_of(state, state.rank);
  std::vector<StateLoad> loads(state.pieces.size());
  std::vector<int64_t> filled(state.pieces.size(), 0);
  std::unordered_map<std::string, const ZeroParam*> by_name;
  for (const ZeroParam& p : state.params) by_name[p.name] = &p;

  for (int r = 0; r < index.world; ++r) {
    if (!overlaps(index.segments[r], wanted)) continue;
    const Shard shard = read_shard(dir, index, r);
    for (const Segment& s : shard.segments) {
      const ZeroParam& p = *by_name.at(s.name);
      // Bucket elements [a, b) of this segment; intersect with each piece.
      const ZeroBucket& bucket = state.buckets[p.bucket];
      const int64_t a = p.offset + s.offset;
      const int64_t b = a + s.length;
      for (size_t i = 0; i < state.pieces.size(); ++i) {
        const ZeroPiece& piece = state.pieces[i];
        if (piece.bucket != p.bucket) continue;
        const int64_t lo = bucket.shard_begin + piece.begin;
        const int64_t begin = std::max(lo, a);
        const int64_t end = std::min(lo + piece.numel, b);
        if (begin >= end) continue;
        StateLoad& load = loads[i];
        piece.value.narrow(0, begin - lo, end - begin)
            .copy_(s.values.narrow(0, begin - a, end - begin));
        filled[i] += end - begin;
        for (const auto& [key, t] : s.state) {
          torch::Tensor& target = load.elementwise[key];
          if (!target.defined()) target = torch::zeros({piece.numel}, t.options());
          target.narrow(0, begin - lo, end - begin).copy_(t.narrow(0, begin - a, end - begin));
        }
        auto g = shard.group_scalars.find(piece.group);
        if (g != shard.group_scalars.end()) {
          load.scalars = g->second;
          load.has_state = true;
        }
      }
    }
  }
  for (size_t i = 0; i < state.pieces.size(); ++i) {
    loads[i].key = state.pieces[i].value;
    if (filled[i] != state.pieces[i].numel) {
      fail(source, "the shards cover " + std::to_string(filled[i]) + " of the " +
                       std::to_string(state.pieces[i].numel) +
                       " elements this rank needs for a piece of parameter group " +
                       std::to_string(state.pieces[i].group) + " (an incomplete checkpoint)");
    }
  }
  restore_state(*state.optimizer, loads, source);
  restore_groups_and_buffers(index, *state.optimizer, *state.model, source);
  return index.state;
}

}  // namespace

void save_zero_checkpoint(const std::string& dir, ZeroOptimizer& optimizer,
                          const CheckpointState& checkpoint) {
  ZeroState& state = optimizer.state();
  const std::string op = "kolo::save_zero_checkpoint";
  // One id for this save, in every shard and in the index: a directory that
  // mixes files of two saves is refused when loaded.
  const std::string save_id =
      detail::broadcast_from_root(detail::new_zero_save_id, 0, {state.rank, state.size},
                                  state.options.name_prefix + "save.id", state.call);
  std::string error;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    for (const detail::GradBucket& b : state.pipeline.buckets) {
      if (b.launched) {
        error = "bucket '" + b.name +
                "' is being reduce-scattered (backward ran without step()); save after step()";
      }
    }
  }
  // This rank's new shard: a file of its own, beside the last save's.
  const std::string my_file = join(dir, shard_file(state.rank, state.size, save_id));
  if (error.empty()) {
    try {
      std::filesystem::create_directories(dir);
      // Stages 1 and 2: the slices are views of the parameters (re-adopted
      // if something replaced a parameter's storage).
      if (state.options.stage != 3) state.adopt_params();
      Shard shard = my_shard(state);
      shard.save_id = save_id;
      write_checkpoint_file(my_file, detail::encode_zero_shard(shard));
    } catch (const std::exception& e) {
      error = detail::what_of(e);
    }
  }
  // Every rank's shard is written, or none counts: the index still names
  // the last complete save, whose files are untouched.
  Index index;
  try {
    detail::agree_on_outcome(error, op, state.options.name_prefix + "save.shards", state.call);
    index = my_index(state, checkpoint, save_id);
    if (state.rank == 0) {
      try {
        write_checkpoint_file(join(dir, kIndexFile), detail::encode_zero_index(index));
      } catch (const std::exception& e) {
        error = detail::what_of(e);
      }
    }
    detail::agree_on_outcome(error, op, state.options.name_prefix + "save.index", state.call);
  } catch (...) {
    remove_quietly(my_file);
    throw;
  }
  remove_stale_shards(dir, index);
}

CheckpointState load_zero_checkpoint(const std::string& dir, ZeroOptimizer& optimizer) {
  ZeroState& state = optimizer.state();
  const std::string op = "kolo::load_zero_checkpoint";
  std::string error;
  CheckpointState result;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.release_all();
    try {
      if (state.options.stage != 3) state.adopt_params();
      result = load_local(dir, state);
    } catch (const std::exception& e) {
      error = detail::what_of(e);
    }
  }
  detail::agree_on_outcome(error, op, state.options.name_prefix + "load", state.call);
  if (state.options.stage != 3) {
    state.allgather_into_params();
  } else if (state.pinned) {
    for (size_t b = 0; b < state.buckets.size(); ++b) state.start_gather(static_cast<int>(b));
    for (size_t b = 0; b < state.buckets.size(); ++b) state.finish_gather(static_cast<int>(b));
  }
  state.sample();
  return result;
}

namespace {

// Every parameter of a checkpoint in full: values and element-wise state.
struct Full {
  Index index;
  std::map<std::string, Segment> params;  // offset 0, length numel
  std::map<int, std::string> group_scalars;
};

Full read_full(const std::string& dir) {
  Full full;
  full.index = read_index(dir);
  std::map<std::string, int64_t> filled;
  for (int r = 0; r < full.index.world; ++r) {
    const Shard shard = read_shard(dir, full.index, r);
    for (const auto& [g, bytes] : shard.group_scalars) full.group_scalars.emplace(g, bytes);
    for (const Segment& s : shard.segments) {
      const ParamInfo* info = nullptr;
      for (const ParamInfo& p : full.index.params) {
        if (p.name == s.name) info = &p;
      }
      if (info == nullptr)
        fail("'" + dir + "'", "a shard holds unknown parameter '" + s.name + "'");
      Segment& target = full.params[s.name];
      if (!target.values.defined()) {
        target.name = s.name;
        target.length = info->numel();
        target.group = s.group;
        target.values = torch::empty({target.length}, s.values.options());
      }
      target.values.narrow(0, s.offset, s.length).copy_(s.values);
      for (const auto& [key, t] : s.state) {
        torch::Tensor& st = target.state[key];
        if (!st.defined()) st = torch::zeros({target.length}, t.options());
        st.narrow(0, s.offset, s.length).copy_(t);
      }
      filled[s.name] += s.length;
    }
  }
  for (const ParamInfo& p : full.index.params) {
    if (filled[p.name] != p.numel()) {
      fail("'" + dir + "'", "the shards hold " + std::to_string(filled[p.name]) + " of the " +
                                std::to_string(p.numel()) + " elements of '" + p.name + "'");
    }
  }
  return full;
}

// The checkpoint as one shard ("shard-0-of-1.kolo") holding everything, and
// its index, under a fresh save id.
std::pair<Index, Shard> consolidated(const Full& full) {
  Shard shard;
  shard.rank = 0;
  shard.world = 1;
  shard.group_scalars = full.group_scalars;
  Index index = full.index;
  index.world = 1;
  index.format = shard.format = detail::kZeroFormat;
  index.save_id = shard.save_id = detail::new_zero_save_id();
  index.files = {shard_file(0, 1, index.save_id)};
  index.segments.assign(1, {});
  for (const ParamInfo& p : full.index.params) {
    shard.segments.push_back(full.params.at(p.name));
    index.segments[0].push_back({p.name, 0, p.numel()});
  }
  return {std::move(index), std::move(shard)};
}

}  // namespace

void consolidate_zero_checkpoint(const std::string& dir, const std::string& out_dir) {
  const auto [index, shard] = consolidated(read_full(dir));
  std::filesystem::create_directories(out_dir);
  write_checkpoint_file(join(out_dir, index.files[0]), detail::encode_zero_shard(shard));
  try {
    write_checkpoint_file(join(out_dir, kIndexFile), detail::encode_zero_index(index));
  } catch (...) {
    remove_quietly(join(out_dir, index.files[0]));
    throw;
  }
  remove_stale_shards(out_dir, index);
}

CheckpointState load_zero_model(const std::string& dir, torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  Full full = read_full(dir);
  const std::string source = "'" + dir + "'";
  auto params = model.named_parameters();
  for (const ParamInfo& p : full.index.params) {
    torch::Tensor* target = params.find(p.name);
    if (target == nullptr || target->sizes().vec() != p.shape) {
      fail(source, "parameter '" + p.name + "' " + c10::str(c10::IntArrayRef(p.shape)) +
                       " has no parameter of that name and shape in the model");
    }
    target->copy_(full.params.at(p.name).values.view(p.shape));
  }
  auto buffers = model.named_buffers();
  for (const auto& [name, value] : full.index.buffers) {
    torch::Tensor* target = buffers.find(name);
    if (target == nullptr || target->sizes() != value.sizes()) {
      fail(source, "buffer '" + name + "' does not match the model's");
    }
    target->copy_(value);
  }
  return full.index.state;
}

// --- A DistributedOptimizer's side ----------------------------------------------

namespace detail {

void save_replicated(const std::string& dir, const ReplicatedCheckpoint& what,
                     const CheckpointState& checkpoint) {
  const std::string op = "kolo::save_checkpoint";
  const std::vector<std::string> rng = gather_generator_states(what.name + ".save", what.call);
  std::vector<std::string> hook_states;
  std::string local_error;
  if (what.hook != nullptr) {
    std::string mine;
    try {
      mine = what.hook->save_state();
    } catch (const std::exception& e) {
      local_error = "the communication hook's save_state() failed: " + what_of(e);
    }
    hook_states = gather_bytes(mine, what.name + ".save.hook", what.call);
  }
  std::string error = local_error;
  if (what.position.rank == 0 && error.empty()) {
    try {
      torch::NoGradGuard no_grad;
      Shard shard;
      for (const ZeroParam& p : what.params) {
        Segment s;
        s.name = p.name;
        s.length = p.numel;
        s.group = p.group;
        s.values = p.param.detach().reshape({-1}).clone();
        std::string scalars, odd;
        if (split_state(what.optimizer, p.param, s.state, scalars, &odd)) {
          shard.group_scalars.emplace(p.group, scalars);
        }
        if (!odd.empty()) {
          // Not element-wise: it could not be resharded for another world or stage.
          throw ContractError("the optimizer's state '" + odd + "' of parameter '" + p.name +
                              "' is not shaped like the parameter " + c10::str(p.param.sizes()) +
                              ": kolo's sharded checkpoint holds element-wise optimizer state "
                              "only; save with kolo::save_checkpoint(path, model, &optimizer, "
                              "state) instead");
        }
        for (auto& [key, t] : s.state) t = t.clone();
        shard.segments.push_back(std::move(s));
      }
      Index index = describe(what.params, what.optimizer, what.model, checkpoint);
      index.world = 1;
      index.stage = 0;
      index.rng_states = rng;
      if (what.hook != nullptr) {
        index.hook = what.hook->describe();
        index.hook_states = hook_states;
        index.hook_step = what.exchanges != nullptr ? *what.exchanges : 0;
      }
      index.save_id = shard.save_id = new_zero_save_id();
      index.files = {shard_file(0, 1, index.save_id)};
      index.segments.assign(1, {});
      for (const ZeroParam& p : what.params) index.segments[0].push_back({p.name, 0, p.numel});
      std::filesystem::create_directories(dir);
      write_checkpoint_file(join(dir, index.files[0]), encode_zero_shard(shard));
      try {
        write_checkpoint_file(join(dir, kIndexFile), encode_zero_index(index));
      } catch (...) {
        remove_quietly(join(dir, index.files[0]));
        throw;
      }
      remove_stale_shards(dir, index);
    } catch (const std::exception& e) {
      error = what_of(e);
    }
  }
  agree_on_outcome(error, op, what.name + ".save.check", what.call);
}

CheckpointState load_replicated(const std::string& dir, const ReplicatedCheckpoint& what) {
  const std::string op = "kolo::load_checkpoint";
  // Rank 0 reads every shard (of any world size and stage) and hands every
  // rank the checkpoint in full: its index, then its one shard.
  std::string shard_bytes;
  const std::string index_bytes = broadcast_from_root(
      [&] {
        const auto [index, shard] = consolidated(read_full(dir));
        shard_bytes = encode_zero_shard(shard);
        return encode_zero_index(index);
      },
      0, what.position, what.name + ".load.index", what.call);
  shard_bytes = broadcast_from_root([&] { return shard_bytes; }, 0, what.position,
                                    what.name + ".load.shard", what.call);
  CheckpointState result;
  std::string error;
  try {
    torch::NoGradGuard no_grad;
    const std::string source = "'" + dir + "'";
    const Index index = decode_zero_index(index_bytes, index_source(dir));
    const Shard shard = decode_zero_shard(shard_bytes, "'" + join(dir, index.files[0]) + "'");
    check_fits(index, what.params, what.optimizer, source);
    std::unordered_map<std::string, const Segment*> by_name;
    for (const Segment& s : shard.segments) by_name[s.name] = &s;
    std::vector<StateLoad> loads;
    for (const ZeroParam& p : what.params) {
      const Segment& s = *by_name.at(p.name);  // consolidated: every parameter in full
      p.param.copy_(s.values.view(p.param.sizes()));
      StateLoad load;
      load.key = p.param;
      load.elementwise = s.state;
      auto g = shard.group_scalars.find(p.group);
      if (g != shard.group_scalars.end()) {
        load.scalars = g->second;
        load.has_state = true;
      }
      loads.push_back(std::move(load));
    }
    restore_state(what.optimizer, loads, source);
    restore_groups_and_buffers(index, what.optimizer, what.model, source);
    result = index.state;
    if (static_cast<int>(index.rng_states.size()) == what.position.size) {
      set_default_generator_state(index.rng_states[static_cast<size_t>(what.position.rank)]);
      result.rng_restored = true;
    }
    // A hook's state is this rank's (PowerSGD's error feedback): it goes
    // back only to the same rank of a world of the same size, with the same
    // hook; otherwise the hook keeps its fresh state.
    if (what.hook != nullptr && index.hook == what.hook->describe() &&
        static_cast<int>(index.hook_states.size()) == what.position.size) {
      what.hook->load_state(index.hook_states[static_cast<size_t>(what.position.rank)]);
      // The hook goes on at the step it was saved at (PowerSGD's start_step).
      if (what.exchanges != nullptr) *what.exchanges = index.hook_step;
    }
  } catch (const std::exception& e) {
    error = what_of(e);
  }
  agree_on_outcome(error, op, what.name + ".load.check", what.call);
  return result;
}

}  // namespace detail

void ZeroOptimizer::save(const std::string& dir, const CheckpointState& state) {
  save_zero_checkpoint(dir, *this, state);
}

CheckpointState ZeroOptimizer::load(const std::string& dir) {
  return load_zero_checkpoint(dir, *this);
}

}  // namespace kolo

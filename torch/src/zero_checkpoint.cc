// Sharded ZeRO checkpoints (kolo/torch/zero.h): every rank writes its slices,
// rank 0 the index; loading at any world size reads the shards that hold the
// new slices; consolidation merges every shard into one.
//
// A shard's payload (a torch archive inside kolo's checkpoint container):
//   kind "kolo-zero-shard", rank, world_size,
//   segments/count, segments/<i>/{name, offset, length, group, values, keys,
//   state/<key>}: one run [offset, offset + length) of the flattened parameter
//   `name`, its values and the element-wise optimizer state tensors (Adam's
//   exp_avg...), each (length);
//   groups/<g>/scalars: the optimizer state that is not element-wise (Adam's
//   step), one archive per parameter group this shard has state for.
// The index: kind "kolo-zero-index", world_size, stage, the parameters (name,
// dtype, shape, group) in the optimizer's order, the optimizer type and group
// options, the model's buffers, the CheckpointState, and each shard's file
// name and segments (so a loading rank reads only the shards it needs).
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <typeinfo>
#include <unordered_map>

#include "kolo/core/errors.h"
#include "zero_state.h"

namespace kolo {

namespace {

constexpr const char* kIndexFile = "index.kolo";
constexpr int64_t kFormat = 1;

using detail::bytes_tensor;
using detail::tensor_bytes;
using detail::ZeroBucket;
using detail::ZeroParam;
using detail::ZeroPiece;
using detail::ZeroState;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw ContractError("ZeRO checkpoint " + source + ": " + what);
}

std::string shard_file(int rank, int world) {
  return "shard-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".kolo";
}

std::string join(const std::string& dir, const std::string& file) {
  return (std::filesystem::path(dir) / file).string();
}

int64_t read_int(torch::serialize::InputArchive& a, const std::string& key,
                 const std::string& source) {
  c10::IValue v;
  if (!a.try_read(key, v) || !v.isInt()) fail(source, "has no integer '" + key + "'");
  return v.toInt();
}

std::string read_string(torch::serialize::InputArchive& a, const std::string& key,
                        const std::string& source) {
  c10::IValue v;
  if (!a.try_read(key, v) || !v.isString()) fail(source, "has no string '" + key + "'");
  return v.toStringRef();
}

torch::Tensor read_tensor(torch::serialize::InputArchive& a, const std::string& key,
                          const std::string& source) {
  c10::IValue v;
  if (!a.try_read(key, v) || !v.isTensor()) fail(source, "has no tensor '" + key + "'");
  return v.toTensor();
}

// --- Shards -----------------------------------------------------------------

struct Segment {
  std::string name;
  int64_t offset = 0;
  int64_t length = 0;
  int group = 0;
  torch::Tensor values;                        // (length)
  std::map<std::string, torch::Tensor> state;  // element-wise optimizer state, each (length)
};

struct Shard {
  int rank = 0;
  int world = 1;
  std::vector<Segment> segments;
  std::map<int, std::string> group_scalars;  // group -> archive bytes
};

std::string encode_shard(const Shard& shard) {
  torch::serialize::OutputArchive a;
  a.write("kind", c10::IValue(std::string("kolo-zero-shard")));
  a.write("format", c10::IValue(kFormat));
  a.write("rank", c10::IValue(static_cast<int64_t>(shard.rank)));
  a.write("world_size", c10::IValue(static_cast<int64_t>(shard.world)));
  a.write("segments/count", c10::IValue(static_cast<int64_t>(shard.segments.size())));
  for (size_t i = 0; i < shard.segments.size(); ++i) {
    const Segment& s = shard.segments[i];
    const std::string k = "segments/" + std::to_string(i);
    a.write(k + "/name", c10::IValue(s.name));
    a.write(k + "/offset", c10::IValue(s.offset));
    a.write(k + "/length", c10::IValue(s.length));
    a.write(k + "/group", c10::IValue(static_cast<int64_t>(s.group)));
    a.write(k + "/values", c10::IValue(s.values));
    std::string keys;
    for (const auto& [key, t] : s.state) {
      keys += key + "\n";
      a.write(k + "/state/" + key, c10::IValue(t));
    }
    a.write(k + "/keys", c10::IValue(keys));
  }
  std::string groups;
  for (const auto& [g, bytes] : shard.group_scalars) {
    groups += std::to_string(g) + "\n";
    a.write("groups/" + std::to_string(g) + "/scalars", c10::IValue(bytes_tensor(bytes)));
  }
  a.write("groups/with_state", c10::IValue(groups));
  return detail::archive_to_bytes(a);
}

Shard decode_shard(const std::string& payload, const std::string& source) {
  torch::serialize::InputArchive a;
  try {
    detail::archive_from_bytes(payload, a);
  } catch (const std::exception& e) {
    fail(source, std::string("is not a readable archive: ") + e.what());
  }
  if (read_string(a, "kind", source) != "kolo-zero-shard") fail(source, "is not a ZeRO shard");
  Shard shard;
  shard.rank = static_cast<int>(read_int(a, "rank", source));
  shard.world = static_cast<int>(read_int(a, "world_size", source));
  const int64_t count = read_int(a, "segments/count", source);
  for (int64_t i = 0; i < count; ++i) {
    const std::string k = "segments/" + std::to_string(i);
    Segment s;
    s.name = read_string(a, k + "/name", source);
    s.offset = read_int(a, k + "/offset", source);
    s.length = read_int(a, k + "/length", source);
    s.group = static_cast<int>(read_int(a, k + "/group", source));
    s.values = read_tensor(a, k + "/values", source);
    std::istringstream keys(read_string(a, k + "/keys", source));
    for (std::string key; std::getline(keys, key);) {
      s.state[key] = read_tensor(a, k + "/state/" + key, source);
    }
    shard.segments.push_back(std::move(s));
  }
  std::istringstream groups(read_string(a, "groups/with_state", source));
  for (std::string g; std::getline(groups, g);) {
    shard.group_scalars[std::stoi(g)] =
        tensor_bytes(read_tensor(a, "groups/" + g + "/scalars", source));
  }
  return shard;
}

// --- Index ------------------------------------------------------------------

struct ParamInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  int group = 0;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct SegmentRef {
  std::string name;
  int64_t offset = 0;
  int64_t length = 0;
};

struct Index {
  int world = 1;
  int stage = 1;
  std::vector<ParamInfo> params;
  std::string optimizer_type;
  std::vector<std::string> group_options;  // archive bytes per group
  std::vector<std::pair<std::string, torch::Tensor>> buffers;
  CheckpointState state;
  std::vector<std::string> files;                 // per shard
  std::vector<std::vector<SegmentRef>> segments;  // per shard
};

std::string encode_index(const Index& index) {
  torch::serialize::OutputArchive a;
  a.write("kind", c10::IValue(std::string("kolo-zero-index")));
  a.write("format", c10::IValue(kFormat));
  a.write("world_size", c10::IValue(static_cast<int64_t>(index.world)));
  a.write("stage", c10::IValue(static_cast<int64_t>(index.stage)));
  a.write("params/count", c10::IValue(static_cast<int64_t>(index.params.size())));
  for (size_t i = 0; i < index.params.size(); ++i) {
    const ParamInfo& p = index.params[i];
    const std::string k = "params/" + std::to_string(i);
    a.write(k + "/name", c10::IValue(p.name));
    a.write(k + "/dtype", c10::IValue(p.dtype));
    a.write(k + "/shape", c10::IValue(torch::tensor(p.shape, torch::kLong)));
    a.write(k + "/group", c10::IValue(static_cast<int64_t>(p.group)));
  }
  a.write("optimizer/type", c10::IValue(index.optimizer_type));
  a.write("groups/count", c10::IValue(static_cast<int64_t>(index.group_options.size())));
  for (size_t g = 0; g < index.group_options.size(); ++g) {
    a.write("groups/" + std::to_string(g) + "/options",
            c10::IValue(bytes_tensor(index.group_options[g])));
  }
  a.write("buffers/count", c10::IValue(static_cast<int64_t>(index.buffers.size())));
  for (size_t i = 0; i < index.buffers.size(); ++i) {
    const std::string k = "buffers/" + std::to_string(i);
    a.write(k + "/name", c10::IValue(index.buffers[i].first));
    a.write(k + "/value", c10::IValue(index.buffers[i].second));
  }
  const CheckpointState& s = index.state;
  a.write("state/epoch", c10::IValue(s.epoch));
  a.write("state/step", c10::IValue(s.step));
  a.write("state/seed", c10::IValue(static_cast<int64_t>(s.seed)));
  a.write("state/sampler_epoch", c10::IValue(s.sampler.epoch));
  a.write("state/sampler_next_index", c10::IValue(s.sampler.next_index));
  a.write("state/extras/count", c10::IValue(static_cast<int64_t>(s.extras.size())));
  int64_t e = 0;
  for (const auto& [key, value] : s.extras) {
    const std::string k = "state/extras/" + std::to_string(e++);
    a.write(k + "/key", c10::IValue(key));
    a.write(k + "/value", c10::IValue(bytes_tensor(value)));
  }
  for (size_t r = 0; r < index.files.size(); ++r) {
    const std::string k = "shards/" + std::to_string(r);
    a.write(k + "/file", c10::IValue(index.files[r]));
    std::string text;
    for (const SegmentRef& s : index.segments[r]) {
      text += s.name + "\t" + std::to_string(s.offset) + "\t" + std::to_string(s.length) + "\n";
    }
    a.write(k + "/segments", c10::IValue(text));
  }
  return detail::archive_to_bytes(a);
}

Index decode_index(const std::string& payload, const std::string& source) {
  torch::serialize::InputArchive a;
  try {
    detail::archive_from_bytes(payload, a);
  } catch (const std::exception& e) {
    fail(source, std::string("is not a readable archive: ") + e.what());
  }
  if (read_string(a, "kind", source) != "kolo-zero-index") fail(source, "is not a ZeRO index");
  Index index;
  index.world = static_cast<int>(read_int(a, "world_size", source));
  index.stage = static_cast<int>(read_int(a, "stage", source));
  const int64_t params = read_int(a, "params/count", source);
  for (int64_t i = 0; i < params; ++i) {
    const std::string k = "params/" + std::to_string(i);
    ParamInfo p;
    p.name = read_string(a, k + "/name", source);
    p.dtype = read_string(a, k + "/dtype", source);
    const torch::Tensor shape = read_tensor(a, k + "/shape", source);
    for (int64_t d = 0; d < shape.numel(); ++d) p.shape.push_back(shape[d].item<int64_t>());
    p.group = static_cast<int>(read_int(a, k + "/group", source));
    index.params.push_back(std::move(p));
  }
  index.optimizer_type = read_string(a, "optimizer/type", source);
  const int64_t groups = read_int(a, "groups/count", source);
  for (int64_t g = 0; g < groups; ++g) {
    index.group_options.push_back(
        tensor_bytes(read_tensor(a, "groups/" + std::to_string(g) + "/options", source)));
  }
  const int64_t buffers = read_int(a, "buffers/count", source);
  for (int64_t i = 0; i < buffers; ++i) {
    const std::string k = "buffers/" + std::to_string(i);
    index.buffers.emplace_back(read_string(a, k + "/name", source),
                               read_tensor(a, k + "/value", source));
  }
  CheckpointState& s = index.state;
  s.epoch = read_int(a, "state/epoch", source);
  s.step = read_int(a, "state/step", source);
  s.seed = static_cast<uint64_t>(read_int(a, "state/seed", source));
  s.sampler.epoch = read_int(a, "state/sampler_epoch", source);
  s.sampler.next_index = read_int(a, "state/sampler_next_index", source);
  const int64_t extras = read_int(a, "state/extras/count", source);
  for (int64_t i = 0; i < extras; ++i) {
    const std::string k = "state/extras/" + std::to_string(i);
    s.extras[read_string(a, k + "/key", source)] =
        tensor_bytes(read_tensor(a, k + "/value", source));
  }
  for (int r = 0; r < index.world; ++r) {
    const std::string k = "shards/" + std::to_string(r);
    index.files.push_back(read_string(a, k + "/file", source));
    std::vector<SegmentRef> refs;
    std::istringstream text(read_string(a, k + "/segments", source));
    for (std::string line; std::getline(text, line);) {
      std::istringstream fields(line);
      SegmentRef ref;
      std::getline(fields, ref.name, '\t');
      fields >> ref.offset >> ref.length;
      refs.push_back(ref);
    }
    index.segments.push_back(std::move(refs));
  }
  return index;
}

Index read_index(const std::string& dir) {
  const std::string path = join(dir, kIndexFile);
  return decode_index(read_checkpoint_file(path), "index '" + path + "'");
}

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
  Shard shard = decode_shard(payload, source);
  if (shard.rank != r || shard.world != index.world) {
    fail(source, "holds rank " + std::to_string(shard.rank) + " of " + std::to_string(shard.world) +
                     "; the index expects rank " + std::to_string(r) + " of " +
                     std::to_string(index.world));
  }
  return shard;
}

// --- This rank's side ---------------------------------------------------------

std::string state_key(const torch::Tensor& t) {
  return c10::guts::to_string(t.unsafeGetTensorImpl());
}

// A piece's optimizer state split into element-wise tensors (same shape as
// the piece) and the rest (an archive of scalars). False if it has none.
bool split_state(const torch::optim::Optimizer& optimizer, const ZeroPiece& piece,
                 std::map<std::string, torch::Tensor>& elementwise, std::string& scalars) {
  auto it = optimizer.state().find(state_key(piece.value));
  if (it == optimizer.state().end()) return false;
  torch::serialize::OutputArchive out;
  it->second->serialize(out);
  torch::serialize::InputArchive in;
  detail::archive_from_bytes(detail::archive_to_bytes(out), in);
  torch::serialize::OutputArchive rest;
  for (const std::string& key : in.keys()) {
    if (key == "training") continue;  // the archive module's own attribute
    c10::IValue value;
    if (!in.try_read(key, value)) continue;
    if (value.isTensor() && value.toTensor().dim() == 1 &&
        value.toTensor().size(0) == piece.numel) {
      elementwise[key] = value.toTensor();
    } else {
      rest.write(key, value);
    }
  }
  scalars = detail::archive_to_bytes(rest);
  return true;
}

// The per-parameter runs of rank r's slices (computable on any rank).
std::vector<SegmentRef> runs_of(const ZeroState& state, int r) {
  std::vector<SegmentRef> out;
  for (const ZeroBucket& bucket : state.buckets) {
    const auto [lo, n] = detail::slice_of(bucket.numel, state.size, r);
    const int64_t hi = lo + n;
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
    const ZeroBucket& bucket = state.buckets[piece.bucket];
    std::map<std::string, torch::Tensor> elementwise;
    std::string scalars;
    if (split_state(*state.optimizer, piece, elementwise, scalars)) {
      shard.group_scalars.emplace(piece.group, scalars);
    }
    // The piece covers bucket elements [lo, hi); cut it per parameter.
    const int64_t lo = bucket.shard_begin + piece.begin;
    const int64_t hi = lo + piece.numel;
    for (int index : bucket.params) {
      const ZeroParam& p = state.params[index];
      const int64_t begin = std::max(lo, p.offset);
      const int64_t end = std::min(hi, p.offset + p.numel);
      if (begin >= end) continue;
      Segment s;
      s.name = p.name;
      s.offset = begin - p.offset;
      s.length = end - begin;
      s.group = p.group;
      s.values = piece.value.narrow(0, begin - lo, end - begin).clone();
      for (const auto& [key, t] : elementwise) {
        s.state[key] = t.narrow(0, begin - lo, end - begin).clone();
      }
      shard.segments.push_back(std::move(s));
    }
  }
  return shard;
}

Index my_index(ZeroState& state, const CheckpointState& checkpoint) {
  Index index;
  index.world = state.size;
  index.stage = state.options.stage;
  for (const ZeroParam& p : state.params) {
    index.params.push_back({p.name, std::string(c10::toString(p.param.scalar_type())),
                            p.param.sizes().vec(), p.group});
  }
  index.optimizer_type = typeid(*state.optimizer).name();
  for (const auto& group : state.optimizer->param_groups()) {
    torch::serialize::OutputArchive options;
    group.options().serialize(options);
    index.group_options.push_back(detail::archive_to_bytes(options));
  }
  for (const auto& item : state.model->named_buffers()) {
    if (item.value().defined()) index.buffers.emplace_back(item.key(), item.value().clone());
  }
  index.state = checkpoint;
  index.state.rng_restored = false;
  for (int r = 0; r < state.size; ++r) {
    index.files.push_back(shard_file(r, state.size));
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
  // The checkpoint must describe this model and optimizer.
  std::unordered_map<std::string, const ParamInfo*> saved;
  for (const ParamInfo& p : index.params) saved[p.name] = &p;
  if (index.params.size() != state.params.size()) {
    fail(source, "holds " + std::to_string(index.params.size()) +
                     " optimized parameters, this model and optimizer " +
                     std::to_string(state.params.size()));
  }
  for (const ZeroParam& p : state.params) {
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
  if (index.optimizer_type != typeid(*state.optimizer).name()) {
    fail(source, "was saved with optimizer " + index.optimizer_type + ", this one is " +
                     typeid(*state.optimizer).name());
  }
  auto& groups = state.optimizer->param_groups();
  if (index.group_options.size() != groups.size()) {
    fail(source, "has " + std::to_string(index.group_options.size()) +
                     " parameter groups, the optimizer " + std::to_string(groups.size()));
  }

  // What this rank needs: per piece, per key, a (piece.numel) tensor.
  const std::vector<SegmentRef> wanted = runs_of(state, state.rank);
  struct PieceLoad {
    std::map<std::string, torch::Tensor> elementwise;
    std::string scalars;
    bool has_state = false;
    int64_t filled = 0;
  };
  std::vector<PieceLoad> loads(state.pieces.size());
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
        PieceLoad& load = loads[i];
        piece.value.narrow(0, begin - lo, end - begin)
            .copy_(s.values.narrow(0, begin - a, end - begin));
        load.filled += end - begin;
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
    if (loads[i].filled != state.pieces[i].numel) {
      fail(source, "the shards cover " + std::to_string(loads[i].filled) + " of the " +
                       std::to_string(state.pieces[i].numel) +
                       " elements this rank needs for a piece of parameter group " +
                       std::to_string(state.pieces[i].group) + " (an incomplete checkpoint)");
    }
  }

  // Optimizer state: create it with a step on zero gradients whose parameter
  // change is undone, then overwrite it with the saved values.
  bool any_state = false;
  for (const PieceLoad& l : loads) any_state = any_state || l.has_state;
  state.optimizer->state().clear();
  if (any_state) {
    std::vector<torch::Tensor> values;
    for (ZeroBucket& bucket : state.buckets) {
      values.push_back(bucket.shard.clone());
      bucket.grad_shard.zero_();
    }
    state.point_piece_grads();
    state.optimizer->step();
    for (size_t b = 0; b < state.buckets.size(); ++b) state.buckets[b].shard.copy_(values[b]);
    for (size_t i = 0; i < state.pieces.size(); ++i) {
      const ZeroPiece& piece = state.pieces[i];
      auto it = state.optimizer->state().find(state_key(piece.value));
      if (!loads[i].has_state) {
        if (it != state.optimizer->state().end()) state.optimizer->state().erase(it);
        continue;
      }
      if (it == state.optimizer->state().end()) {
        fail(source, "the optimizer created no state for a parameter piece to restore into");
      }
      torch::serialize::InputArchive scalars;
      detail::archive_from_bytes(loads[i].scalars, scalars);
      torch::serialize::OutputArchive merged;
      for (const std::string& key : scalars.keys()) {
        if (key == "training") continue;
        c10::IValue v;
        if (scalars.try_read(key, v)) merged.write(key, v);
      }
      for (const auto& [key, t] : loads[i].elementwise) merged.write(key, c10::IValue(t));
      torch::serialize::InputArchive in;
      detail::archive_from_bytes(detail::archive_to_bytes(merged), in);
      it->second->serialize(in);
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    torch::serialize::InputArchive options;
    detail::archive_from_bytes(index.group_options[g], options);
    groups[g].options().serialize(options);
  }
  // Buffers.
  auto buffers = state.model->named_buffers();
  for (const auto& [name, value] : index.buffers) {
    torch::Tensor* target = buffers.find(name);
    if (target == nullptr || target->sizes() != value.sizes() ||
        target->scalar_type() != value.scalar_type()) {
      fail(source, "buffer '" + name + "' does not match the model's");
    }
    target->copy_(value);
  }
  return index.state;
}

}  // namespace

void save_zero_checkpoint(const std::string& dir, ZeroOptimizer& optimizer,
                          const CheckpointState& checkpoint) {
  ZeroState& state = optimizer.state();
  const std::string op = "kolo::save_zero_checkpoint";
  std::string error;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    for (const ZeroBucket& b : state.buckets) {
      if (b.submitted) {
        error = "bucket '" + b.name +
                "' is being reduce-scattered (backward ran without step()); save after step()";
      }
    }
  }
  if (error.empty()) {
    try {
      std::filesystem::create_directories(dir);
      // Stages 1 and 2: the slices are views of the parameters (re-adopted
      // if something replaced a parameter's storage).
      if (state.options.stage != 3) state.adopt_params();
      write_checkpoint_file(join(dir, shard_file(state.rank, state.size)),
                            encode_shard(my_shard(state)));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  detail::agree_on_outcome(error, op, state.options.name_prefix + "save.shards", state.call);
  if (state.rank == 0) {
    try {
      write_checkpoint_file(join(dir, kIndexFile), encode_index(my_index(state, checkpoint)));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  detail::agree_on_outcome(error, op, state.options.name_prefix + "save.index", state.call);
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
      error = e.what();
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

}  // namespace

void consolidate_zero_checkpoint(const std::string& dir, const std::string& out_dir) {
  Full full = read_full(dir);
  Shard shard;
  shard.rank = 0;
  shard.world = 1;
  shard.group_scalars = full.group_scalars;
  Index index = full.index;
  index.world = 1;
  index.files = {shard_file(0, 1)};
  index.segments.assign(1, {});
  for (const ParamInfo& p : full.index.params) {
    shard.segments.push_back(full.params.at(p.name));
    index.segments[0].push_back({p.name, 0, p.numel()});
  }
  std::filesystem::create_directories(out_dir);
  write_checkpoint_file(join(out_dir, index.files[0]), encode_shard(shard));
  write_checkpoint_file(join(out_dir, kIndexFile), encode_index(index));
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

}  // namespace kolo

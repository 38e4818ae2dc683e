// The files of a sharded ZeRO checkpoint (zero_format.h).
#include "zero_format.h"

#include <torch/serialize/archive.h>

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <unordered_map>

#include "archive_codec.h"
#include "common.h"
#include "kolo/core/errors.h"

namespace kolo::detail {

namespace {

// Bounds that no real checkpoint reaches; past them the file is damaged and
// a loop over the count would only produce a slower error.
constexpr int64_t kMaxWorld = 1 << 20;
constexpr int64_t kMaxCount = int64_t{1} << 30;

int64_t read_int(torch::serialize::InputArchive& a, const std::string& key,
                 const std::string& source) {
  c10::IValue v;
  if (!a.try_read(key, v) || !v.isInt()) zero_fail(source, "has no integer '" + key + "'");
  return v.toInt();
}

// An integer in [lo, hi].
int64_t read_int_in(torch::serialize::InputArchive& a, const std::string& key, int64_t lo,
                    int64_t hi, const std::string& source) {
  const int64_t v = read_int(a, key, source);
  if (v < lo || v > hi) {
    zero_fail(source, "'" + key + "' is " + std::to_string(v) + ", outside [" + std::to_string(lo) +
                          ", " + std::to_string(hi) + "] (a damaged checkpoint)");
  }
  return v;
}

std::string read_string(torch::serialize::InputArchive& a, const std::string& key,
                        const std::string& source) {
  c10::IValue v;
  if (!a.try_read(key, v) || !v.isString()) zero_fail(source, "has no string '" + key + "'");
  return v.toStringRef();
}

torch::Tensor read_tensor(torch::serialize::InputArchive& a, const std::string& key,
                          const std::string& source) {
  c10::IValue v;
  if (!a.try_read(key, v) || !v.isTensor()) zero_fail(source, "has no tensor '" + key + "'");
  return v.toTensor();
}

// A 1-D tensor of `length` elements.
torch::Tensor read_run(torch::serialize::InputArchive& a, const std::string& key, int64_t length,
                       const std::string& source) {
  torch::Tensor t = read_tensor(a, key, source);
  if (t.dim() != 1 || t.numel() != length) {
    zero_fail(source, "tensor '" + key + "' has shape " + c10::str(t.sizes()) + ", expected [" +
                          std::to_string(length) + "] (a damaged checkpoint)");
  }
  return t;
}

// A whole decimal number, or nullopt.
std::optional<int64_t> parse_int(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno != 0) return std::nullopt;
  return v;
}

void open_archive(const std::string& payload, torch::serialize::InputArchive& a,
                  const std::string& source) {
  try {
    decode_archive(payload, a);
  } catch (const std::exception& e) {
    zero_fail(source, std::string("is not a readable archive: ") + what_of(e));
  }
}

// An archive stored as bytes under `key` (an optimizer's options or state).
void check_nested(const std::string& bytes, const std::string& key, const std::string& source) {
  try {
    check_archive(bytes);
  } catch (const ContractError& e) {
    zero_fail(source, "'" + key + "' is damaged: " + e.what());
  }
}

// "kind" and "format"; returns the format.
int64_t read_header(torch::serialize::InputArchive& a, const std::string& kind,
                    const std::string& what, const std::string& source) {
  if (read_string(a, "kind", source) != kind) zero_fail(source, "is not a " + what);
  c10::IValue v;
  const int64_t format = a.try_read("format", v) && v.isInt() ? v.toInt() : -1;
  if (format != kZeroFormat) {
    zero_fail(source, "format " + std::to_string(format) + " is not supported (this build reads " +
                          std::to_string(kZeroFormat) + ")");
  }
  return format;
}

}  // namespace

void zero_fail(const std::string& source, const std::string& what) {
  throw ContractError("ZeRO checkpoint " + source + ": " + what);
}

int64_t ZeroParamInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string new_zero_save_id() {
  std::random_device device;
  static const char* digits = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = device();
    for (int k = 0; k < 8; ++k) id += digits[(word >> (4 * k)) & 15];
  }
  return id;
}

// --- Shards -----------------------------------------------------------------

std::string encode_zero_shard(const ZeroShardFile& shard) {
  torch::serialize::OutputArchive a;
  a.write("kind", c10::IValue(std::string("kolo-zero-shard")));
  a.write("format", c10::IValue(kZeroFormat));
  a.write("save_id", c10::IValue(shard.save_id));
  a.write("rank", c10::IValue(static_cast<int64_t>(shard.rank)));
  a.write("world_size", c10::IValue(static_cast<int64_t>(shard.world)));
  a.write("segments/count", c10::IValue(static_cast<int64_t>(shard.segments.size())));
  for (size_t i = 0; i < shard.segments.size(); ++i) {
    const ZeroSegment& s = shard.segments[i];
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
  return encode_archive(a);
}

ZeroShardFile decode_zero_shard(const std::string& payload, const std::string& source) {
  torch::serialize::InputArchive a;
  open_archive(payload, a, source);
  ZeroShardFile shard;
  shard.format = read_header(a, "kolo-zero-shard", "ZeRO shard", source);
  shard.save_id = read_string(a, "save_id", source);
  shard.world = static_cast<int>(read_int_in(a, "world_size", 1, kMaxWorld, source));
  shard.rank = static_cast<int>(read_int_in(a, "rank", 0, shard.world - 1, source));
  const int64_t count = read_int_in(a, "segments/count", 0, kMaxCount, source);
  for (int64_t i = 0; i < count; ++i) {
    const std::string k = "segments/" + std::to_string(i);
    ZeroSegment s;
    s.name = read_string(a, k + "/name", source);
    s.offset = read_int_in(a, k + "/offset", 0, std::numeric_limits<int64_t>::max() / 2, source);
    s.length = read_int_in(a, k + "/length", 0, std::numeric_limits<int64_t>::max() / 2, source);
    s.group = static_cast<int>(read_int_in(a, k + "/group", 0, kMaxCount, source));
    s.values = read_run(a, k + "/values", s.length, source);
    std::istringstream keys(read_string(a, k + "/keys", source));
    for (std::string key; std::getline(keys, key);) {
      s.state[key] = read_run(a, k + "/state/" + key, s.length, source);
    }
    shard.segments.push_back(std::move(s));
  }
  std::istringstream groups(read_string(a, "groups/with_state", source));
  for (std::string g; std::getline(groups, g);) {
    const std::optional<int64_t> group = parse_int(g);
    if (!group || *group < 0 || *group > kMaxCount) {
      zero_fail(source, "'groups/with_state' names group '" + g + "' (a damaged checkpoint)");
    }
    std::string scalars = tensor_bytes(read_tensor(a, "groups/" + g + "/scalars", source));
    check_nested(scalars, "groups/" + g + "/scalars", source);
    shard.group_scalars[static_cast<int>(*group)] = std::move(scalars);
  }
  return shard;
}

// --- Index ------------------------------------------------------------------

std::string encode_zero_index(const ZeroIndexFile& index) {
  torch::serialize::OutputArchive a;
  a.write("kind", c10::IValue(std::string("kolo-zero-index")));
  a.write("format", c10::IValue(kZeroFormat));
  a.write("save_id", c10::IValue(index.save_id));
  a.write("world_size", c10::IValue(static_cast<int64_t>(index.world)));
  a.write("stage", c10::IValue(static_cast<int64_t>(index.stage)));
  a.write("params/count", c10::IValue(static_cast<int64_t>(index.params.size())));
  for (size_t i = 0; i < index.params.size(); ++i) {
    const ZeroParamInfo& p = index.params[i];
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
  write_checkpoint_state(a, index.state);
  if (!index.rng_states.empty()) {
    a.write("rng/count", c10::IValue(static_cast<int64_t>(index.rng_states.size())));
    for (size_t r = 0; r < index.rng_states.size(); ++r) {
      a.write("rng/" + std::to_string(r), c10::IValue(bytes_tensor(index.rng_states[r])));
    }
  }
  if (!index.hook.empty()) {
    a.write("hook/name", c10::IValue(index.hook));
    a.write("hook/step", c10::IValue(index.hook_step));
    a.write("hook/count", c10::IValue(static_cast<int64_t>(index.hook_states.size())));
    for (size_t r = 0; r < index.hook_states.size(); ++r) {
      a.write("hook/" + std::to_string(r), c10::IValue(bytes_tensor(index.hook_states[r])));
    }
  }
  for (size_t r = 0; r < index.files.size(); ++r) {
    const std::string k = "shards/" + std::to_string(r);
    a.write(k + "/file", c10::IValue(index.files[r]));
    std::string text;
    for (const ZeroSegmentRef& s : index.segments[r]) {
      text += s.name + "\t" + std::to_string(s.offset) + "\t" + std::to_string(s.length) + "\n";
    }
    a.write(k + "/segments", c10::IValue(text));
  }
  return encode_archive(a);
}

ZeroIndexFile decode_zero_index(const std::string& payload, const std::string& source) {
  torch::serialize::InputArchive a;
  open_archive(payload, a, source);
  ZeroIndexFile index;
  index.format = read_header(a, "kolo-zero-index", "ZeRO index", source);
  index.save_id = read_string(a, "save_id", source);
  index.world = static_cast<int>(read_int_in(a, "world_size", 1, kMaxWorld, source));
  index.stage = static_cast<int>(read_int_in(a, "stage", 0, 3, source));
  const int64_t groups = read_int_in(a, "groups/count", 0, kMaxCount, source);
  const int64_t params = read_int_in(a, "params/count", 0, kMaxCount, source);
  std::unordered_map<std::string, const ZeroParamInfo*> by_name;
  for (int64_t i = 0; i < params; ++i) {
    const std::string k = "params/" + std::to_string(i);
    ZeroParamInfo p;
    p.name = read_string(a, k + "/name", source);
    p.dtype = read_string(a, k + "/dtype", source);
    const torch::Tensor shape = read_tensor(a, k + "/shape", source);
    if (shape.dim() != 1 || shape.scalar_type() != torch::kLong) {
      zero_fail(source, "parameter '" + p.name + "' has a malformed shape (a damaged checkpoint)");
    }
    const torch::Tensor dims = shape.contiguous();
    int64_t numel = 1;
    for (int64_t d = 0; d < dims.numel(); ++d) {
      const int64_t size = dims.data_ptr<int64_t>()[d];
      if (size < 0 || (size > 0 && numel > std::numeric_limits<int64_t>::max() / 4 / size)) {
        zero_fail(source, "parameter '" + p.name + "' has shape " + c10::str(dims) +
                              " (a damaged checkpoint)");
      }
      numel *= size;
      p.shape.push_back(size);
    }
    p.group =
        static_cast<int>(read_int_in(a, k + "/group", 0, std::max<int64_t>(0, groups - 1), source));
    index.params.push_back(std::move(p));
  }
  for (const ZeroParamInfo& p : index.params) {
    if (!by_name.emplace(p.name, &p).second) {
      zero_fail(source, "lists parameter '" + p.name + "' twice (a damaged checkpoint)");
    }
  }
  index.optimizer_type = read_string(a, "optimizer/type", source);
  for (int64_t g = 0; g < groups; ++g) {
    const std::string key = "groups/" + std::to_string(g) + "/options";
    index.group_options.push_back(tensor_bytes(read_tensor(a, key, source)));
    check_nested(index.group_options.back(), key, source);
  }
  const int64_t buffers = read_int_in(a, "buffers/count", 0, kMaxCount, source);
  for (int64_t i = 0; i < buffers; ++i) {
    const std::string k = "buffers/" + std::to_string(i);
    index.buffers.emplace_back(read_string(a, k + "/name", source),
                               read_tensor(a, k + "/value", source));
  }
  index.state = read_checkpoint_state(a, [&](const std::string& what) { zero_fail(source, what); });
  c10::IValue rng;
  if (a.try_read("rng/count", rng)) {
    const int64_t count = read_int_in(a, "rng/count", 0, kMaxWorld, source);
    for (int64_t r = 0; r < count; ++r) {
      index.rng_states.push_back(tensor_bytes(read_tensor(a, "rng/" + std::to_string(r), source)));
    }
  }
  c10::IValue hook;
  if (a.try_read("hook/name", hook)) {
    index.hook = read_string(a, "hook/name", source);
    index.hook_step = read_int_in(a, "hook/step", 0, std::numeric_limits<int64_t>::max(), source);
    const int64_t count = read_int_in(a, "hook/count", 0, kMaxWorld, source);
    for (int64_t r = 0; r < count; ++r) {
      index.hook_states.push_back(
          tensor_bytes(read_tensor(a, "hook/" + std::to_string(r), source)));
    }
  }
  for (int r = 0; r < index.world; ++r) {
    const std::string k = "shards/" + std::to_string(r);
    const std::string file = read_string(a, k + "/file", source);
    // A file name in the checkpoint's directory, never a path out of it.
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\0') != std::string::npos) {
      zero_fail(source, "names shard file '" + file + "' for rank " + std::to_string(r) +
                            " (a damaged checkpoint)");
    }
    index.files.push_back(file);
    std::vector<ZeroSegmentRef> refs;
    std::istringstream text(read_string(a, k + "/segments", source));
    for (std::string line; std::getline(text, line);) {
      std::istringstream fields(line);
      ZeroSegmentRef ref;
      std::string offset, length;
      std::getline(fields, ref.name, '\t');
      std::getline(fields, offset, '\t');
      std::getline(fields, length);
      const std::optional<int64_t> o = parse_int(offset);
      const std::optional<int64_t> n = parse_int(length);
      auto it = by_name.find(ref.name);
      if (!o || !n || it == by_name.end() || *o < 0 || *n < 0 || *o > it->second->numel() - *n) {
        zero_fail(source, "shard " + std::to_string(r) + " lists the segment '" + line +
                              "', not a run of a parameter of the index (a damaged checkpoint)");
      }
      ref.offset = *o;
      ref.length = *n;
      refs.push_back(ref);
    }
    index.segments.push_back(std::move(refs));
  }
  return index;
}

void check_zero_shard(const ZeroShardFile& shard, int r, const ZeroIndexFile& index,
                      const std::string& index_source, const std::string& source) {
  if (shard.format != index.format || shard.save_id != index.save_id) {
    zero_fail(source, "belongs to save " + shard.save_id + ", the index " + index_source +
                          " to save " + index.save_id +
                          ": the directory mixes files of two saves (what a save interrupted "
                          "part-way leaves); restore the whole directory from one save");
  }
  if (shard.rank != r || shard.world != index.world) {
    zero_fail(source, "holds rank " + std::to_string(shard.rank) + " of " +
                          std::to_string(shard.world) + "; the index expects rank " +
                          std::to_string(r) + " of " + std::to_string(index.world));
  }
  std::unordered_map<std::string, const ZeroParamInfo*> by_name;
  for (const ZeroParamInfo& p : index.params) by_name[p.name] = &p;
  for (const ZeroSegment& s : shard.segments) {
    auto it = by_name.find(s.name);
    if (it == by_name.end()) {
      zero_fail(source, "holds parameter '" + s.name + "', which the index " + index_source +
                            " does not list");
    }
    const ZeroParamInfo& p = *it->second;
    if (s.offset > p.numel() - s.length || s.group != p.group ||
        std::string(c10::toString(s.values.scalar_type())) != p.dtype) {
      zero_fail(source,
                "holds " + std::string(c10::toString(s.values.scalar_type())) + " elements [" +
                    std::to_string(s.offset) + ", " + std::to_string(s.offset + s.length) +
                    ") of '" + s.name + "' in group " + std::to_string(s.group) + "; the index " +
                    index_source + " lists it as " + p.dtype + " " +
                    c10::str(c10::IntArrayRef(p.shape)) + " in group " + std::to_string(p.group));
    }
  }
  for (const auto& entry : shard.group_scalars) {
    if (entry.first >= static_cast<int>(index.group_options.size())) {
      zero_fail(source, "holds optimizer state of parameter group " + std::to_string(entry.first) +
                            "; the index " + index_source + " has " +
                            std::to_string(index.group_options.size()) + " groups");
    }
  }
}

}  // namespace kolo::detail

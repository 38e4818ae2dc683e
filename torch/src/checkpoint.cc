// Checkpoints (kolo/torch/checkpoint.h).
#include "kolo/torch/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstring>
#include <mutex>

#include "archive_codec.h"
#include "common.h"
#include "kolo/core/errors.h"
#include "sharded_checkpoint.h"

namespace kolo {

// --- The file ---------------------------------------------------------------

void write_checkpoint_file(const std::string& path, const std::string& payload) {
  write_checked_file(path, kCheckpointFile, payload);
}

std::string read_checkpoint_file(const std::string& path) {
  return read_checked_file(path, kCheckpointFile);
}

// --- Generator state --------------------------------------------------------

std::string default_generator_state() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  const at::Tensor state = generator.get_state().contiguous();
  return std::string(static_cast<const char*>(state.data_ptr()),
                     static_cast<size_t>(state.numel()));
}

void set_default_generator_state(const std::string& state) {
  at::Tensor tensor = torch::empty({static_cast<int64_t>(state.size())}, torch::kByte);
  if (!state.empty()) std::memcpy(tensor.data_ptr(), state.data(), state.size());
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  try {
    generator.set_state(tensor);
  } catch (const std::exception& e) {
    throw ContractError("kolo::set_default_generator_state: torch rejected the state (" +
                        std::to_string(state.size()) + " bytes): " + detail::what_of(e));
  }
}

// --- The payload ------------------------------------------------------------

namespace {

using detail::bytes_tensor;
using detail::tensor_bytes;
using detail::what_of;

// 1: a libtorch archive, the training position under keys of its own;
// 2: the training position in the one schema (write_checkpoint_state);
// 3: the archive in kolo's own encoding (archive_codec.h): formats 1 and 2
//    are libtorch zip archives and no longer read (decode_archive says so).
constexpr int64_t kPayloadFormat = 3;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw ContractError("kolo checkpoint '" + source + "': " + what);
}

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key,
                 const std::string& source) {
  c10::IValue value;
  if (!archive.try_read(key, value) || !value.isInt()) {
    fail(source, "the payload has no integer '" + key + "'");
  }
  return value.toInt();
}

std::string read_string(torch::serialize::InputArchive& archive, const std::string& key,
                        const std::string& source) {
  c10::IValue value;
  if (!archive.try_read(key, value) || !value.isString()) {
    fail(source, "the payload has no string '" + key + "'");
  }
  return value.toStringRef();
}

std::string read_bytes(torch::serialize::InputArchive& archive, const std::string& key,
                       const std::string& source) {
  torch::Tensor t;
  if (!archive.try_read(key, t, /*is_buffer=*/true)) {
    fail(source, "the payload has no tensor '" + key + "'");
  }
  return tensor_bytes(t);
}

// That `archive` (what Module::save wrote for `module`) holds each of the
// module's parameters and buffers, recursively, with the module's dtype and
// shape: Module::load would otherwise reshape the module to whatever a
// damaged or forged file holds (the manifest is a separate entry).
void check_saved_tensors(const torch::nn::Module& module, torch::serialize::InputArchive& archive,
                         const std::string& prefix, const std::string& source) {
  auto check = [&](const std::string& name, const torch::Tensor& mine, bool buffer) {
    if (!mine.defined()) return;
    torch::Tensor saved;
    if (!archive.try_read(name, saved, buffer) || !saved.defined()) {
      fail(source, "the saved model has no tensor '" + prefix + name + "'");
    }
    if (saved.sizes() != mine.sizes() || saved.scalar_type() != mine.scalar_type()) {
      fail(source, "the saved tensor '" + prefix + name + "' is " +
                       c10::toString(saved.scalar_type()) + " " + c10::str(saved.sizes()) +
                       ", the model's " + c10::toString(mine.scalar_type()) + " " +
                       c10::str(mine.sizes()) + " (a damaged checkpoint)");
    }
  };
  for (const auto& p : module.named_parameters(/*recurse=*/false)) check(p.key(), p.value(), false);
  for (const auto& b : module.named_buffers(/*recurse=*/false)) check(b.key(), b.value(), true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;  // Module::save skips it too
    torch::serialize::InputArchive nested;
    if (!archive.try_read(child.key(), nested)) {
      fail(source, "the saved model has no module '" + prefix + child.key() + "'");
    }
    check_saved_tensors(*child.value(), nested, prefix + child.key() + ".", source);
  }
}

}  // namespace

std::string encode_checkpoint(const torch::nn::Module& model,
                              const torch::optim::Optimizer* optimizer,
                              const CheckpointState& state,
                              const std::vector<std::string>& rng_states) {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(kPayloadFormat));
  detail::write_checkpoint_state(archive, state);

  archive.write("model/manifest",
                c10::IValue(detail::tensor_manifest(detail::module_tensors(model))));
  torch::serialize::OutputArchive model_archive(archive.compilation_unit());
  model.save(model_archive);
  archive.write("model/tensors", model_archive);

  archive.write("optimizer/present", c10::IValue(static_cast<int64_t>(optimizer != nullptr)));
  if (optimizer != nullptr) {
    torch::serialize::OutputArchive optimizer_archive(archive.compilation_unit());
    detail::save_optimizer(*optimizer, optimizer_archive);
    archive.write("optimizer/state", optimizer_archive);
  }

  archive.write("rng/count", c10::IValue(static_cast<int64_t>(rng_states.size())));
  for (size_t r = 0; r < rng_states.size(); ++r) {
    archive.write("rng/" + std::to_string(r), bytes_tensor(rng_states[r]), /*is_buffer=*/true);
  }
  return detail::encode_archive(archive);
}

CheckpointState decode_checkpoint(const std::string& payload, torch::nn::Module& model,
                                  torch::optim::Optimizer* optimizer, const std::string& source,
                                  std::vector<std::string>* rng_states) {
  torch::serialize::InputArchive archive;
  try {
    detail::decode_archive(payload, archive);
  } catch (const std::exception& e) {
    fail(source, std::string("the payload is not a readable archive: ") + what_of(e));
  }
  const int64_t format = read_int(archive, "format", source);
  if (format != kPayloadFormat) {
    fail(source, "payload format " + std::to_string(format) +
                     " is not supported (this build reads " + std::to_string(kPayloadFormat) + ")");
  }
  const CheckpointState state = detail::read_checkpoint_state(
      archive, [&](const std::string& what) { fail(source, "the payload " + what); });

  // Check the whole structure before touching the model or the optimizer.
  const std::string saved = read_string(archive, "model/manifest", source);
  const std::string difference =
      detail::manifest_difference(saved, detail::tensor_manifest(detail::module_tensors(model)));
  if (!difference.empty()) {
    fail(source, "the checkpoint does not fit the model: " + difference);
  }
  const bool has_optimizer = read_int(archive, "optimizer/present", source) != 0;
  if (optimizer != nullptr && !has_optimizer) {
    fail(source,
         "the checkpoint holds no optimizer state (saved without an optimizer); pass "
         "nullptr for the optimizer to load only the model");
  }
  std::vector<std::string> rng;
  const int64_t rng_count = read_int(archive, "rng/count", source);
  for (int64_t r = 0; r < rng_count; ++r) {
    rng.push_back(read_bytes(archive, "rng/" + std::to_string(r), source));
  }

  try {
    torch::serialize::InputArchive model_archive;
    archive.read("model/tensors", model_archive);
    check_saved_tensors(model, model_archive, "", source);
    model.load(model_archive);
  } catch (const ContractError&) {
    throw;
  } catch (const std::exception& e) {
    fail(source, std::string("loading the model failed: ") + what_of(e));
  }
  if (optimizer != nullptr) {
    try {
      torch::serialize::InputArchive optimizer_archive;
      archive.read("optimizer/state", optimizer_archive);
      detail::load_optimizer(*optimizer, optimizer_archive, "kolo checkpoint '" + source + "'");
    } catch (const ContractError&) {
      throw;
    } catch (const std::exception& e) {
      fail(source, std::string("loading the optimizer failed: ") + what_of(e));
    }
  }
  if (rng_states) *rng_states = std::move(rng);
  return state;
}

// --- The training position ----------------------------------------------------

namespace detail {

void write_checkpoint_state(torch::serialize::OutputArchive& a, const CheckpointState& s) {
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
}

std::vector<std::string> gather_generator_states(const std::string& name,
                                                 const CallOptions& options) {
  return gather_bytes(default_generator_state(), name + ".rng", options);
}

std::vector<std::string> gather_bytes(const std::string& bytes, const std::string& name,
                                      const CallOptions& options) {
  TensorOpOptions t;
  static_cast<CallOptions&>(t) = options;
  TensorHandle handle = allgather_async(bytes_tensor(bytes), name, t);
  const torch::Tensor all = handle.wait(options.timeout);
  std::vector<std::string> states;
  const char* data = static_cast<const char*>(all.data_ptr());
  for (int64_t rows : handle.received_splits()) {
    states.emplace_back(data, static_cast<size_t>(rows));
    data += rows;
  }
  return states;
}

CheckpointState read_checkpoint_state(torch::serialize::InputArchive& a,
                                      const std::function<void(const std::string&)>& fail) {
  auto missing = [&](const std::string& what) {
    fail(what);
    throw ContractError(what);  // `fail` must throw; never carry on without the value
  };
  auto integer = [&](const std::string& key) {
    c10::IValue v;
    if (!a.try_read(key, v) || !v.isInt()) missing("has no integer '" + key + "'");
    return v.toInt();
  };
  CheckpointState s;
  s.epoch = integer("state/epoch");
  s.step = integer("state/step");
  s.seed = static_cast<uint64_t>(integer("state/seed"));
  s.sampler.epoch = integer("state/sampler_epoch");
  s.sampler.next_index = integer("state/sampler_next_index");
  const int64_t extras = integer("state/extras/count");
  // Past this bound the file is damaged; a loop over the count would only
  // produce a slower error.
  if (extras < 0 || extras > (int64_t{1} << 30)) {
    missing("'state/extras/count' is " + std::to_string(extras) + " (a damaged checkpoint)");
  }
  for (int64_t i = 0; i < extras; ++i) {
    const std::string k = "state/extras/" + std::to_string(i);
    c10::IValue key, value;
    if (!a.try_read(k + "/key", key) || !key.isString()) missing("has no string '" + k + "/key'");
    if (!a.try_read(k + "/value", value) || !value.isTensor()) {
      missing("has no tensor '" + k + "/value'");
    }
    s.extras[key.toStringRef()] = tensor_bytes(value.toTensor());
  }
  return s;
}

}  // namespace detail

// --- Collective save and load -----------------------------------------------

void save_checkpoint(const std::string& path, const torch::nn::Module& model,
                     const torch::optim::Optimizer* optimizer, const CheckpointState& state,
                     const CheckpointOptions& options) {
  Engine& engine = engine_of(options, "kolo::save_checkpoint");
  CallOptions o = options;
  o.engine = &engine;
  const detail::SetPosition position =
      detail::set_position(engine, options.process_set, "save_checkpoint");
  if (options.root < 0 || options.root >= position.size) {
    throw ContractError("kolo::save_checkpoint: root " + std::to_string(options.root) +
                        " is not a rank of the process set (size " + std::to_string(position.size) +
                        ")");
  }
  std::vector<std::string> rng_states;
  if (options.rng) rng_states = detail::gather_generator_states("save_checkpoint", o);
  std::string error;
  if (position.rank == options.root) {
    try {
      write_checkpoint_file(path, encode_checkpoint(model, optimizer, state, rng_states));
    } catch (const std::exception& e) {
      error = detail::what_of(e);
    }
  }
  detail::agree_on_outcome(error, "kolo::save_checkpoint", "save_checkpoint.check", o);
}

CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& model,
                                torch::optim::Optimizer* optimizer,
                                const CheckpointOptions& options) {
  Engine& engine = engine_of(options, "kolo::load_checkpoint");
  CallOptions o = options;
  o.engine = &engine;
  const detail::SetPosition position =
      detail::set_position(engine, options.process_set, "load_checkpoint");
  const std::string payload = detail::broadcast_from_root(
      [&] { return read_checkpoint_file(path); }, options.root, position, "load_checkpoint", o);
  CheckpointState state;
  std::string error;
  try {
    std::vector<std::string> rng_states;
    state = decode_checkpoint(payload, model, optimizer, path, &rng_states);
    if (options.rng && static_cast<int>(rng_states.size()) == position.size) {
      set_default_generator_state(rng_states[static_cast<size_t>(position.rank)]);
      state.rng_restored = true;
    }
  } catch (const std::exception& e) {
    error = detail::what_of(e);
  }
  detail::agree_on_outcome(error, "kolo::load_checkpoint", "load_checkpoint.check", o);
  return state;
}

}  // namespace kolo

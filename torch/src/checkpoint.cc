// Checkpoints (kolo/torch/checkpoint.h).
#include "kolo/torch/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstring>
#include <mutex>

#include "common.h"
#include "kolo/core/errors.h"

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

constexpr int64_t kPayloadFormat = 1;

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

}  // namespace

std::string encode_checkpoint(const torch::nn::Module& model,
                              const torch::optim::Optimizer* optimizer,
                              const CheckpointState& state,
                              const std::vector<std::string>& rng_states) {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(kPayloadFormat));
  archive.write("epoch", c10::IValue(state.epoch));
  archive.write("step", c10::IValue(state.step));
  archive.write("seed", c10::IValue(static_cast<int64_t>(state.seed)));
  archive.write("sampler/epoch", c10::IValue(state.sampler.epoch));
  archive.write("sampler/next_index", c10::IValue(state.sampler.next_index));

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

  archive.write("extras/count", c10::IValue(static_cast<int64_t>(state.extras.size())));
  size_t i = 0;
  for (const auto& [key, value] : state.extras) {
    const std::string prefix = "extras/" + std::to_string(i++);
    archive.write(prefix + "/key", bytes_tensor(key), /*is_buffer=*/true);
    archive.write(prefix + "/value", bytes_tensor(value), /*is_buffer=*/true);
  }
  return detail::archive_to_bytes(archive);
}

CheckpointState decode_checkpoint(const std::string& payload, torch::nn::Module& model,
                                  torch::optim::Optimizer* optimizer, const std::string& source,
                                  std::vector<std::string>* rng_states) {
  torch::serialize::InputArchive archive;
  try {
    detail::archive_from_bytes(payload, archive);
  } catch (const std::exception& e) {
    fail(source, std::string("the payload is not a readable archive: ") + what_of(e));
  }
  const int64_t format = read_int(archive, "format", source);
  if (format != kPayloadFormat) {
    fail(source, "payload format " + std::to_string(format) +
                     " is not supported (this build reads " + std::to_string(kPayloadFormat) + ")");
  }
  CheckpointState state;
  state.epoch = read_int(archive, "epoch", source);
  state.step = read_int(archive, "step", source);
  state.seed = static_cast<uint64_t>(read_int(archive, "seed", source));
  state.sampler.epoch = read_int(archive, "sampler/epoch", source);
  state.sampler.next_index = read_int(archive, "sampler/next_index", source);

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
  const int64_t extras = read_int(archive, "extras/count", source);
  for (int64_t i = 0; i < extras; ++i) {
    const std::string prefix = "extras/" + std::to_string(i);
    std::string key = read_bytes(archive, prefix + "/key", source);
    state.extras[key] = read_bytes(archive, prefix + "/value", source);
  }

  try {
    torch::serialize::InputArchive model_archive;
    archive.read("model/tensors", model_archive);
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

// --- Collective save and load -----------------------------------------------

void save_checkpoint(const std::string& path, const torch::nn::Module& model,
                     const torch::optim::Optimizer* optimizer, const CheckpointState& state,
                     const CheckpointOptions& options) {
  Engine& engine = engine_of(options);
  CallOptions o = options;
  o.engine = &engine;
  const detail::SetPosition position =
      detail::set_position(engine, options.process_set, "save_checkpoint", o);
  if (options.root < 0 || options.root >= position.size) {
    throw ContractError("kolo::save_checkpoint: root " + std::to_string(options.root) +
                        " is not a rank of the process set (size " + std::to_string(position.size) +
                        ")");
  }
  std::vector<std::string> rng_states;
  if (options.rng) {
    TensorOpOptions t;
    static_cast<CallOptions&>(t) = o;
    TensorHandle handle =
        allgather_async(bytes_tensor(default_generator_state()), "save_checkpoint.rng", t);
    const torch::Tensor all = handle.wait(options.timeout);
    const char* data = static_cast<const char*>(all.data_ptr());
    for (int64_t rows : handle.received_splits()) {
      rng_states.emplace_back(data, static_cast<size_t>(rows));
      data += rows;
    }
  }
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
  Engine& engine = engine_of(options);
  CallOptions o = options;
  o.engine = &engine;
  const detail::SetPosition position =
      detail::set_position(engine, options.process_set, "load_checkpoint", o);
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

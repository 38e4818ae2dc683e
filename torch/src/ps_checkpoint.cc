// A parameter server's shard on disk (ps_checkpoint.h).
#include "ps_checkpoint.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <filesystem>
#include <regex>
#include <set>

#include "kolo/core/errors.h"
#include "kolo/torch/checkpoint.h"

namespace kolo::ps::detail {
namespace {

// The shard's slices as a module's parameters "s0", "s1", ..., and its
// tables' tensors as buffers "t<t>_<name>", so that the checkpoint's payload
// code saves and checks them as any model's (they are the tensors
// themselves: loading writes into them).
struct ShardModule : torch::nn::Module {
  explicit ShardModule(const ShardTensors& tensors) {
    for (size_t i = 0; i < tensors.slices.size(); ++i) {
      register_parameter("s" + std::to_string(i), tensors.slices[i],
                         tensors.slices[i].requires_grad());
    }
    for (size_t t = 0; t < tensors.tables.size(); ++t) {
      for (const auto& [name, tensor] : tensors.tables[t].tensors) {
        register_buffer("t" + std::to_string(t) + "_" + name, tensor);
      }
    }
  }
};

std::string extra(const CheckpointState& state, const std::string& key, const std::string& path) {
  const auto it = state.extras.find(key);
  if (it == state.extras.end()) {
    throw ContractError("kolo::ps server checkpoint '" + path + "': it holds no '" + key +
                        "': not a parameter server's shard");
  }
  return it->second;
}

// The server counts whose shards `dir` holds ("ps-shard-<s>-of-<S>.kolo").
std::set<int> server_counts_in(const std::string& dir) {
  std::set<int> counts;
  const std::regex pattern(R"(ps-shard-[0-9]+-of-([0-9]+)\.kolo)");
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, pattern)) counts.insert(std::stoi(m[1].str()));
  }
  return counts;
}

}  // namespace

std::string shard_path(const std::string& dir, int server, int servers) {
  return dir + "/ps-shard-" + std::to_string(server) + "-of-" + std::to_string(servers) + ".kolo";
}

void save_shard(const std::string& dir, const ShardIdentity& who, int64_t step,
                const ShardTensors& tensors, const torch::optim::Optimizer& optimizer) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw ContractError("kolo::ps server " + std::to_string(who.server) +
                        ": cannot create the checkpoint directory '" + dir + "': " + ec.message());
  }
  CheckpointState state;
  state.step = step;
  state.extras["ps/server"] = std::to_string(who.server);
  state.extras["ps/servers"] = std::to_string(who.servers);
  state.extras["ps/fingerprint"] = std::to_string(who.fingerprint);
  state.extras["ps/mode"] = mode_name(who.mode);
  state.extras["ps/every"] = std::to_string(who.every);
  state.extras["ps/tables"] = std::to_string(tensors.tables.size());
  for (size_t t = 0; t < tensors.tables.size(); ++t) {
    state.extras["ps/table" + std::to_string(t)] = tensors.tables[t].identity;
  }
  const ShardModule module(tensors);
  write_checkpoint_file(shard_path(dir, who.server, who.servers),
                        encode_checkpoint(module, &optimizer, state));
}

void check_shard_exists(const std::string& dir, const ShardIdentity& who) {
  const std::string path = shard_path(dir, who.server, who.servers);
  if (!std::filesystem::exists(path)) {
    const std::set<int> counts = server_counts_in(dir);
    std::string message = "kolo::ps server " + std::to_string(who.server) + ": cannot resume: '" +
                          path + "' does not exist";
    if (!counts.empty() && counts.count(who.servers) == 0) {
      message += "; '" + dir + "' holds the shards of " + std::to_string(*counts.begin()) +
                 " server(s) and this job has " + std::to_string(who.servers) +
                 ": a server checkpoint resumes at the server count that saved it (kolorun "
                 "--servers " +
                 std::to_string(*counts.begin()) + ")";
    }
    throw ContractError(message);
  }
}

int64_t load_shard(const std::string& dir, const ShardIdentity& who, const ShardTensors& tensors,
                   torch::optim::Optimizer& optimizer) {
  check_shard_exists(dir, who);
  const std::string path = shard_path(dir, who.server, who.servers);
  const std::string file = read_checkpoint_file(path);
  const auto refuse = [&](const std::string& what) {
    throw ContractError("kolo::ps server checkpoint '" + path + "': " + what);
  };
  ShardModule module(tensors);
  CheckpointState state;
  try {
    // Checks the whole structure (a table more or less, or of another
    // size or optimizer, is a tensor the shard does not hold) before it
    // writes into any tensor.
    state = decode_checkpoint(file, module, &optimizer, path);
  } catch (const ContractError& e) {
    throw ContractError(std::string(e.what()) +
                        " (a server checkpoint holds the server's sparse tables too: add the "
                        "same tables, in the same order, as the job that saved it)");
  }
  const auto tables = state.extras.find("ps/tables");
  const std::string count = tables == state.extras.end() ? "0" : tables->second;
  if (count != std::to_string(tensors.tables.size())) {
    refuse("it holds " + count + " sparse table(s), this server has " +
           std::to_string(tensors.tables.size()) +
           "; add the same tables (Server::add_table) as the job that saved it");
  }
  for (size_t t = 0; t < tensors.tables.size(); ++t) {
    const std::string theirs = extra(state, "ps/table" + std::to_string(t), path);
    if (theirs != tensors.tables[t].identity) {
      refuse("its table " + std::to_string(t) + " is " + theirs + ", this server's " +
             tensors.tables[t].identity +
             "; add the same tables, in the same order, as the job that saved it");
    }
  }
  if (extra(state, "ps/servers", path) != std::to_string(who.servers) ||
      extra(state, "ps/server", path) != std::to_string(who.server)) {
    refuse("it is the shard of server " + extra(state, "ps/server", path) + " of " +
           extra(state, "ps/servers", path) + ", not of server " + std::to_string(who.server) +
           " of " + std::to_string(who.servers) + " (renamed?)");
  }
  if (extra(state, "ps/fingerprint", path) != std::to_string(who.fingerprint)) {
    refuse("it was saved for another model (parameter names, shapes or dtypes differ)");
  }
  // The period maps saved steps to epochs (WorkerOptimizer's checkpoints):
  // a job that saves again keeps it. (Shards of older kolo have none.)
  const auto every = state.extras.find("ps/every");
  if (who.every > 0 && every != state.extras.end() && every->second != "0" &&
      every->second != std::to_string(who.every)) {
    refuse("it was saved every " + every->second + " steps and this job saves every " +
           std::to_string(who.every) +
           " (PsOptions::checkpoint_every; with a step per batch, another worker count, batch "
           "size or data set changes the steps per epoch): resume with the settings that saved "
           "it, or save every " +
           every->second + " steps");
  }
  return state.step;
}

}  // namespace kolo::ps::detail

// A parameter server's shard on disk (ps_checkpoint.h).
#include "ps_checkpoint.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <filesystem>
#include <map>
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

// The shards in `dir` ("ps-shard-<s>-of-<S>-step-<N>.kolo"): for each server
// count S, for each step N, the servers s that have a shard of it.
using SavesByCount = std::map<int, std::map<int64_t, std::set<int>>>;

SavesByCount saves_in(const std::string& dir) {
  SavesByCount saves;
  const std::regex pattern(R"(ps-shard-([0-9]+)-of-([0-9]+)-step-([0-9]+)\.kolo)");
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, pattern)) continue;
    try {
      saves[std::stoi(m[2].str())][std::stoll(m[3].str())].insert(std::stoi(m[1].str()));
    } catch (const std::out_of_range&) {
      // Not a name kolo wrote (a number beyond int64): not one of its saves.
    }
  }
  return saves;
}

std::string steps_text(const std::map<int64_t, std::set<int>>& steps) {
  std::string text;
  for (const auto& [step, servers] : steps) {
    text += (text.empty() ? "" : ", ") + std::to_string(step) + " (server" +
            (servers.size() == 1 ? " " : "s ");
    std::string list;
    for (int s : servers) list += (list.empty() ? "" : ", ") + std::to_string(s);
    text += list + ")";
  }
  return text;
}

}  // namespace

std::string shard_path(const std::string& dir, int server, int servers, int64_t step) {
  return dir + "/ps-shard-" + std::to_string(server) + "-of-" + std::to_string(servers) + "-step-" +
         std::to_string(step) + ".kolo";
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
  write_checkpoint_file(shard_path(dir, who.server, who.servers, step),
                        encode_checkpoint(module, &optimizer, state));
  // Only now, with the new save on disk: this server's saves beyond its
  // newest kKeptSaves go. Best effort: a file that cannot be removed only
  // costs space, and must not fail a save that succeeded.
  std::vector<int64_t> mine;
  SavesByCount saves = saves_in(dir);
  for (const auto& [saved, servers] : saves[who.servers]) {
    if (servers.count(who.server) > 0) mine.push_back(saved);
  }
  for (size_t i = 0; i + kKeptSaves < mine.size(); ++i) {
    std::filesystem::remove(shard_path(dir, who.server, who.servers, mine[i]), ec);
  }
}

int64_t resume_step(const std::string& dir, const ShardIdentity& who) {
  const std::string me = "kolo::ps server " + std::to_string(who.server) + " of " +
                         std::to_string(who.servers) + ": cannot resume from '" + dir + "': ";
  SavesByCount saves = saves_in(dir);
  const std::map<int64_t, std::set<int>>& steps = saves[who.servers];
  int64_t newest_mine = -1;
  bool others = false;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const auto& [step, servers] = *it;
    if (static_cast<int>(servers.size()) == who.servers) return step;  // complete
    if (servers.count(who.server) > 0 && newest_mine < 0) newest_mine = step;
    if (servers.size() > servers.count(who.server)) others = true;
  }
  if (newest_mine >= 0 && !others) return newest_mine;  // a directory of its own
  if (newest_mine >= 0) {
    throw ContractError(me +
                        "no save in it is complete (every server's shard of one step); "
                        "it holds the saves at step " +
                        steps_text(steps) + ", of " + std::to_string(who.servers) +
                        " servers: a save is complete once every server wrote its shard");
  }
  std::string message = me + "it holds no shard of this server (ps-shard-" +
                        std::to_string(who.server) + "-of-" + std::to_string(who.servers) +
                        "-step-<step>.kolo)";
  saves.erase(who.servers);
  for (const auto& [count, counted] : saves) {
    if (counted.empty()) continue;
    message += "; it holds the shards of " + std::to_string(count) +
               " server(s) and this job has " + std::to_string(who.servers) +
               ": a server checkpoint resumes at the server count that saved it (kolorun "
               "--servers " +
               std::to_string(count) + ")";
    break;
  }
  throw ContractError(message);
}

int64_t load_shard(const std::string& dir, const ShardIdentity& who, const ShardTensors& tensors,
                   torch::optim::Optimizer& optimizer) {
  const int64_t step = resume_step(dir, who);
  const std::string path = shard_path(dir, who.server, who.servers, step);
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
  if (state.step != step) {
    refuse("it holds the save at step " + std::to_string(state.step) + " under the name of step " +
           std::to_string(step) + " (renamed?)");
  }
  // This server's newer shards belong to saves that never completed (the
  // run that failed). They go before this job saves anything (a worker
  // pushes only once every server has resumed), so that another server's
  // save of the same step is never completed by a shard of the failed run.
  // Best effort: resume_from may be read-only.
  std::error_code ec;
  SavesByCount saves = saves_in(dir);
  for (const auto& [saved, servers] : saves[who.servers]) {
    if (saved > step && servers.count(who.server) > 0) {
      std::filesystem::remove(shard_path(dir, who.server, who.servers, saved), ec);
    }
  }
  return step;
}

}  // namespace kolo::ps::detail

// An optimizer's full state in an archive (common.h: save_optimizer / load_optimizer).
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <string>
#include <typeinfo>

#include "common.h"
#include "kolo/core/errors.h"

namespace kolo::detail {

namespace {

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key,
                 const std::string& source) {
  c10::IValue value;
  if (!archive.try_read(key, value) || !value.isInt()) {
    throw ContractError(source + " has no '" + key + "' (not written by kolo's optimizer saver)");
  }
  return value.toInt();
}

}  // namespace

void save_optimizer(const torch::optim::Optimizer& optimizer,
                    torch::serialize::OutputArchive& archive) {
  archive.write("type", c10::IValue(std::string(typeid(optimizer).name())));
  torch::serialize::OutputArchive state(archive.compilation_unit());
  optimizer.save(state);
  archive.write("torch", state);
  const auto& groups = optimizer.param_groups();
  archive.write("groups/count", c10::IValue(static_cast<int64_t>(groups.size())));
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string key = "groups/" + std::to_string(i);
    archive.write(key + "/params", c10::IValue(static_cast<int64_t>(groups[i].params().size())));
    torch::serialize::OutputArchive options(archive.compilation_unit());
    groups[i].options().serialize(options);
    archive.write(key + "/options", options);
  }
}

void load_optimizer(torch::optim::Optimizer& optimizer, torch::serialize::InputArchive& archive,
                    const std::string& source) {
  c10::IValue type;
  if (!archive.try_read("type", type) || !type.isString()) {
    throw ContractError(source + " has no optimizer type (not written by kolo's optimizer saver)");
  }
  const std::string mine = typeid(optimizer).name();
  if (type.toStringRef() != mine) {
    throw ContractError(source + " is of type " + type.toStringRef() + ", this optimizer is " +
                        mine + "; use the same optimizer class on every rank and run");
  }
  auto& groups = optimizer.param_groups();
  const int64_t count = read_int(archive, "groups/count", source);
  if (count != static_cast<int64_t>(groups.size())) {
    throw ContractError(source + " has " + std::to_string(count) +
                        " parameter groups, this optimizer " + std::to_string(groups.size()));
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    const int64_t params = read_int(archive, "groups/" + std::to_string(i) + "/params", source);
    if (params != static_cast<int64_t>(groups[i].params().size())) {
      throw ContractError(source + ": parameter group " + std::to_string(i) + " has " +
                          std::to_string(params) + " parameters, this optimizer's " +
                          std::to_string(groups[i].params().size()));
    }
  }
  // State that only this optimizer had must not survive the load.
  optimizer.state().clear();
  torch::serialize::InputArchive state;
  archive.read("torch", state);
  optimizer.load(state);
  for (size_t i = 0; i < groups.size(); ++i) {
    torch::serialize::InputArchive options;
    archive.read("groups/" + std::to_string(i) + "/options", options);
    groups[i].options().serialize(options);
  }
}

}  // namespace kolo::detail

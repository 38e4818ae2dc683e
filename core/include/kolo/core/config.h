// Typed configuration registry.
//
// Every KOLO_* setting is declared exactly once in core/src/config_registry.cc
// (name, type, default, doc). Config reads them all once (at init) from the
// environment; a malformed value throws ContractError naming the variable, the
// value and the accepted form. docs/env_vars.md is generated from the registry
// (`kolorun --print-env-docs`) and a test checks that it is current.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

enum class ConfigType { kBool, kInt, kDouble, kString, kChoice };

struct ConfigVar {
  const char* name;  // "KOLO_BACKEND"
  ConfigType type;
  const char* default_value;  // as text; "" = unset
  const char* choices;        // kChoice only: "auto|shm|gloo|mpi"
  const char* doc;            // one sentence, shown in docs/env_vars.md
};

// All declared settings, in documentation order.
const std::vector<ConfigVar>& config_registry();

// Returns the environment value of a name, or nullopt. Injected for tests.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();
EnvLookup map_env(std::map<std::string, std::string> values);

class Config {
 public:
  // Reads and validates every registered variable once.
  static Config load(const EnvLookup& env);

  // Typed getters; throw ContractError for an undeclared name or wrong type.
  bool get_bool(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  double get_double(const std::string& name) const;
  std::string get_string(const std::string& name) const;  // kString and kChoice
  // True when the variable was set in the environment (not defaulted).
  bool is_set(const std::string& name) const;

  // Markdown table of the registry (the contents of docs/env_vars.md).
  static std::string markdown();

 private:
  std::map<std::string, std::string> values_;  // name -> validated text
  std::map<std::string, bool> set_;
};

}  // namespace kolo
#pragma GCC visibility pop

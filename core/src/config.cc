// PLACEHOLDER: replaced by the real implementation.
#include "kolo/core/config.h"
#include "kolo/core/errors.h"
namespace kolo {
EnvLookup process_env() { throw ContractError("not implemented yet"); }
EnvLookup map_env(std::map<std::string, std::string>) { throw ContractError("not implemented yet"); }
Config Config::load(const EnvLookup&) { throw ContractError("not implemented yet"); }
bool Config::get_bool(const std::string&) const { throw ContractError("not implemented yet"); }
int64_t Config::get_int(const std::string&) const { throw ContractError("not implemented yet"); }
double Config::get_double(const std::string&) const { throw ContractError("not implemented yet"); }
std::string Config::get_string(const std::string&) const { throw ContractError("not implemented yet"); }
bool Config::is_set(const std::string&) const { throw ContractError("not implemented yet"); }
std::string Config::markdown() { throw ContractError("not implemented yet"); }
}  // namespace kolo

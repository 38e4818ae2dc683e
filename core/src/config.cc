// Config: validates every registered KOLO_* variable once (config.h).
//
// Accepted forms: bool 1/0, true/false, yes/no, on/off (any case); int and
// double must be the whole string (no trailing text, no spaces); choice must be
// one of the listed values (any case, stored in the listed spelling). An empty
// value counts as unset. A range written in the doc as "(> N)" or "(>= N)" is
// enforced, so the documentation and the check cannot drift apart.
#include "kolo/core/config.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <regex>

#include "kolo/core/errors.h"
#include "log.h"

extern char** environ;

namespace kolo {
namespace {

// The functors behind process_env() and map_env(). Config::load recognises them
// (std::function::target) to list the KOLO_* names they hold, which an opaque
// lookup cannot do, and warns about unknown ones.
struct ProcessEnv {
  std::optional<std::string> operator()(const std::string& name) const {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  }
};

struct MapEnv {
  std::map<std::string, std::string> values;
  std::optional<std::string> operator()(const std::string& name) const {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  }
};

// Names of the variables `env` holds, when it can tell.
std::vector<std::string> listed_names(const EnvLookup& env) {
  std::vector<std::string> names;
  if (const auto* map = env.target<MapEnv>()) {
    for (const auto& entry : map->values) names.push_back(entry.first);
  } else if (env.target<ProcessEnv>() != nullptr) {
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      std::string text(*entry);
      names.push_back(text.substr(0, text.find('=')));
    }
  }
  return names;
}

const ConfigVar* find_var(const std::string& name) {
  for (const auto& var : config_registry()) {
    if (name == var.name) return &var;
  }
  return nullptr;
}

std::string lower(std::string text) {
  for (auto& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::vector<std::string> split_choices(const std::string& choices) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t bar = choices.find('|', start);
    out.push_back(choices.substr(start, bar - start));
    if (bar == std::string::npos) return out;
    start = bar + 1;
  }
}

// The range stated in the doc: "(> N)", "(>= N)", "(<= M)" or both, as in
// "(>= 0, <= 2147483647)". The upper bound keeps a value inside the type its
// reader converts it to (an int, milliseconds in an int64).
struct Bound {
  std::optional<std::pair<bool, double>> lower;  // (inclusive, value)
  std::optional<double> upper;                   // inclusive
  std::string text;                              // ">= 0, <= 2147483647"
};

std::optional<Bound> bound_of(const ConfigVar& var) {
  static const std::regex pattern(
      R"(\((?:(>=?) *(-?[0-9]+(?:\.[0-9]+)?))?(?:, *)?(?:<= *([0-9]+(?:\.[0-9]+)?))?\))");
  for (std::cregex_iterator it(var.doc, var.doc + std::strlen(var.doc), pattern), end; it != end;
       ++it) {
    const std::cmatch& match = *it;
    if (!match[1].matched && !match[3].matched) continue;  // "()" or other parentheses
    Bound bound;
    if (match[1].matched) {
      bound.lower =
          std::make_pair(match[1].str() == ">=", std::strtod(match[2].str().c_str(), nullptr));
      bound.text = match[1].str() + " " + match[2].str();
    }
    if (match[3].matched) {
      bound.upper = std::strtod(match[3].str().c_str(), nullptr);
      bound.text += (bound.text.empty() ? "" : ", ") + std::string("<= ") + match[3].str();
    }
    return bound;
  }
  return std::nullopt;
}

bool within(const std::optional<Bound>& bound, double value) {
  if (!bound) return true;
  if (bound->lower) {
    const auto [inclusive, low] = *bound->lower;
    if (inclusive ? value < low : value <= low) return false;
  }
  return !bound->upper || value <= *bound->upper;
}

// Unit of a numeric setting, from its name's suffix.
std::string unit_of(const std::string& name) {
  auto ends_with = [&](const char* suffix) {
    std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with("_SECONDS")) return "seconds";
  if (ends_with("_MS")) return "milliseconds";
  if (ends_with("_US")) return "microseconds";
  if (ends_with("_BYTES")) return "bytes";
  return "";
}

std::string expected_form(const ConfigVar& var) {
  std::string unit = unit_of(var.name);
  auto bound = bound_of(var);
  std::string range = bound ? " " + bound->text : "";
  switch (var.type) {
    case ConfigType::kBool:
      return "one of 1/0, true/false, yes/no, on/off";
    case ConfigType::kInt:
      return "a whole number" + (unit.empty() ? "" : " of " + unit) + range;
    case ConfigType::kDouble:
      return "a number" + (unit.empty() ? "" : " of " + unit) + range;
    case ConfigType::kString:
      return "any text";
    case ConfigType::kChoice: {
      std::string list;
      for (const auto& choice : split_choices(var.choices))
        list += (list.empty() ? "" : ", ") + choice;
      return "one of " + list;
    }
  }
  return "";
}

std::string example_value(const ConfigVar& var) {
  if (var.default_value[0] != '\0') return var.default_value;
  switch (var.type) {
    case ConfigType::kBool:
      return "1";
    case ConfigType::kChoice:
      return split_choices(var.choices).front();
    case ConfigType::kString:
      return "value";
    case ConfigType::kInt:
    case ConfigType::kDouble: {
      auto bound = bound_of(var);
      if (!bound || !bound->lower) return "1";
      const auto [inclusive, low] = *bound->lower;
      const double v = inclusive ? low : std::floor(low) + 1;
      return std::to_string(static_cast<long long>(v));
    }
  }
  return "";
}

[[noreturn]] void malformed(const ConfigVar& var, const std::string& value,
                            const std::string& problem) {
  throw ContractError(std::string("kolo config: ") + var.name + "=\"" + value + "\" " + problem +
                      "; expected " + expected_form(var) + ", e.g. " + var.name + "=" +
                      example_value(var));
}

// Checks `value` against `var` and returns its canonical text.
std::string validate(const ConfigVar& var, const std::string& value) {
  switch (var.type) {
    case ConfigType::kBool: {
      std::string v = lower(value);
      if (v == "1" || v == "true" || v == "yes" || v == "on") return "1";
      if (v == "0" || v == "false" || v == "no" || v == "off") return "0";
      malformed(var, value, "is not a boolean");
    }
    case ConfigType::kInt: {
      char* end = nullptr;
      errno = 0;
      long long parsed = std::strtoll(value.c_str(), &end, 10);
      if (std::isspace(static_cast<unsigned char>(value[0])) || *end != '\0') {
        malformed(var, value, "is not a whole number");
      }
      if (errno == ERANGE) malformed(var, value, "is too large");
      if (!within(bound_of(var), static_cast<double>(parsed))) {
        malformed(var, value, "is out of range");
      }
      return std::to_string(parsed);
    }
    case ConfigType::kDouble: {
      char* end = nullptr;
      errno = 0;
      double parsed = std::strtod(value.c_str(), &end);
      if (std::isspace(static_cast<unsigned char>(value[0])) || *end != '\0' ||
          !std::isfinite(parsed)) {
        malformed(var, value, "is not a number");
      }
      if (errno == ERANGE) malformed(var, value, "is out of range");
      if (!within(bound_of(var), parsed)) malformed(var, value, "is out of range");
      return value;
    }
    case ConfigType::kString:
      return value;
    case ConfigType::kChoice:
      for (const auto& choice : split_choices(var.choices)) {
        if (lower(value) == lower(choice)) return choice;
      }
      malformed(var, value, "is not a valid choice");
  }
  return value;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

void warn_unknown(const EnvLookup& env, const detail::Logger& logger) {
  for (const auto& name : listed_names(env)) {
    if (name.rfind("KOLO_", 0) != 0 || find_var(name) != nullptr) continue;
    const ConfigVar* nearest = nullptr;
    size_t best = 0;
    for (const auto& var : config_registry()) {
      size_t d = edit_distance(name, var.name);
      if (nearest == nullptr || d < best) {
        nearest = &var;
        best = d;
      }
    }
    std::string hint = best <= std::max<size_t>(2, name.size() / 4)
                           ? "did you mean " + std::string(nearest->name) + "?"
                           : "the closest known name is " + std::string(nearest->name);
    logger.warning("unknown variable " + name + " is ignored; " + hint +
                   " (all settings: docs/env_vars.md)");
  }
}

std::string escape_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

EnvLookup process_env() { return ProcessEnv{}; }

EnvLookup map_env(std::map<std::string, std::string> values) { return MapEnv{std::move(values)}; }

Config Config::load(const EnvLookup& env_or_null) {
  const EnvLookup env = env_or_null ? env_or_null : process_env();
  Config config;
  for (const auto& var : config_registry()) {
    std::optional<std::string> raw = env(var.name);
    bool set = raw.has_value() && !raw->empty();
    config.set_[var.name] = set;
    if (set) {
      config.values_[var.name] = validate(var, *raw);
    } else {
      config.values_[var.name] =
          var.default_value[0] != '\0' ? validate(var, var.default_value) : std::string();
    }
  }
  warn_unknown(env, detail::Logger::from_config(config));
  return config;
}

namespace {

const ConfigVar& checked_var(const std::string& name, const char* getter,
                             std::initializer_list<ConfigType> types) {
  const ConfigVar* var = find_var(name);
  if (var == nullptr) {
    throw ContractError("kolo config: " + std::string(getter) + "(\"" + name +
                        "\"): no such setting; declare it in core/src/config_registry.cc");
  }
  for (ConfigType type : types) {
    if (var->type == type) return *var;
  }
  throw ContractError("kolo config: " + std::string(getter) + "(\"" + name +
                      "\"): the setting has another type; it expects " + expected_form(*var));
}

}  // namespace

bool Config::get_bool(const std::string& name) const {
  checked_var(name, "get_bool", {ConfigType::kBool});
  return values_.at(name) == "1";
}

int64_t Config::get_int(const std::string& name) const {
  checked_var(name, "get_int", {ConfigType::kInt});
  const std::string& text = values_.at(name);
  if (text.empty()) {
    throw ContractError("kolo config: get_int(\"" + name +
                        "\"): the variable is not set and has no default; check is_set() first");
  }
  return std::strtoll(text.c_str(), nullptr, 10);
}

double Config::get_double(const std::string& name) const {
  checked_var(name, "get_double", {ConfigType::kDouble});
  const std::string& text = values_.at(name);
  if (text.empty()) {
    throw ContractError("kolo config: get_double(\"" + name +
                        "\"): the variable is not set and has no default; check is_set() first");
  }
  return std::strtod(text.c_str(), nullptr);
}

std::string Config::get_string(const std::string& name) const {
  checked_var(name, "get_string", {ConfigType::kString, ConfigType::kChoice});
  return values_.at(name);
}

bool Config::is_set(const std::string& name) const {
  checked_var(name, "is_set",
              {ConfigType::kBool, ConfigType::kInt, ConfigType::kDouble, ConfigType::kString,
               ConfigType::kChoice});
  return set_.at(name);
}

std::string Config::markdown() {
  std::string out =
      "# Environment variables\n"
      "\n"
      "<!-- Generated by kolo::Config::markdown() from core/src/config_registry.cc; do not edit "
      "by hand. -->\n"
      "This file is generated from the registry in `core/src/config_registry.cc`, and a unit "
      "test fails when it is out of date. To regenerate it, run "
      "`build/launcher/kolorun --print-env-docs > docs/env_vars.md` (or run the unit tests and "
      "copy `build/env_vars.md` over `docs/env_vars.md`).\n"
      "\n"
      "Every variable is read once, by `kolo::init()`. A malformed value is an error "
      "(`kolo::ContractError` naming the variable, the value and the accepted form), never a "
      "silent default. An empty value counts as unset. Booleans accept `1`/`0`, `true`/`false`, "
      "`yes`/`no`, `on`/`off` in any case; choices accept any case; numbers must be the whole "
      "value. A lower bound written as (> N) or (>= N) is enforced. An unknown `KOLO_*` variable "
      "is not an error: kolo prints a warning naming the closest known setting, since typos are "
      "common.\n"
      "\n"
      "| Variable | Type | Default | Meaning |\n"
      "|---|---|---|---|\n";
  for (const auto& var : config_registry()) {
    std::string type;
    switch (var.type) {
      case ConfigType::kBool:
        type = "bool";
        break;
      case ConfigType::kInt:
        type = "integer";
        break;
      case ConfigType::kDouble:
        type = "number";
        break;
      case ConfigType::kString:
        type = "string";
        break;
      case ConfigType::kChoice:
        for (const auto& choice : split_choices(var.choices)) {
          type += (type.empty() ? "`" : " \\| `") + choice + "`";
        }
        break;
    }
    std::string def =
        var.default_value[0] != '\0' ? "`" + std::string(var.default_value) + "`" : "unset";
    out += "| `" + std::string(var.name) + "` | " + type + " | " + def + " | " +
           escape_cell(var.doc) + " |\n";
  }
  return out;
}

}  // namespace kolo

// How a kolo-bench driver starts its own workers: the modes that run each
// configuration in fresh processes (zero, pipeline, scaling, elastic) find
// this binary and kolorun beside it, run a command and read the one-line
// JSON rows the workers print.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace kolo::bench {

// Path of the running kolo-bench (/proc/self/exe). `mode` names the mode in
// the RuntimeFault thrown when it cannot be read.
std::string self_path(const std::string& mode);

// `given` when not empty, else the build tree's launcher/kolorun next to this
// binary's directory (<build>/bench/kolo-bench -> <build>/launcher/kolorun).
std::string kolorun_path(const std::string& given, const std::string& mode);

// Runs `command` through the shell; its stdout and its wait status (0 = exit 0).
std::pair<std::string, int> run_command(const std::string& command, const std::string& mode);

// The JSON objects of `out` (one per line, after any prefix kolorun adds)
// that have the field `key`.
std::vector<nlohmann::json> json_rows(const std::string& out, const std::string& key);

}  // namespace kolo::bench

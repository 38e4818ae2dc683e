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

// The interpreter kolo was built for (KOLO_PYTHON): the default of the
// modes that run Python peers (PyTorch DDP, FSDP2, torch.distributed.pipelining).
#ifdef KOLO_BENCH_PYTHON
inline constexpr const char* kBenchPython = KOLO_BENCH_PYTHON;
#else
inline constexpr const char* kBenchPython = "python3";
#endif

// This source tree's bench/ folder, where the Python peers' workers live.
#ifdef KOLO_SOURCE_DIR
inline constexpr const char* kBenchSourceDir = KOLO_SOURCE_DIR "/bench";
#else
inline constexpr const char* kBenchSourceDir = "bench";
#endif

// Path of the running kolo-bench (/proc/self/exe). `mode` names the mode in
// the RuntimeFault thrown when it cannot be read.
std::string self_path(const std::string& mode);

// `given` when not empty, else the build tree's launcher/kolorun next to this
// binary's directory (<build>/bench/kolo-bench -> <build>/launcher/kolorun).
std::string kolorun_path(const std::string& given, const std::string& mode);

// Runs `command` through the shell; its stdout and its wait status (0 = exit 0).
std::pair<std::string, int> run_command(const std::string& command, const std::string& mode);

// Whether `python` (with PYTHONPATH=`python_path` when given) runs `code`
// with exit status 0, from "/" (the repository's torch/ directory would
// shadow the package): e.g. "import torch.distributed.fsdp".
bool python_runs(const std::string& python, const std::string& code,
                 const std::string& python_path = "");

// The argv that starts `nproc` workers on this host through the real
// torchrun of `python`'s torch (its module torch.distributed.run, which is
// what the torchrun script runs): a standalone rendezvous on a free port,
// then the worker's own arguments. Only for torch >= 2.4 (torchrun_works).
std::vector<std::string> torchrun_argv(const std::string& python, int nproc);

// Whether `python`'s torchrun can start workers here: torch >= 2.4 (an
// older torchrun, Debian's 1.13, fails under Python 3.11 in its agent).
bool torchrun_works(const std::string& python);

// The JSON objects of `out` (one per line, after any prefix kolorun adds)
// that have the field `key`.
std::vector<nlohmann::json> json_rows(const std::string& out, const std::string& key);

}  // namespace kolo::bench

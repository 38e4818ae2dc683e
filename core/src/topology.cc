// detect_topology(): rank, size and placement from the launcher's variables.
//
// Sources, first match wins: kolorun (KOLO_RANK/KOLO_SIZE), OpenMPI
// (OMPI_COMM_WORLD_*), MPICH/PMI (PMI_RANK/PMI_SIZE), Slurm (SLURM_PROCID/
// SLURM_NTASKS), torchrun (RANK/WORLD_SIZE). Whatever the source, the store
// address comes from KOLO_STORE_ADDR/KOLO_STORE_PORT when set, else from
// MASTER_ADDR/MASTER_PORT (rank 0 serves it), else there is none.
// Placement (local_*, cross_*) is known when the source gives it; a source that
// gives local_size == size implies a single host.
#include "kolo/core/topology.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "kolo/core/errors.h"

namespace kolo {
namespace {

// One integer field and the variable it came from (for messages).
struct Field {
  std::optional<int64_t> value;
  std::string name;
};

struct Found {
  std::string source;    // Topology::source
  std::string launcher;  // for messages: "set by OpenMPI's mpirun"
  Field rank, size, local_rank, local_size, cross_rank, cross_size;
  // kolorun always sets whole pairs (local_rank with local_size...), so half a
  // pair is an error; other launchers differ by version, so half a pair just
  // leaves the placement to be computed.
  bool strict_pairs = false;
};

class Env {
 public:
  explicit Env(const EnvLookup& env) : env_(env) {}

  // The value when set and non-empty (empty counts as unset, as in Config).
  std::optional<std::string> get(const std::string& name) const {
    auto value = env_(name);
    if (!value || value->empty()) return std::nullopt;
    return value;
  }
  bool has(const std::string& name) const { return get(name).has_value(); }

  // A whole decimal number, or nullopt when unset.
  Field integer(const std::string& name, const std::string& launcher) const {
    Field field{std::nullopt, name};
    auto text = get(name);
    if (!text) return field;
    char* end = nullptr;
    errno = 0;
    long long parsed = std::strtoll(text->c_str(), &end, 10);
    if (std::isspace(static_cast<unsigned char>((*text)[0])) || *end != '\0' || errno != 0) {
      throw ContractError("kolo init: " + name + "=\"" + *text + "\" is not a whole number (" +
                          launcher + "); fix or unset it");
    }
    field.value = parsed;
    return field;
  }

  // The first of `names` that is set, as an integer field.
  Field first_integer(std::initializer_list<const char*> names, const std::string& launcher) const {
    for (const char* name : names) {
      Field field = integer(name, launcher);
      if (field.value) return field;
    }
    return Field{std::nullopt, *names.begin()};
  }

 private:
  const EnvLookup& env_;
};

Field config_field(const Config& config, const char* name) {
  Field field{std::nullopt, name};
  if (config.is_set(name)) field.value = config.get_int(name);
  return field;
}

std::string shown(const Field& field) { return field.name + "=" + std::to_string(*field.value); }

// Slurm's task-count lists, e.g. "2(x3),1" = 2,2,2,1 tasks on nodes 0..3.
std::optional<int64_t> slurm_tasks_on_node(const std::string& list, int64_t node) {
  int64_t index = 0;
  size_t pos = 0;
  while (pos < list.size()) {
    size_t comma = list.find(',', pos);
    std::string item =
        list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    long long tasks = std::strtoll(item.c_str(), &end, 10);
    long long repeat = 1;
    if (end == item.c_str()) return std::nullopt;
    if (std::strncmp(end, "(x", 2) == 0) {
      repeat = std::strtoll(end + 2, &end, 10);
      if (*end != ')') return std::nullopt;
      ++end;
    }
    if (*end != '\0') return std::nullopt;
    if (node < index + repeat) return tasks;
    index += repeat;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return std::nullopt;
}

std::optional<Found> from_kolorun(const Config& config) {
  if (!config.is_set("KOLO_RANK") && !config.is_set("KOLO_SIZE")) return std::nullopt;
  Found f{"kolorun", "set by kolorun", {}, {}, {}, {}, {}, {}};
  f.rank = config_field(config, "KOLO_RANK");
  f.size = config_field(config, "KOLO_SIZE");
  f.local_rank = config_field(config, "KOLO_LOCAL_RANK");
  f.local_size = config_field(config, "KOLO_LOCAL_SIZE");
  f.cross_rank = config_field(config, "KOLO_CROSS_RANK");
  f.cross_size = config_field(config, "KOLO_CROSS_SIZE");
  f.strict_pairs = true;
  return f;
}

std::optional<Found> from_openmpi(const Env& env) {
  if (!env.has("OMPI_COMM_WORLD_RANK") && !env.has("OMPI_COMM_WORLD_SIZE")) return std::nullopt;
  Found f{"openmpi", "set by OpenMPI's mpirun", {}, {}, {}, {}, {}, {}};
  f.rank = env.integer("OMPI_COMM_WORLD_RANK", f.launcher);
  f.size = env.integer("OMPI_COMM_WORLD_SIZE", f.launcher);
  f.local_rank = env.integer("OMPI_COMM_WORLD_LOCAL_RANK", f.launcher);
  f.local_size = env.integer("OMPI_COMM_WORLD_LOCAL_SIZE", f.launcher);
  return f;
}

std::optional<Found> from_pmi(const Env& env) {
  if (!env.has("PMI_RANK") && !env.has("PMI_SIZE")) return std::nullopt;
  Found f{"pmi", "set by the MPICH/PMI launcher", {}, {}, {}, {}, {}, {}};
  f.rank = env.integer("PMI_RANK", f.launcher);
  f.size = env.integer("PMI_SIZE", f.launcher);
  f.local_rank = env.first_integer({"MPI_LOCALRANKID", "PMI_LOCAL_RANK"}, f.launcher);
  f.local_size = env.first_integer({"MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"}, f.launcher);
  return f;
}

std::optional<Found> from_slurm(const Env& env) {
  if (!env.has("SLURM_PROCID")) return std::nullopt;
  Found f{"slurm", "set by Slurm's srun", {}, {}, {}, {}, {}, {}};
  f.rank = env.integer("SLURM_PROCID", f.launcher);
  f.size = env.first_integer({"SLURM_NTASKS", "SLURM_NPROCS"}, f.launcher);
  f.local_rank = env.integer("SLURM_LOCALID", f.launcher);
  f.cross_rank = env.integer("SLURM_NODEID", f.launcher);
  f.cross_size = env.first_integer({"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}, f.launcher);
  // Tasks on this node, from the per-node list of the step (or of the job).
  const char* list_name =
      env.has("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  f.local_size = Field{std::nullopt, list_name};
  auto list = env.get(list_name);
  if (list && f.cross_rank.value) {
    f.local_size.value = slurm_tasks_on_node(*list, *f.cross_rank.value);
    if (!f.local_size.value) {
      throw ContractError(
          "kolo init: " + std::string(list_name) + "=\"" + *list +
          "\" has no entry for SLURM_NODEID=" + std::to_string(*f.cross_rank.value) + " (" +
          f.launcher + "); expected a list like 2(x3),1");
    }
  }
  return f;
}

std::optional<Found> from_torchrun(const Env& env) {
  if (!env.has("RANK") || !env.has("WORLD_SIZE")) return std::nullopt;
  Found f{"torchrun", "set by torchrun or by hand, torchrun-style", {}, {}, {}, {}, {}, {}};
  f.rank = env.integer("RANK", f.launcher);
  f.size = env.integer("WORLD_SIZE", f.launcher);
  f.local_rank = env.integer("LOCAL_RANK", f.launcher);
  f.local_size = env.integer("LOCAL_WORLD_SIZE", f.launcher);
  f.cross_rank = env.integer("GROUP_RANK", f.launcher);
  f.cross_size = env.integer("GROUP_WORLD_SIZE", f.launcher);
  // torchrun starts the same number of workers on every node.
  if (!f.cross_size.value && f.size.value && f.local_size.value && *f.local_size.value > 0 &&
      *f.size.value % *f.local_size.value == 0) {
    f.cross_size = Field{*f.size.value / *f.local_size.value, "LOCAL_WORLD_SIZE"};
  }
  return f;
}

// Checks the fields and fills rank/size/placement of `t`.
void fill(const Found& f, Topology& t) {
  auto fail = [&](const std::string& what) {
    throw ContractError("kolo init: " + what + " (" + f.launcher + "); fix the launch command");
  };
  if (!f.size.value) fail(f.rank.name + " is set but " + f.size.name + " is not");
  if (!f.rank.value) fail(f.size.name + " is set but " + f.rank.name + " is not");
  // A world has at most 2^24 ranks; the message names the whole range.
  if (*f.size.value < 1 || *f.size.value > (1 << 24)) {
    fail(shown(f.size) + " is not in [1, " + std::to_string(1 << 24) + "]");
  }
  if (*f.rank.value < 0 || *f.rank.value >= *f.size.value) {
    fail(shown(f.rank) + " is not in [0, " + shown(f.size) + ")");
  }
  t.source = f.source;
  t.rank = static_cast<int>(*f.rank.value);
  t.size = static_cast<int>(*f.size.value);

  // A pair is usable when both halves are given.
  auto pair = [&](const Field& index, const Field& count, int64_t max_count) {
    if (index.value.has_value() != count.value.has_value()) {
      const Field& given = index.value ? index : count;
      const Field& missing = index.value ? count : index;
      if (f.strict_pairs) fail(given.name + " is set but " + missing.name + " is not");
      return false;
    }
    if (!index.value) return false;
    if (*count.value < 1 || *count.value > max_count) {
      fail(shown(count) + " is not in [1, " + std::to_string(max_count) + "]");
    }
    if (*index.value < 0 || *index.value >= *count.value) {
      fail(shown(index) + " is not in [0, " + shown(count) + ")");
    }
    return true;
  };
  bool local = pair(f.local_rank, f.local_size, t.size);
  bool cross = pair(f.cross_rank, f.cross_size, t.size);
  if (local) {
    t.local_rank = static_cast<int>(*f.local_rank.value);
    t.local_size = static_cast<int>(*f.local_size.value);
  }
  if (cross) {
    t.cross_rank = static_cast<int>(*f.cross_rank.value);
    t.cross_size = static_cast<int>(*f.cross_size.value);
  }
  if (local && !cross && t.local_size == t.size) {
    t.cross_rank = 0;  // every rank is on this host
    t.cross_size = 1;
    cross = true;
  }
  t.placement_known = local && cross;
  if (!t.placement_known) {
    // Unknown until the runtime groups ranks by host name; keep safe values.
    t.local_rank = t.rank;
    t.local_size = t.size;
    t.cross_rank = 0;
    t.cross_size = 1;
  }
}

void fill_store_address(const Env& env, const Config& config, Topology& t) {
  bool has_addr = config.is_set("KOLO_STORE_ADDR");
  bool has_port = config.is_set("KOLO_STORE_PORT");
  auto check_port = [](const std::string& name, int64_t port) {
    if (port < 1 || port > 65535) {
      throw ContractError("kolo init: " + name + "=" + std::to_string(port) +
                          " is not a TCP port in [1, 65535]");
    }
    return static_cast<int>(port);
  };
  if (has_addr || has_port) {
    if (!has_addr || !has_port) {
      throw ContractError(std::string("kolo init: ") +
                          (has_addr ? "KOLO_STORE_ADDR is set but KOLO_STORE_PORT is not"
                                    : "KOLO_STORE_PORT is set but KOLO_STORE_ADDR is not") +
                          "; set both (kolorun does) or neither");
    }
    t.store_host = config.get_string("KOLO_STORE_ADDR");
    t.store_port = check_port("KOLO_STORE_PORT", config.get_int("KOLO_STORE_PORT"));
    t.serve_store = false;
    return;
  }
  // Only torchrun-style launches, or others that add MASTER_ADDR/MASTER_PORT
  // (e.g. an srun script), make rank 0 serve the store.
  bool has_master_addr = env.has("MASTER_ADDR");
  bool has_master_port = env.has("MASTER_PORT");
  if (t.source == "kolorun" || t.source == "none") return;
  if (!has_master_addr && !has_master_port) return;
  if (!has_master_addr || !has_master_port) {
    throw ContractError(std::string("kolo init: ") +
                        (has_master_addr ? "MASTER_ADDR is set but MASTER_PORT is not"
                                         : "MASTER_PORT is set but MASTER_ADDR is not") +
                        "; set both (the address and a free port of rank 0's host)");
  }
  Field port = env.integer("MASTER_PORT", "the torchrun-style store port");
  t.store_host = *env.get("MASTER_ADDR");
  t.store_port = check_port("MASTER_PORT", *port.value);
  t.serve_store = t.rank == 0;
}

// KOLO_STORE (auto|kolo|c10d) and torchrun's TORCHELASTIC_USE_AGENT_STORE:
// whether the store at store_host:store_port is a c10d TCPStore the launcher
// serves. Then no rank serves one (rank 0 would find the port taken).
void fill_store_kind(const Env& env, const Config& config, Topology& t) {
  const std::string kind = config.get_string("KOLO_STORE");
  const std::string agent = env.get("TORCHELASTIC_USE_AGENT_STORE").value_or("");
  const bool agent_store = agent == "True" || agent == "true" || agent == "1";
  if (kind == "kolo" || (kind == "auto" && (!agent_store || t.source == "kolorun"))) return;
  if (t.size == 1) return;  // a world of one needs no store
  if (t.source == "kolorun") {
    // kolorun serves kolo's own store there, never a c10d one: a c10d client
    // would retry against it for the whole timeout before failing.
    throw ContractError(
        "kolo init: KOLO_STORE=c10d asks to join a c10d TCPStore, but kolorun "
        "serves kolo's own store at " +
        t.store_host + ":" + std::to_string(t.store_port) +
        " (KOLO_STORE_ADDR, KOLO_STORE_PORT), which speaks another protocol: "
        "leave KOLO_STORE unset (or set it to kolo) under kolorun; KOLO_STORE=c10d "
        "is for torchrun's agent store at MASTER_ADDR:MASTER_PORT");
  }
  if (t.store_host.empty()) {
    throw ContractError(
        std::string("kolo init: ") +
        (kind == "c10d" ? "KOLO_STORE=c10d" : "TORCHELASTIC_USE_AGENT_STORE=" + agent) +
        " asks to join a c10d store that the launcher serves, but its address is not set: set "
        "MASTER_ADDR and MASTER_PORT (torchrun does), or KOLO_STORE=kolo for kolo's own store");
  }
  t.store_kind = "c10d";
  t.serve_store = false;
}

// Keeps characters that are safe in file and shared-memory names; long ids
// are shortened with a hash so that every rank derives the same name.
std::string sanitize_job_id(const std::string& raw) {
  std::string out;
  for (unsigned char c : raw) {
    out += (std::isalnum(c) || c == '-' || c == '_' || c == '.') ? static_cast<char>(c) : '_';
  }
  if (out.size() > 64) {
    uint64_t hash = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : raw) hash = (hash ^ c) * 1099511628211ull;
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
    out = out.substr(0, 40) + "-" + hex;
  }
  return out;
}

std::string derive_job_id(const Env& env, const Config& config, const Topology& t) {
  if (config.is_set("KOLO_JOB_ID")) return config.get_string("KOLO_JOB_ID");
  auto slurm_step = [&]() -> std::optional<std::string> {
    auto job = env.get("SLURM_JOB_ID");
    if (!job) job = env.get("SLURM_JOBID");
    if (!job) return std::nullopt;
    auto step = env.get("SLURM_STEP_ID");
    if (!step) step = env.get("SLURM_STEPID");
    return "slurm-" + *job + "." + step.value_or("0");
  };
  if (t.source == "openmpi") {
    for (const char* name : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"}) {
      if (auto id = env.get(name)) return "ompi-" + *id;
    }
    if (auto uri = env.get("OMPI_MCA_orte_hnp_uri"))
      return "ompi-" + uri->substr(0, uri->find(';'));
  }
  if (t.source == "pmi") {
    if (auto id = env.get("PMIX_NAMESPACE")) return "pmi-" + *id;
    if (auto id = slurm_step()) return *id;
  }
  if (t.source == "slurm") {
    if (auto id = slurm_step()) return *id;
  }
  if (!t.store_host.empty()) {
    // Unique while the job runs: its store holds this address.
    std::string id = t.source + "-" + t.store_host + "-" + std::to_string(t.store_port);
    auto run_id = env.get("TORCHELASTIC_RUN_ID");
    if (t.source == "torchrun" && run_id && *run_id != "none") id += "-" + *run_id;
    return id;
  }
  if (t.size == 1) return "single-" + std::to_string(getpid());
  // Last resort for multi-rank launchers without an id: ranks on one host are
  // children of the same launcher process (mpirun's daemon, hydra's proxy).
  return t.source + "-ppid" + std::to_string(getppid());
}

}  // namespace

Topology detect_topology(const EnvLookup& env_or_null, const Config& config) {
  const EnvLookup lookup = env_or_null ? env_or_null : process_env();
  Env env(lookup);
  std::optional<Found> found = from_kolorun(config);
  if (!found) found = from_openmpi(env);
  if (!found) found = from_pmi(env);
  if (!found) found = from_slurm(env);
  if (!found) found = from_torchrun(env);

  Topology t;
  if (found) {
    fill(*found, t);
  } else {
    t.placement_known = true;  // a world of one
  }
  fill_store_address(env, config, t);
  fill_store_kind(env, config, t);
  t.job_id = sanitize_job_id(derive_job_id(env, config, t));
  return t;
}

}  // namespace kolo

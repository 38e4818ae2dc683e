// Worker environment: bootstrap variables, thread counts, forwarding.
#include "worker_env.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <thread>

extern char** environ;

namespace kolo::launcher {

ParentEnv process_parent_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

const std::vector<std::string>& thread_variables() {
  static const std::vector<std::string> names = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                 "MKL_NUM_THREADS"};
  return names;
}

const std::vector<EnvVar>& allocator_variables() {
  static const std::vector<EnvVar> vars = {{"GLIBC_TUNABLES", "glibc.malloc.hugetlb=1"}};
  return vars;
}

const std::vector<std::pair<std::string, std::string>>& launcher_variables() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"KOLO_RANK", "each worker's rank"},
      {"KOLO_SIZE", "the number of workers"},
      {"KOLO_LOCAL_RANK", "each worker's index on its host"},
      {"KOLO_LOCAL_SIZE", "the number of workers on each host"},
      {"KOLO_CROSS_RANK", "each worker's host index"},
      {"KOLO_CROSS_SIZE", "the number of hosts"},
      {"KOLO_STORE_ADDR", "the address of kolorun's store (--store-addr changes it)"},
      {"KOLO_STORE_PORT", "the port of kolorun's store"},
      {"KOLO_JOB_ID", "the job's id"},
      {"KOLO_JOB_SECRET", "the elastic rendezvous's per-job secret"},
      {"KOLO_ELASTIC", "elastic mode (--min-np, --max-np, --host-discovery-script)"},
      {"KOLO_WORKER_ID", "each elastic worker's id"},
      {"KOLO_ELASTIC_HOST", "each elastic worker's host"},
      {"KOLO_ELASTIC_TIMEOUT_SECONDS", "the elastic join timeout (--elastic-timeout)"},
      {"KOLO_PS_REJOIN", "a restarted parameter-server worker's restart count (--restart-workers)"},
      {"HOROVOD_RANK", "KOLO_RANK under Horovod's name"},
      {"HOROVOD_SIZE", "KOLO_SIZE under Horovod's name"},
      {"HOROVOD_LOCAL_RANK", "KOLO_LOCAL_RANK under Horovod's name"},
      {"HOROVOD_LOCAL_SIZE", "KOLO_LOCAL_SIZE under Horovod's name"},
      {"HOROVOD_CROSS_RANK", "KOLO_CROSS_RANK under Horovod's name"},
      {"HOROVOD_CROSS_SIZE", "KOLO_CROSS_SIZE under Horovod's name"},
  };
  return names;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  unsigned hardware = std::thread::hardware_concurrency();
  return hardware > 0 ? static_cast<int>(hardware) : 1;
}

std::string make_job_id() {
  std::random_device device;
  char buffer[96];
  std::snprintf(buffer, sizeof(buffer), "%s-%d-%08x", this_hostname().substr(0, 32).c_str(),
                static_cast<int>(getpid()), static_cast<unsigned>(device()));
  std::string id = buffer;
  for (auto& c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
  }
  return id;
}

std::string format_seconds(double seconds) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.15g", seconds);
  return buffer;
}

std::vector<EnvVar> kolo_variables(const Placement& placement, const JobInfo& job) {
  std::vector<EnvVar> vars = {
      {"KOLO_RANK", std::to_string(placement.rank)},
      {"KOLO_SIZE", std::to_string(job.size)},
      {"KOLO_LOCAL_RANK", std::to_string(placement.local_rank)},
      {"KOLO_LOCAL_SIZE", std::to_string(placement.local_size)},
      {"KOLO_CROSS_RANK", std::to_string(placement.cross_rank)},
      {"KOLO_CROSS_SIZE", std::to_string(placement.cross_size)},
      {"KOLO_STORE_ADDR", job.store_addr},
      {"KOLO_STORE_PORT", std::to_string(job.store_port)},
      {"KOLO_JOB_ID", job.job_id},
  };
  // Horovod's names for the placement (horovodrun sets them; scripts and
  // Horovod's own tests read them), the same values.
  for (const char* name :
       {"RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE"}) {
    const std::string own = std::string("KOLO_") + name;
    for (size_t i = 0, n = vars.size(); i < n; ++i) {
      if (vars[i].first == own) vars.emplace_back(std::string("HOROVOD_") + name, vars[i].second);
    }
  }
  if (job.elastic) {
    // Placement comes from each round; only the rendezvous address stays.
    vars.erase(std::remove_if(vars.begin(), vars.end(),
                              [](const EnvVar& v) {
                                return v.first != "KOLO_STORE_ADDR" &&
                                       v.first != "KOLO_STORE_PORT" && v.first != "KOLO_JOB_ID";
                              }),
               vars.end());
  }
  if (!job.backend.empty()) vars.emplace_back("KOLO_BACKEND", job.backend);
  if (job.timeout_seconds) {
    vars.emplace_back("KOLO_TIMEOUT_SECONDS", format_seconds(*job.timeout_seconds));
  }
  vars.insert(vars.end(), job.extra.begin(), job.extra.end());
  return vars;
}

std::optional<std::string> chosen_thread_count(const ParentEnv& lookup) {
  for (const auto& name : thread_variables()) {
    if (auto value = lookup(name)) return value;
  }
  return std::nullopt;
}

std::vector<EnvVar> local_thread_variables(const Placement& placement, const JobInfo& job,
                                           const ParentEnv& parent) {
  const std::string threads = chosen_thread_count(parent).value_or(
      std::to_string(std::max(1, job.local_cores / std::max(1, placement.local_size))));
  std::vector<EnvVar> vars;
  for (const auto& name : thread_variables()) {
    if (!parent(name)) vars.emplace_back(name, threads);
  }
  return vars;
}

std::vector<std::string> local_worker_environment(const std::vector<std::string>& parent_environ,
                                                  const std::vector<EnvVar>& variables) {
  std::map<std::string, std::string> last;  // the winning value of each name
  for (const auto& [name, value] : variables) last[name] = value;
  std::vector<std::string> env;
  for (const auto& entry : parent_environ) {
    std::string name = entry.substr(0, entry.find('='));
    if (last.count(name) == 0) env.push_back(entry);
  }
  std::set<std::string> written;
  for (const auto& [name, value] : variables) {
    if (written.insert(name).second) env.push_back(name + "=" + last[name]);
  }
  return env;
}

std::vector<std::string> current_environ() {
  std::vector<std::string> env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    env.emplace_back(*entry);
  }
  return env;
}

std::vector<EnvVar> forwarded_variables(const std::vector<std::string>& parent_environ,
                                        const std::vector<std::string>& forward_env,
                                        const std::vector<EnvVar>& already_set) {
  std::map<std::string, std::string> parent;
  for (const auto& entry : parent_environ) {
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    parent[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  // The secret travels on ssh's stdin (JobInfo::secret), never forwarded.
  std::set<std::string> taken = {kSecretVariable};
  for (const auto& [name, value] : already_set) taken.insert(name);
  std::vector<EnvVar> vars;
  auto add = [&](const std::string& name, const std::string& value) {
    if (taken.insert(name).second) vars.emplace_back(name, value);
  };
  // Explicit -x entries first: they win over the automatic ones below.
  for (const auto& entry : forward_env) {
    size_t eq = entry.find('=');
    if (eq != std::string::npos) {
      add(entry.substr(0, eq), entry.substr(eq + 1));
    } else if (parent.count(entry) != 0) {
      add(entry, parent[entry]);
    }
  }
  for (const auto& [name, value] : parent) {
    if (name.rfind("KOLO_", 0) == 0) add(name, value);
  }
  for (const auto& name : thread_variables()) {
    if (parent.count(name) != 0) add(name, parent[name]);
  }
  for (const auto& [name, value] : allocator_variables()) {
    add(name, parent.count(name) != 0 ? parent[name] : value);
  }
  return vars;
}

}  // namespace kolo::launcher

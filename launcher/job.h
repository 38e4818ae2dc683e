// Planning a job: checking the command line against the hosts and the file
// system, and building each worker's spawn request (local or over ssh).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "hosts.h"
#include "options.h"
#include "spawn.h"
#include "worker_env.h"

namespace kolo::launcher {

struct JobPlan {
  std::vector<HostSlots> hosts;  // parsed -H (empty without -H)
  std::vector<Placement> placements;
  bool any_remote = false;
  std::string program_path;      // resolved locally ("" when every rank is remote)
  std::vector<std::string> ssh;  // ssh_command's words (remote jobs)
  std::string store_bind;        // "127.0.0.1", or "0.0.0.0" with remote hosts
  std::string store_addr;        // what workers connect to
};

struct PlanContext {
  std::string hostname;               // this_hostname()
  std::string path;                   // $PATH, for program lookup
  std::vector<std::string> compiled;  // kolo::compiled_backends()
  // The address of this host that workers on the given remote hosts reach
  // (kolo::reachable_address in kolorun); null = the host name.
  std::function<std::string(const std::vector<std::string>& remote_hosts)> reachable_address;
  // The most processes this host runs at once (host_process_limit()); 0 =
  // unknown, not checked.
  long process_limit = 0;
};

// Validates everything that can be checked before spawning: the host list,
// -np against the slots and this host's process limit, the backend against the build, and that the
// program (and ssh, for remote hosts) can be executed. Throws UsageError (one line).
JobPlan plan_job(const LaunchOptions& options, const PlanContext& context);

// How rank `placement.rank` is started. Local: the program with the parent
// environment plus kolorun's variables. Remote: ssh_command with the script of
// ssh_command.h, its stdin a pipe.
SpawnRequest worker_request(const JobPlan& plan, const LaunchOptions& options,
                            const Placement& placement, const JobInfo& job,
                            const std::vector<std::string>& parent_environ, const ParentEnv& parent,
                            const std::string& working_dir);

}  // namespace kolo::launcher

// Job planning (job.h).
#include "job.h"

#include <algorithm>
#include <sstream>

#include "ssh_command.h"
#include "usage_error.h"

namespace kolo::launcher {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

JobPlan plan_job(const LaunchOptions& options, const PlanContext& context) {
  JobPlan plan;
  if (!options.hosts.empty()) plan.hosts = parse_host_list(options.hosts);
  if (options.np && *options.np < 1) {
    throw UsageError("-np " + std::to_string(*options.np) +
                     ": the number of workers must be at least 1 (e.g. -np 2)");
  }
  plan.placements = assign_ranks(plan.hosts, options.np.value_or(0), context.hostname);

  if (!options.backend.empty() && std::find(context.compiled.begin(), context.compiled.end(),
                                            options.backend) == context.compiled.end()) {
    throw UsageError("--backend " + options.backend + ": this build of kolo has no " +
                     options.backend + " backend (it has: " + join(context.compiled) +
                     "; see kolorun --check-build)");
  }

  bool any_local = false;
  long local = 0;
  for (const auto& p : plan.placements) {
    plan.any_remote = plan.any_remote || !p.local;
    any_local = any_local || p.local;
    local += p.local ? 1 : 0;
  }
  // kolorun itself is one more process; the workers' threads count too, so
  // this catches only what can never start, before any worker is spawned.
  if (context.process_limit > 0 && local + 1 > context.process_limit) {
    throw UsageError(std::to_string(local) + " workers on this host (-np " +
                     std::to_string(plan.placements.size()) + "), but it runs at most " +
                     std::to_string(context.process_limit) +
                     " processes at once (the least of kernel.pid_max, kernel.threads-max and "
                     "ulimit -u): start fewer workers per host, or spread them with -H");
  }
  if (plan.any_remote && options.backend == "shm") {
    throw UsageError("--backend shm works within one host, but -H " + options.hosts +
                     " places ranks on other hosts: use --backend gloo (or leave --backend out)");
  }
  if (any_local) {
    plan.program_path = find_executable(options.program, context.path);
    if (plan.program_path.empty()) {
      throw UsageError("program '" + options.program + "' " + why_not_executable(options.program));
    }
  }
  if (plan.any_remote) {
    std::istringstream words(options.ssh_command);
    std::string word;
    while (words >> word) plan.ssh.push_back(word);
    if (options.backend != "mpi" && find_executable(plan.ssh.front(), context.path).empty()) {
      throw UsageError("--ssh-command '" + options.ssh_command + "': '" + plan.ssh.front() +
                       "' is not an executable in PATH; remote hosts need it (install "
                       "openssh-client or name another program)");
    }
    plan.store_bind = "0.0.0.0";
    plan.store_addr = options.store_addr;
    if (plan.store_addr.empty()) {
      std::vector<std::string> remote_hosts;
      for (const auto& p : plan.placements) {
        if (!p.local) remote_hosts.push_back(p.host);
      }
      plan.store_addr =
          context.reachable_address ? context.reachable_address(remote_hosts) : context.hostname;
    }
  } else {
    plan.store_bind = "127.0.0.1";
    plan.store_addr = "127.0.0.1";
  }
  return plan;
}

SpawnRequest worker_request(const JobPlan& plan, const LaunchOptions& options,
                            const Placement& placement, const JobInfo& job,
                            const std::vector<std::string>& parent_environ, const ParentEnv& parent,
                            const std::string& working_dir) {
  std::vector<EnvVar> vars = kolo_variables(placement, job);
  SpawnRequest request;
  if (placement.local) {
    if (!job.secret.empty()) vars.emplace_back(kSecretVariable, job.secret);
    for (const auto& entry : options.forward_env) {
      size_t eq = entry.find('=');
      if (eq != std::string::npos) vars.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
    }
    // Thread counts and allocator settings the parent (whose environment the
    // worker inherits) and -x (above) leave unset.
    auto defaults = local_thread_variables(placement, job, parent);
    for (const auto& var : allocator_variables()) {
      if (!parent(var.first)) defaults.push_back(var);
    }
    for (const auto& var : defaults) {
      bool given = std::any_of(vars.begin(), vars.end(),
                               [&](const EnvVar& v) { return v.first == var.first; });
      if (!given) vars.push_back(var);
    }
    request.path = plan.program_path;
    request.argv.push_back(options.program);
    request.argv.insert(request.argv.end(), options.program_args.begin(),
                        options.program_args.end());
    request.env = local_worker_environment(parent_environ, vars);
    return request;
  }

  RemoteWorker remote;
  remote.host = placement.host;
  remote.working_dir = working_dir;
  remote.variables = vars;
  auto forwarded = forwarded_variables(parent_environ, options.forward_env, vars);
  remote.variables.insert(remote.variables.end(), forwarded.begin(), forwarded.end());
  remote.threads_divisor = placement.local_size;
  remote.program = options.program;
  remote.args = options.program_args;
  remote.grace_seconds = options.grace_seconds;
  remote.secret_on_stdin = !job.secret.empty();
  request.argv = remote_command(options.ssh_command, remote);
  request.path = find_executable(request.argv.front(), parent("PATH").value_or(""));
  if (request.path.empty()) request.path = request.argv.front();
  request.env = parent_environ;
  request.stdin_pipe = true;
  if (remote.secret_on_stdin) request.stdin_data = job.secret + "\n";
  return request;
}

}  // namespace kolo::launcher

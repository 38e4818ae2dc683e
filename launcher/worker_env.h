// The variables kolorun gives each worker.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hosts.h"

namespace kolo::launcher {

using EnvVar = std::pair<std::string, std::string>;
// Reads one variable of kolorun's own environment (injected by tests).
using ParentEnv = std::function<std::optional<std::string>(const std::string&)>;
ParentEnv process_parent_env();

// The OpenMP / BLAS thread-count variables kolorun fills in (torchrun sets the first).
const std::vector<std::string>& thread_variables();
// The thread count the user chose: the value of the first of
// thread_variables() that `lookup` finds set; nullopt when none is. One
// setting wins: kolorun gives the variables the user left unset this value,
// not its own share of the cores (libtorch's BLAS obeys MKL_NUM_THREADS or
// OPENBLAS_NUM_THREADS before OMP_NUM_THREADS).
std::optional<std::string> chosen_thread_count(const ParentEnv& lookup);

// Allocator settings kolorun gives every worker (local, over ssh and through
// mpirun) unless kolorun's environment or a -x entry sets the variable:
// GLIBC_TUNABLES=glibc.malloc.hugetlb=1, glibc's (>= 2.35) advice for
// transparent huge pages on the blocks malloc maps and on its heap. Training
// frees and maps its large tensors again every step (glibc maps every block
// of 32 MiB or more afresh), and each 4 KiB page of them is faulted in again:
// with 2 MiB pages the MLP's step took 130 ms instead of 470 here
// (docs/kolorun.md). No effect where THP is "never"; set GLIBC_TUNABLES
// (even empty) in kolorun's environment to opt out.
const std::vector<EnvVar>& allocator_variables();

// The variables kolorun itself sets for each worker (placement, rendezvous,
// elastic mode), with what each one is: -x cannot override them.
const std::vector<std::pair<std::string, std::string>>& launcher_variables();

struct JobInfo {
  int size = 1;
  std::string store_addr;  // what workers connect to
  int store_port = 0;
  std::string job_id;
  std::string backend;                    // empty: KOLO_BACKEND not set (automatic)
  std::optional<double> timeout_seconds;  // KOLO_TIMEOUT_SECONDS when set
  int local_cores = 1;                    // cores kolorun may use on this host
  // Elastic mode: the rank and size variables are left out (each round of the
  // rendezvous gives them) and these follow the others (KOLO_ELASTIC,
  // KOLO_WORKER_ID, KOLO_ELASTIC_HOST...).
  bool elastic = false;
  std::vector<EnvVar> extra;
  // KOLO_JOB_SECRET: the key of the store's HMAC (hex; "" = unauthenticated
  // store). Never part of kolo_variables(), because those reach remote hosts
  // on the ssh command line, where every user's `ps` sees them: local workers
  // get it in their environment, remote ones on ssh's stdin (ssh_command.h).
  std::string secret;
};

// The name of the secret's variable, which forwarding never copies to a
// command line.
constexpr const char* kSecretVariable = "KOLO_JOB_SECRET";

// Cores this process may run on (its affinity mask), at least 1.
int usable_cores();

// A fresh job id, unique per run: "<hostname>-<pid>-<random hex>" (short; it
// names shared-memory segments).
std::string make_job_id();

// Formats seconds the way the workers' config reads them back ("60", "0.5").
std::string format_seconds(double seconds);

// The KOLO_* bootstrap variables of one worker, in a fixed order.
std::vector<EnvVar> kolo_variables(const Placement& placement, const JobInfo& job);

// Thread-count variables for a worker on this host, for each of
// thread_variables() that the parent environment does not set: the count the
// parent chose (chosen_thread_count) or else max(1, cores / local_size).
std::vector<EnvVar> local_thread_variables(const Placement& placement, const JobInfo& job,
                                           const ParentEnv& parent);

// The whole environment of a local worker as "NAME=VALUE" strings: the parent's
// environment with `variables` added or replaced. Each name appears once; of
// two entries of one name in `variables`, the later wins.
std::vector<std::string> local_worker_environment(const std::vector<std::string>& parent_environ,
                                                  const std::vector<EnvVar>& variables);

// kolorun's own environment as "NAME=VALUE" strings.
std::vector<std::string> current_environ();

// Variables forwarded to remote workers besides kolo_variables(): the parent's
// other KOLO_* settings (e.g. KOLO_LOG_LEVEL) but never KOLO_JOB_SECRET, the
// thread variables the user set, each -x NAME / -x NAME=VALUE, and the
// allocator variables (the parent's value, else kolorun's default). A -x NAME
// that is unset here is skipped.
std::vector<EnvVar> forwarded_variables(const std::vector<std::string>& parent_environ,
                                        const std::vector<std::string>& forward_env,
                                        const std::vector<EnvVar>& already_set);

}  // namespace kolo::launcher

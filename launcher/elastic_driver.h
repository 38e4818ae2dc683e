// kolorun's elastic mode: the driver that starts workers on the available
// slots, forms each world ("round") of the rendezvous, re-forms it when a
// member fails or new workers wait, sets failing hosts aside, and stops the job
// when too few workers remain (docs/elastic.md).
//
// States of the driver:
//   starting   workers spawned, waiting for them to join; the first round is
//              formed when every started worker joined (or --min-np of them
//              after --elastic-timeout); fewer than --min-np by then: stop.
//   training   a round is published; the driver watches exits, join requests
//              and (every --discovery-interval) the discovery script, and
//              starts workers on free slots of hosts that are not cooling down.
//   gathering  a member left the round with a fault (it did not die): the
//              round's other live members are awaited; those that do not come
//              back (a stalled worker) are evicted with SIGKILL, at once when
//              the others' faults name them, else after the workers' timeout;
//              each eviction is a failure (a restart, its host set aside).
//   re-forming a member failed (or reported a fault): if at least --min-np
//              workers are alive the next round is published at once (the
//              survivors first, in their old rank order, then the newcomers);
//              workers waiting to join also get a new round at once, which the
//              members take at their next commit.
//   short      fewer than --min-np workers: the driver keeps starting workers
//              on whatever discovery offers; if it still has too few after
//              --elastic-timeout it stops every worker and exits 1 with a
//              message saying how many were needed and how many were left.
//   finishing  a member exited 0: no more rounds or starts; workers that are
//              not members are stopped; the job ends when all have exited.
//   stopping   a failure beyond --max-restarts, too few workers, a signal or
//              --job-timeout: SIGTERM to every worker, SIGKILL after --grace.
//
// Worker ids (KOLO_WORKER_ID) count the workers started, from 0; output tags
// and --output-dir files use the worker id in place of the rank.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hosts.h"
#include "options.h"
#include "output.h"
#include "supervisor.h"
#include "worker_env.h"

namespace kolo {
class Store;
}

namespace kolo::launcher {

struct ElasticSetup {
  const LaunchOptions* options = nullptr;
  std::vector<HostSlots> hosts;  // -H, or "localhost:<np>" (unused with a discovery script)
  std::string this_hostname;
  std::string program_path;
  JobInfo job;  // store address and port, job id, backend, secret
  int signal_fd = -1;
  std::vector<std::string> parent_environ;
  std::string working_dir;
  // A member that does not come back to a failed round within this long is
  // evicted: the workers' collective timeout (KOLO_TIMEOUT_SECONDS).
  double eviction_timeout_seconds = 300;
};

// Checks the elastic options against each other and the host list; returns
// the error text ("" when fine).
std::string check_elastic_options(const LaunchOptions& options,
                                  const std::vector<HostSlots>& hosts);

class ElasticDriver {
 public:
  // `store`: a client of kolorun's own rendezvous store.
  ElasticDriver(ElasticSetup setup, OutputRouter& output, std::shared_ptr<Store> store);
  ~ElasticDriver();
  ElasticDriver(const ElasticDriver&) = delete;
  ElasticDriver& operator=(const ElasticDriver&) = delete;

  // Runs the job to its end; returns kolorun's exit code and final report.
  Outcome run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolo::launcher

// The elastic driver (elastic_driver.h): the worker pool's loop (output,
// signals, exits: worker_pool.h), woken every kTick to read the rendezvous
// store's join requests. The store keys are described in
// core/src/elastic/rendezvous.cc.
#include "elastic_driver.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>

#include "comm/shm_segment.h"  // process_alive
#include "elastic_hosts.h"
#include "job.h"
#include "kolo/core/store.h"
#include "spawn.h"
#include "ssh_command.h"

namespace kolo::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// How often the store is asked for join requests while nothing else happens.
constexpr auto kTick = std::chrono::milliseconds(10);
// Longest a discovery script may run.
constexpr auto kDiscoveryTimeout = std::chrono::seconds(10);

Clock::duration seconds_of(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string plural(int n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

}  // namespace

std::string check_elastic_options(const LaunchOptions& options,
                                  const std::vector<HostSlots>& hosts) {
  const int min_np = options.min_np.value_or(options.np.value_or(1));
  if (options.max_np && min_np > *options.max_np) {
    return "--min-np " + std::to_string(min_np) + " is more than --max-np " +
           std::to_string(*options.max_np);
  }
  if (options.host_discovery_script.empty()) {
    int slots = 0;
    for (const auto& h : hosts) slots += h.slots;
    if (hosts.empty()) slots = options.max_np.value_or(options.np.value_or(min_np));
    if (slots < min_np) {
      return "the hosts offer " + plural(slots, "slot") + " but --min-np is " +
             std::to_string(min_np) + ": give more slots in -H, or a --host-discovery-script";
    }
  }
  return "";
}

struct ElasticDriver::Impl {
  // kEvicted: SIGKILLed for not coming back to a failed round, not reaped
  // yet (it still holds its slot; it is in no round and waits for none).
  enum class Phase { kStarting, kWaiting, kMember, kEvicted, kExited };
  struct Worker {
    int64_t id = 0;
    std::string host;
    bool local = true;
    pid_t pid = -1;
    Phase phase = Phase::kStarting;
    bool member_when_exited = false;
    int status = 0;
    bool stop_sent = false;
    std::vector<int64_t> rounds;  // the rounds it was published in, oldest first
  };
  // The current round after a member left it with a fault (a join request
  // for a newer round, without dying): before the next round is formed, its
  // live members are gathered, and those that do not come back are evicted
  // (docs/elastic.md, "A member that stalls").
  struct Gathering {
    Clock::time_point since;
    std::string reason;          // the first member's report
    std::set<int64_t> rejoined;  // members that asked for a newer round
    std::set<int64_t> suspects;  // members a rejoined member's fault named
    int restarts_before = 0;
  };

  ElasticSetup setup;
  const LaunchOptions& options;
  OutputRouter& output;
  std::shared_ptr<Store> store;
  WorkerPool pool;

  int min_np = 1;
  int max_np = 1;  // 0 = as many as the hosts offer
  std::vector<HostSlots> hosts;
  HostCooldown cooldown;
  std::vector<Worker> workers;  // index = worker id
  int64_t round = 0;
  std::vector<int64_t> members;  // ids of the current round, by rank
  int64_t events_seen = 0;
  bool reform = false;
  std::string reform_reason;
  int restarts = 0;
  bool finishing = false;
  Clock::time_point start;
  std::optional<Clock::time_point> short_since;
  std::optional<Gathering> gathering;
  Clock::time_point next_discovery;
  bool discovery_failed_logged = false;

  bool stopping = false;
  int exit_code = 0;
  std::string report;

  Impl(ElasticSetup s, OutputRouter& out, std::shared_ptr<Store> st)
      : setup(std::move(s)),
        options(*setup.options),
        output(out),
        store(std::move(st)),
        pool(WorkerPoolOptions{setup.options->grace_seconds, setup.signal_fd}, out),
        cooldown(setup.options->cooldown_seconds) {
    pool.set_exit_callback(
        [this](const PoolWorker& p) { on_exit(workers[static_cast<size_t>(p.id)], p.status); });
    pool.set_signal_callback([this](int sig) { on_signal(sig); });
    min_np = options.min_np.value_or(options.np.value_or(1));
    max_np = options.max_np.value_or(options.np.value_or(0));
    hosts = setup.hosts;
    if (hosts.empty() && options.host_discovery_script.empty()) {
      hosts.push_back({"localhost", max_np > 0 ? max_np : min_np});
    }
    start = Clock::now();
    next_discovery = start;
  }

  void log(const std::string& line) { std::cerr << "kolorun: elastic: " << line << std::endl; }

  bool local_host(const std::string& name) const {
    return is_local_host(name, setup.this_hostname);
  }
  std::string machine_of(const std::string& host) const {
    return local_host(host) ? "local" : host;
  }
  bool alive(const Worker& w) const { return w.phase != Phase::kExited; }
  int live_count() const {
    int n = 0;
    for (const auto& w : workers) n += alive(w) ? 1 : 0;
    return n;
  }
  int live_on(const std::string& host) const {
    int n = 0;
    for (const auto& w : workers) n += alive(w) && w.host == host ? 1 : 0;
    return n;
  }
  std::string describe(const Worker& w) const {
    return "worker " + std::to_string(w.id) + " (pid " + std::to_string(w.pid) + " on " + w.host +
           ")";
  }

  // ---- starting workers ----

  void discover() {
    if (options.host_discovery_script.empty()) return;
    const auto now = Clock::now();
    if (now < next_discovery) return;
    next_discovery = now + seconds_of(options.discovery_interval_seconds);
    try {
      std::vector<HostSlots> found =
          run_discovery_script(options.host_discovery_script, kDiscoveryTimeout);
      if (options.verbose) {
        std::string line = "discovery:";
        for (const auto& h : found) line += " " + h.name + ":" + std::to_string(h.slots);
        log(line);
      }
      hosts = std::move(found);
      discovery_failed_logged = false;
    } catch (const std::exception& e) {
      // Keep the last good list: a flaky script must not take the job down.
      if (!discovery_failed_logged) {
        log("host discovery script " + options.host_discovery_script + " failed (" + e.what() +
            "); keeping the last host list");
      }
      discovery_failed_logged = true;
    }
  }

  int local_slots() const {
    int n = 0;
    for (const auto& h : hosts) n += local_host(h.name) ? h.slots : 0;
    if (max_np > 0) n = std::min(n, max_np);
    return std::max(1, n);
  }

  void spawn_on(const std::string& host) {
    Worker w;
    w.id = static_cast<int64_t>(workers.size());
    w.host = host;
    w.local = local_host(host);
    Placement p;
    p.rank = static_cast<int>(w.id);
    p.host = host;
    p.local = w.local;
    p.local_size = w.local ? local_slots() : 1;
    JobInfo job = setup.job;
    job.elastic = true;
    job.extra.push_back({"KOLO_WORKER_ID", std::to_string(w.id)});
    job.extra.push_back({"KOLO_ELASTIC_HOST", host});
    JobPlan plan;
    plan.program_path = setup.program_path;
    SpawnRequest request = worker_request(plan, options, p, job, setup.parent_environ,
                                          process_parent_env(), setup.working_dir);
    output.grow(static_cast<int>(w.id) + 1);
    if (options.verbose) log("starting worker " + std::to_string(w.id) + " on " + host);
    SpawnedProcess process;
    try {
      process = spawn_process(request);
    } catch (const std::system_error& e) {
      w.phase = Phase::kExited;
      workers.push_back(w);
      const double s = cooldown.record_failure(host, Clock::now());
      log("cannot start worker " + std::to_string(w.id) + " on " + host + ": " + e.what() +
          "; host " + host + " set aside for " + format_seconds(s) + " s");
      return;
    }
    w.pid = process.pid;
    workers.push_back(w);
    pool.add(static_cast<int>(w.id), host, !w.local, process);
  }

  // Starts workers on free slots of available hosts, up to max_np alive.
  void fill_slots() {
    if (stopping || finishing) return;
    const auto now = Clock::now();
    for (const auto& h : hosts) {
      if (!cooldown.available(h.name, now)) continue;
      int free = h.slots - live_on(h.name);
      while (free > 0 && (max_np == 0 || live_count() < max_np)) {
        spawn_on(h.name);
        --free;
      }
    }
  }

  // ---- the rendezvous ----

  void read_join_requests() {
    int64_t events = 0;
    try {
      events = store->add("elastic/events", 0);
    } catch (const std::exception& e) {
      stop(1, "kolorun: elastic: lost its own rendezvous store: " + std::string(e.what()));
      return;
    }
    if (events == events_seen) return;
    events_seen = events;
    for (auto& w : workers) {
      if (!alive(w)) continue;
      const std::string key = "elastic/join/" + std::to_string(w.id);
      if (!store->check({key})) continue;
      const std::string text = to_string(store->get(key, std::chrono::milliseconds(0)));
      store->erase(key);
      std::istringstream in(text);
      int64_t after = 0;
      in >> after;
      std::string reason, suspects;
      std::getline(in, reason);
      std::getline(in, reason);
      std::getline(in, suspects);
      if (w.phase == Phase::kStarting) {
        w.phase = Phase::kWaiting;
        if (options.verbose) log(describe(w) + " is ready to join");
      } else if (w.phase == Phase::kMember) {
        std::vector<int64_t> named;
        std::istringstream ids(suspects);
        for (std::string id; std::getline(ids, id, ',');) {
          try {
            named.push_back(std::stoll(id));
          } catch (const std::exception&) {
            // not a worker id: no suspect
          }
        }
        // A member of the current round left it without a death kolorun saw:
        // a fault (a timeout, a lost connection, a stalled peer). So did one
        // that left an older round naming a member of the current one (the
        // current round was published, e.g. to grow, while that member
        // stalled): the current round cannot form either. Gather its live
        // members before re-forming (decide()).
        const bool current = after >= round;
        const bool names_member = std::any_of(named.begin(), named.end(), [&](int64_t id) {
          return id != w.id && id >= 0 && id < static_cast<int64_t>(workers.size()) &&
                 workers[static_cast<size_t>(id)].phase == Phase::kMember;
        });
        if (!current && !names_member) continue;  // a round kolorun has already left behind
        const std::string why =
            describe(w) + " left round " + std::to_string(current ? round : after) + ": " + reason;
        if (!gathering) {
          gathering = Gathering{Clock::now(), why, {}, {}, restarts};
          if (options.verbose) log(why);
        }
        if (current) gathering->rejoined.insert(w.id);
        gathering->suspects.insert(named.begin(), named.end());
        mark_failed(w, why);
      }
    }
  }

  // Tells the members of every round `w` was published in that kolorun gave
  // up on it (elastic/failed/<round>, see core/src/elastic/round_store.h):
  // a member still building such a round's communicators (or its engine's)
  // stops waiting for `w` and rejoins at once instead of after its
  // --timeout. Older rounds count too: a growth round may have been
  // published while the members were still building the one before.
  void mark_failed(Worker& w, const std::string& why) {
    for (int64_t r : w.rounds) {
      try {
        store->set("elastic/failed/" + std::to_string(r), to_bytes(why));
      } catch (const std::exception&) {
        return;  // a lost store is reported by read_join_requests on the next tick
      }
    }
    w.rounds.clear();  // marked once
  }

  void publish(const std::vector<int64_t>& ids, const std::string& why) {
    ++round;
    std::string text =
        "kolo-round " + std::to_string(round) + " " + std::to_string(ids.size()) + "\n";
    for (int64_t id : ids) {
      const Worker& w = workers[static_cast<size_t>(id)];
      text += std::to_string(id) + " " + machine_of(w.host) + " " + w.host + "\n";
    }
    store->set("elastic/round/" + std::to_string(round), to_bytes(text));
    store->set("elastic/latest", to_bytes(std::to_string(round)));
    for (int64_t id : members) {
      Worker& w = workers[static_cast<size_t>(id)];
      if (w.phase == Phase::kMember) w.phase = Phase::kWaiting;
    }
    members = ids;
    for (int64_t id : ids) {
      workers[static_cast<size_t>(id)].phase = Phase::kMember;
      workers[static_cast<size_t>(id)].rounds.push_back(round);
    }
    std::string list;
    for (int64_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
    log("round " + std::to_string(round) + ": " + plural(static_cast<int>(ids.size()), "worker") +
        " (ids " + list + ")" + (why.empty() ? "" : "; " + why));
    reform = false;
    reform_reason.clear();
    short_since.reset();
    gathering.reset();
  }

  // A local worker whose process has died (a zombie, see process_alive) but
  // that the pool has not reaped yet.
  bool dying(const Worker& w) const {
    return alive(w) && w.local && !kolo::detail::process_alive(w.pid, 0);
  }

  // Members of the failed round that have neither rejoined nor been lost.
  std::vector<int64_t> not_rejoined() const {
    std::vector<int64_t> ids;
    for (int64_t id : members) {
      const Worker& w = workers[static_cast<size_t>(id)];
      if (w.phase == Phase::kMember && gathering->rejoined.count(id) == 0) ids.push_back(id);
    }
    return ids;
  }

  // Ends the gathering when every live member came back, or evicts those that
  // did not: at once when each of them was named by a rejoined member's fault
  // (and is not merely dying), otherwise once the workers' timeout has passed
  // since the round failed. Returns true when the re-form may go ahead.
  bool gathered(Clock::time_point now) {
    const std::vector<int64_t> missing = not_rejoined();
    if (!missing.empty()) {
      bool all_suspected = true;
      for (int64_t id : missing) {
        const Worker& w = workers[static_cast<size_t>(id)];
        all_suspected = all_suspected && gathering->suspects.count(id) != 0 && !dying(w);
      }
      const bool timed_out = now - gathering->since >= seconds_of(setup.eviction_timeout_seconds);
      if (!all_suspected && !timed_out) return false;
      for (int64_t id : missing) {
        evict(workers[static_cast<size_t>(id)],
              all_suspected ? "named by the others' fault"
                            : "not back within " + format_seconds(setup.eviction_timeout_seconds) +
                                  " s (the workers' timeout)");
        if (stopping) return false;
      }
    }
    if (restarts == gathering->restarts_before) {
      // Everybody came back: a fault with no worker lost still re-forms the world.
      ++restarts;
      if (restarts > options.max_restarts) {
        stop(1, "kolorun: elastic: " + gathering->reason + "; the world was already re-formed " +
                    plural(options.max_restarts, "time") + " after failures (--max-restarts " +
                    std::to_string(options.max_restarts) + ")");
        return false;
      }
      log(gathering->reason + " (restart " + std::to_string(restarts) + " of " +
          std::to_string(options.max_restarts) + "; every member came back)");
    }
    if (!reform) reform_reason = gathering->reason;
    reform = true;
    return true;
  }

  // SIGKILLs a member that did not come back to a failed round: it counts as
  // a failed worker (a restart; its host is set aside), as a dead one does.
  void evict(Worker& w, const std::string& why) {
    w.phase = Phase::kEvicted;
    w.stop_sent = true;  // its exit is not a second failure
    pool.kill(static_cast<int>(w.id));
    ++restarts;
    const double set_aside = cooldown.record_failure(w.host, Clock::now());
    const std::string what = describe(w) + " did not take part in round " + std::to_string(round) +
                             " after it failed (" + gathering->reason + "): " + why +
                             "; evicted (SIGKILL)";
    mark_failed(w, what);
    if (restarts > options.max_restarts) {
      stop(1, "kolorun: elastic: " + what + "; the world was already re-formed " +
                  plural(options.max_restarts, "time") + " after failures (--max-restarts " +
                  std::to_string(options.max_restarts) + ")");
      return;
    }
    log(what + " (restart " + std::to_string(restarts) + " of " +
        std::to_string(options.max_restarts) + "); host " + w.host + " set aside for " +
        format_seconds(set_aside) + " s (failure " + std::to_string(cooldown.failures(w.host)) +
        ")");
    if (!reform) reform_reason = describe(w) + " evicted";
    reform = true;
  }

  // The next round's members: live members in their rank order, then the
  // workers waiting to join by id; at most max_np.
  std::vector<int64_t> candidates() const {
    std::vector<int64_t> ids;
    for (int64_t id : members) {
      const Worker& w = workers[static_cast<size_t>(id)];
      if (w.phase == Phase::kMember) ids.push_back(id);
    }
    for (const auto& w : workers) {
      if (w.phase == Phase::kWaiting && std::find(ids.begin(), ids.end(), w.id) == ids.end()) {
        ids.push_back(w.id);
      }
    }
    if (max_np > 0 && static_cast<int>(ids.size()) > max_np) ids.resize(max_np);
    return ids;
  }

  bool any_waiting() const {
    for (const auto& w : workers) {
      if (w.phase == Phase::kWaiting) return true;
    }
    return false;
  }

  void decide() {
    if (stopping) return;
    const auto now = Clock::now();
    if (finishing) {
      for (auto& w : workers) {
        if (alive(w) && w.phase != Phase::kMember && !w.stop_sent) stop_worker(w, SIGTERM);
      }
      return;
    }
    if (round == 0) {
      int waiting = 0, starting = 0;
      for (const auto& w : workers) {
        waiting += w.phase == Phase::kWaiting ? 1 : 0;
        starting += w.phase == Phase::kStarting ? 1 : 0;
      }
      const bool timed_out = now - start >= seconds_of(options.elastic_timeout_seconds);
      if (waiting >= min_np && (starting == 0 || timed_out)) {
        publish(candidates(), "");
      } else if (timed_out) {
        stop(1, "kolorun: elastic: only " + plural(waiting, "worker") + " of the " +
                    std::to_string(min_np) + " needed (--min-np) joined within --elastic-timeout " +
                    format_seconds(options.elastic_timeout_seconds) +
                    " s; check the hosts and the discovery script (kolorun -v shows them)");
      }
      return;
    }
    // A member reported a fault: wait for the others (a member that died and
    // is still a zombie is reaped within milliseconds; one that stalls is
    // evicted) rather than publish a round with a lost member in it.
    if (gathering && !gathered(now)) return;
    if (!reform && !any_waiting()) return;
    const std::vector<int64_t> next = candidates();
    const bool grows = !reform && next.size() > members.size();
    if (!reform && !grows) return;  // waiting workers but no room (max_np)
    if (static_cast<int>(next.size()) >= min_np) {
      publish(next, reform ? reform_reason : "workers joining");
      return;
    }
    if (!short_since) {
      short_since = now;
      log(plural(static_cast<int>(next.size()), "worker") + " left, " + std::to_string(min_np) +
          " needed (--min-np); waiting up to " + format_seconds(options.elastic_timeout_seconds) +
          " s (--elastic-timeout) for more slots");
    }
    if (now - *short_since >= seconds_of(options.elastic_timeout_seconds)) {
      stop(1, "kolorun: elastic: too few workers to continue: " + std::to_string(min_np) +
                  " needed (--min-np " + std::to_string(min_np) + "), " +
                  std::to_string(next.size()) + " left after " + reform_reason +
                  "; no more slots appeared within --elastic-timeout " +
                  format_seconds(options.elastic_timeout_seconds) + " s");
    }
  }

  // ---- exits ----

  void on_exit(Worker& w, int status) {
    const bool was_member = w.phase == Phase::kMember;
    w.phase = Phase::kExited;
    w.member_when_exited = was_member;
    w.status = status;
    if (stopping) return;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (finishing) {
      if (was_member && !ok) {
        stop(exit_code_of(status), "kolorun: elastic: " + describe(w) + " " +
                                       describe_status(status) + " after training had finished " +
                                       "on another worker");
      }
      return;
    }
    if (was_member && ok) {
      finishing = true;  // training is over; the other members follow
      return;
    }
    if (w.stop_sent) return;
    const auto now = Clock::now();
    const double set_aside = cooldown.record_failure(w.host, now);
    const std::string aside = "host " + w.host + " set aside for " + format_seconds(set_aside) +
                              " s (failure " + std::to_string(cooldown.failures(w.host)) + ")";
    if (!was_member) {
      log(describe(w) + " " + describe_status(status) + " before joining; " + aside);
      // Before the first round, when every worker started so far failed
      // before joining (a program that cannot start: a missing module, a
      // crash at import), the job fails once their count passes the
      // restart budget instead of restarting them until --elastic-timeout.
      // A host whose workers fail beside workers that start is only set
      // aside (above).
      const bool all_failed = std::all_of(workers.begin(), workers.end(), [](const Worker& x) {
        return x.phase == Phase::kExited && !x.member_when_exited;
      });
      if (round == 0 && all_failed && static_cast<int>(workers.size()) > options.max_restarts) {
        stop(exit_code_of(status),
             "kolorun: elastic: every worker failed before joining (" +
                 plural(static_cast<int>(workers.size()), "start") + ", more than --max-restarts " +
                 std::to_string(options.max_restarts) + "), the last: " + describe(w) + " " +
                 describe_status(status) +
                 "; the program fails before kolo's rendezvous (see its output above)");
      }
      return;
    }
    ++restarts;
    const std::string what = describe(w) + " " + describe_status(status);
    mark_failed(w, what);
    if (restarts > options.max_restarts) {
      stop(exit_code_of(status),
           "kolorun: elastic: " + what + "; the world was already re-formed " +
               plural(options.max_restarts, "time") + " after failures (--max-restarts " +
               std::to_string(options.max_restarts) + ")");
      return;
    }
    log(what + " (restart " + std::to_string(restarts) + " of " +
        std::to_string(options.max_restarts) + "); " + aside);
    reform = true;
    reform_reason = what;
  }

  static int exit_code_of(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status) == 0 ? 1 : WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
  }

  // ---- stopping ----

  void stop(int code, const std::string& why) {
    if (stopping) return;
    stopping = true;
    exit_code = code;
    report = why;
    for (auto& w : workers) stop_worker(w, SIGTERM);
  }

  // SIGTERM now, SIGKILL after --grace (worker_pool.h).
  void stop_worker(Worker& w, int signal_number) {
    if (!alive(w)) return;
    pool.stop(static_cast<int>(w.id), signal_number);
    w.stop_sent = true;
  }

  void on_signal(int sig) {
    if (stopping) {
      pool.kill_all();  // a second signal: no more grace
      return;
    }
    stop(128 + sig, "kolorun: received " + signal_name(sig) + "; stopped " +
                        plural(live_count(), "running worker"));
  }

  void step() {
    if (options.job_timeout_seconds && !stopping &&
        Clock::now() - start >= seconds_of(*options.job_timeout_seconds)) {
      stop(124, "kolorun: the job ran longer than --job-timeout " +
                    format_seconds(*options.job_timeout_seconds) + " s; stopped " +
                    plural(live_count(), "running worker"));
    }
    pool.step(kTick);
  }

  Outcome run() {
    if (!options.host_discovery_script.empty()) {
      discover();
      if (hosts.empty()) {
        log("the discovery script offered no hosts yet; waiting up to " +
            format_seconds(options.elastic_timeout_seconds) + " s");
      }
    }
    fill_slots();
    while (!((stopping || finishing) && live_count() == 0)) {
      step();
      if (!stopping) {
        discover();
        fill_slots();
        read_join_requests();
        pool.step(Clock::duration::zero());  // exits that happened meanwhile
        decide();
      }
      if (!stopping && !finishing && round == 0 && live_count() == 0 &&
          Clock::now() - start >= seconds_of(options.elastic_timeout_seconds)) {
        stop(1, "kolorun: elastic: no worker could be started within --elastic-timeout " +
                    format_seconds(options.elastic_timeout_seconds) + " s");
      }
    }
    pool.finish();
    Outcome outcome;
    outcome.exit_code = exit_code;
    outcome.report = report;
    return outcome;
  }
};

ElasticDriver::ElasticDriver(ElasticSetup setup, OutputRouter& output, std::shared_ptr<Store> store)
    : impl_(std::make_unique<Impl>(std::move(setup), output, std::move(store))) {}

ElasticDriver::~ElasticDriver() = default;

Outcome ElasticDriver::run() { return impl_->run(); }

}  // namespace kolo::launcher

// kolo::elastic::init and run: the worker's path over rounds (elastic.h,
// docs/elastic.md).
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "elastic/round_store.h"
#include "elastic/state_access.h"
#include "kolo/core/elastic.h"
#include "log.h"

namespace kolo::elastic {
namespace {

// The process environment with this round's placement in place of the
// KOLO_RANK... that kolorun does not give elastic workers.
EnvLookup round_env(const EnvLookup& base, const Membership& m) {
  std::map<std::string, std::string> overrides = {
      {"KOLO_RANK", std::to_string(m.rank)},
      {"KOLO_SIZE", std::to_string(m.size)},
      {"KOLO_LOCAL_RANK", std::to_string(m.local_rank)},
      {"KOLO_LOCAL_SIZE", std::to_string(m.local_size)},
      {"KOLO_CROSS_RANK", std::to_string(m.cross_rank)},
      {"KOLO_CROSS_SIZE", std::to_string(m.cross_size)},
  };
  return [base, overrides](const std::string& name) -> std::optional<std::string> {
    auto it = overrides.find(name);
    if (it != overrides.end()) return it->second;
    return base(name);
  };
}

// One elastic worker's way through the rounds kolorun publishes.
class Worker {
 public:
  explicit Worker(const EnvLookup& env)
      : env_(env),
        rendezvous_(Rendezvous::from_env(env)),
        logger_(detail::Logger::from_config(Config::load(env))) {}

  // Joins the next round that contains this worker and initialises the
  // default runtime for it. A fault on the way (a member lost before its
  // init, kolorun giving up on the round) leaves the round and joins the
  // next; a ContractError propagates.
  void enter(const RunOptions& options) {
    for (;;) {
      const Membership m = rendezvous_.join(round_, reason_, suspects_);
      suspects_.clear();
      membership_ = m;
      round_ = m.round;
      logger_.info("elastic: worker " + std::to_string(rendezvous_.options().worker_id) +
                   " is rank " + std::to_string(m.rank) + " of " + std::to_string(m.size) +
                   " in round " + std::to_string(m.round));
      try {
        if (options.on_join) options.on_join(m);
        InitOptions init_options = options.init;
        init_options.env = round_env(env_, m);
        init_options.store_prefix = "elastic/round" + std::to_string(m.round) + "/init";
        if (m.size > 1) {
          // Its own connection, whose waits end when kolorun gives up on the
          // round (a member died before building its communicators).
          const Rendezvous::Options& r = rendezvous_.options();
          auto store = std::make_shared<RoundStore>(
              connect_tcp_store(r.store_host, r.store_port, r.timeout, r.secret), m.round);
          init_options.store = store;
          init_options.rendezvous_check = [store] {
            store->throw_if_failed("for the other members to map the shared segment");
          };
        }
        init(init_options);
        return;
      } catch (const RuntimeFault& e) {
        leave(std::string("fault: ") + e.what(), &e);
      }
    }
  }

  // Shuts the default runtime down; the next enter() says why, and passes
  // on the ranks `fault` named as worker ids, so that kolorun can evict a
  // member that stalls instead of waiting for it.
  void leave(const std::string& reason, const RuntimeFault* fault = nullptr) {
    reason_ = reason;
    if (fault != nullptr) {
      const Membership& m = membership_;
      for (int r : fault->failed_ranks()) {
        if (r >= 0 && r < m.size && r != m.rank) suspects_.push_back(m.worker_ids[r]);
      }
    }
    logger_.info("elastic: leaving round " + std::to_string(round_) + " (" + reason_ + ")");
    shutdown();
  }

  Rendezvous& rendezvous() { return rendezvous_; }
  int64_t round() const { return round_; }

 private:
  EnvLookup env_;
  Rendezvous rendezvous_;
  detail::Logger logger_;
  Membership membership_;  // of the round entered last
  int64_t round_ = 0;
  std::string reason_ = "starting";
  std::vector<int64_t> suspects_;  // worker ids the last fault named
};

// The worker that elastic::init() made, until run() takes it over. It
// belongs with the default runtime it initialised (runtime.h), the one piece
// of process state kolo has.
struct Pending {
  std::mutex mutex;
  std::unique_ptr<Worker> worker;
};

Pending& pending() {
  static Pending instance;
  return instance;
}

}  // namespace

void init(const RunOptions& options) {
  const EnvLookup env = options.init.env ? options.init.env : process_env();
  if (!Rendezvous::enabled(env)) {
    kolo::init(options.init);
    return;
  }
  if (is_initialized()) {
    throw ContractError(
        "kolo::elastic::init: the default runtime is already initialised; call "
        "kolo::shutdown() first");
  }
  Pending& p = pending();
  std::lock_guard<std::mutex> lock(p.mutex);
  // A worker left from an earlier init() keeps its place in the rounds.
  if (!p.worker) p.worker = std::make_unique<Worker>(env);
  p.worker->enter(options);
}

void run(State& state, const std::function<void()>& train, const RunOptions& options) {
  const EnvLookup env = options.init.env ? options.init.env : process_env();
  if (!Rendezvous::enabled(env)) {
    if (!is_initialized()) kolo::init(options.init);
    train();
    return;
  }
  std::unique_ptr<Worker> worker;
  {
    Pending& p = pending();
    std::lock_guard<std::mutex> lock(p.mutex);
    worker = std::move(p.worker);
  }
  if (is_initialized() && !worker) {
    throw ContractError(
        "kolo::elastic::run: the default runtime is already initialised by kolo::init(); in "
        "elastic mode run() initialises it for every world it joins: remove the kolo::init() "
        "before run(), or call kolo::elastic::init() instead");
  }
  if (!worker) worker = std::make_unique<Worker>(env);
  bool was_member = false;
  for (;;) {
    // The first round may be the one elastic::init() entered.
    if (!is_initialized()) worker->enter(options);
    std::string reason;
    std::optional<RuntimeFault> fault;
    try {
      detail::ElasticStateAccess::attach(state, &worker->rendezvous(), worker->round());
      // Back to the last commit (survivors; a newcomer has none), then
      // everyone takes rank 0's, which kolorun makes the oldest member.
      state.restore();
      state.sync(0);
      // In every world after the job's first, on every member: newcomers
      // received rank 0's state as it was before its callbacks ran, so
      // world-dependent settings (a learning rate scaled by size()) are
      // derived alike everywhere.
      if (was_member || worker->round() > 1) detail::ElasticStateAccess::run_reset_callbacks(state);
      was_member = true;
      train();
      detail::ElasticStateAccess::attach(state, nullptr, 0);
      return;
    } catch (const MembershipChanged& e) {
      reason = std::string("membership change: ") + e.what();
    } catch (const ContractError&) {
      detail::ElasticStateAccess::attach(state, nullptr, 0);
      throw;  // a bug, not a fault: retrying would fail the same way
    } catch (const RuntimeFault& e) {
      reason = std::string("fault: ") + e.what();
      fault = e;
    }
    detail::ElasticStateAccess::attach(state, nullptr, 0);
    worker->leave(reason, fault ? &*fault : nullptr);
  }
}

}  // namespace kolo::elastic

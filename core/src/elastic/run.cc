// kolo::elastic::run: the worker's loop over rounds (elastic.h, docs/elastic.md).
#include <map>

#include "elastic/round_store.h"
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

}  // namespace

void run(State& state, const std::function<void()>& train, const RunOptions& options) {
  const EnvLookup env = options.init.env ? options.init.env : process_env();
  if (!Rendezvous::enabled(env)) {
    if (!is_initialized()) init(options.init);
    train();
    return;
  }
  if (is_initialized()) {
    throw ContractError(
        "kolo::elastic::run: the default runtime is already initialised; in elastic mode run() "
        "initialises it for every world it joins, so remove the kolo::init() before run()");
  }
  Rendezvous rendezvous(Rendezvous::from_env(env));
  const detail::Logger logger = detail::Logger::from_config(Config::load(env));
  int64_t round = 0;
  bool was_member = false;
  std::string reason = "starting";
  std::vector<int64_t> suspects;
  for (;;) {
    const Membership m = rendezvous.join(round, reason, suspects);
    suspects.clear();
    round = m.round;
    logger.info("elastic: worker " + std::to_string(rendezvous.options().worker_id) + " is rank " +
                std::to_string(m.rank) + " of " + std::to_string(m.size) + " in round " +
                std::to_string(m.round));
    try {
      if (options.on_join) options.on_join(m);
      InitOptions init_options = options.init;
      init_options.env = round_env(env, m);
      init_options.store_prefix = "elastic/round" + std::to_string(m.round) + "/init";
      if (m.size > 1) {
        // Its own connection, whose waits end when kolorun gives up on the
        // round (a member died before building its communicators).
        const Rendezvous::Options& r = rendezvous.options();
        auto store = std::make_shared<RoundStore>(
            connect_tcp_store(r.store_host, r.store_port, r.timeout, r.secret), m.round);
        init_options.store = store;
        init_options.rendezvous_check = [store] {
          store->throw_if_failed("for the other members to map the shared segment");
        };
      }
      init(init_options);
      state.attach(&rendezvous, m.round);
      // Back to the last commit (survivors; a newcomer has none), then
      // everyone takes rank 0's, which kolorun makes the oldest member.
      state.restore();
      state.sync(0);
      if (was_member) state.run_reset_callbacks();
      was_member = true;
      train();
      state.attach(nullptr, 0);
      return;
    } catch (const MembershipChanged& e) {
      reason = std::string("membership change: ") + e.what();
    } catch (const ContractError&) {
      state.attach(nullptr, 0);
      throw;  // a bug, not a fault: retrying would fail the same way
    } catch (const RuntimeFault& e) {
      reason = std::string("fault: ") + e.what();
      // The ranks the fault named, as worker ids, so that kolorun can evict a
      // member that stalls instead of waiting for it.
      for (int r : e.failed_ranks()) {
        if (r >= 0 && r < m.size && r != m.rank) suspects.push_back(m.worker_ids[r]);
      }
    }
    state.attach(nullptr, 0);
    logger.info("elastic: leaving round " + std::to_string(round) + " (" + reason + ")");
    shutdown();
  }
}

}  // namespace kolo::elastic

// Worker side of kolorun's elastic rendezvous (elastic.h).
//
// Store keys (kolorun's launcher/elastic_driver.cc is the other side):
//   elastic/join/<worker id>  set by a worker: "<after round>\n<reason>\n
//                             <suspects>" (worker ids its fault named, comma-
//                             separated, possibly none); it waits for a round
//                             newer than <after round>
//   elastic/events            counter a worker bumps after setting its join
//                             key, so that kolorun reads one key per poll
//   elastic/round/<g>         set by kolorun, never changed afterwards:
//                               "kolo-round <g> <size>\n" then one line per
//                               rank: "<worker id> <machine> <host>\n"
//                             (<machine> names the physical machine: several
//                             local host aliases are one machine)
//   elastic/latest            set by kolorun after each round: "<g>"
//   elastic/failed/<g>        set by kolorun when a member of round <g> died
//                             or left it (the reason as value): members still
//                             waiting in the store for round <g>'s
//                             communicators give up (round_store.h)
#include <algorithm>
#include <map>
#include <sstream>

#include "kolo/core/elastic.h"
#include "log.h"

namespace kolo::elastic {
namespace {

using std::chrono::milliseconds;

std::string round_key(int64_t round) { return "elastic/round/" + std::to_string(round); }

struct RoundText {
  int64_t round = 0;
  struct Entry {
    int64_t worker_id;
    std::string machine;
    std::string host;
  };
  std::vector<Entry> entries;
};

RoundText parse_round(const std::string& text) {
  std::istringstream in(text);
  std::string magic;
  RoundText out;
  size_t size = 0;
  if (!(in >> magic >> out.round >> size) || magic != "kolo-round" || size == 0 || size > 1000000) {
    throw RuntimeFault("kolo elastic: malformed round from kolorun: '" + text.substr(0, 80) + "'");
  }
  for (size_t i = 0; i < size; ++i) {
    RoundText::Entry e;
    if (!(in >> e.worker_id >> e.machine >> e.host)) {
      throw RuntimeFault("kolo elastic: round " + std::to_string(out.round) + " lists " +
                         std::to_string(size) + " workers but has only " + std::to_string(i));
    }
    out.entries.push_back(e);
  }
  return out;
}

}  // namespace

bool Membership::contains(const std::string& text, int64_t worker_id) {
  RoundText r = parse_round(text);
  return std::any_of(r.entries.begin(), r.entries.end(),
                     [&](const RoundText::Entry& e) { return e.worker_id == worker_id; });
}

Membership Membership::parse(const std::string& text, int64_t worker_id) {
  RoundText r = parse_round(text);
  Membership m;
  m.round = r.round;
  m.size = static_cast<int>(r.entries.size());
  m.rank = -1;
  for (int i = 0; i < m.size; ++i) {
    m.worker_ids.push_back(r.entries[i].worker_id);
    m.hosts.push_back(r.entries[i].host);
    if (r.entries[i].worker_id == worker_id) m.rank = i;
  }
  if (m.rank < 0) {
    throw ContractError("kolo elastic: worker " + std::to_string(worker_id) +
                        " is not a member of round " + std::to_string(m.round));
  }
  // Machines numbered in the order of their lowest rank, as the runtime does.
  std::map<std::string, int> machine_index;
  for (const auto& e : r.entries) {
    machine_index.emplace(e.machine, static_cast<int>(machine_index.size()));
  }
  const std::string& mine = r.entries[m.rank].machine;
  m.cross_size = static_cast<int>(machine_index.size());
  m.cross_rank = machine_index[mine];
  m.local_rank = 0;
  m.local_size = 0;
  for (int i = 0; i < m.size; ++i) {
    if (r.entries[i].machine != mine) continue;
    if (i < m.rank) ++m.local_rank;
    ++m.local_size;
  }
  return m;
}

bool Rendezvous::enabled(const EnvLookup& env) {
  auto value = env("KOLO_ELASTIC");
  return value && (*value == "1" || *value == "true" || *value == "yes" || *value == "on");
}

Rendezvous::Options Rendezvous::from_env(const EnvLookup& env) {
  const Config config = Config::load(env);
  for (const char* name : {"KOLO_STORE_ADDR", "KOLO_STORE_PORT", "KOLO_WORKER_ID"}) {
    if (!config.is_set(name)) {
      throw ContractError(std::string("kolo::elastic: ") + name +
                          " is not set; elastic workers must be started by kolorun in elastic "
                          "mode (kolorun --min-np N --max-np M ... program)");
    }
  }
  Options o;
  o.store_host = config.get_string("KOLO_STORE_ADDR");
  o.store_port = static_cast<int>(config.get_int("KOLO_STORE_PORT"));
  o.secret = config.get_string("KOLO_JOB_SECRET");
  o.worker_id = config.get_int("KOLO_WORKER_ID");
  o.host =
      config.is_set("KOLO_ELASTIC_HOST") ? config.get_string("KOLO_ELASTIC_HOST") : "localhost";
  o.timeout = milliseconds(
      static_cast<int64_t>(config.get_double("KOLO_ELASTIC_TIMEOUT_SECONDS") * 1000.0 + 0.5));
  return o;
}

Rendezvous::Rendezvous(const Options& options) : options_(options) {
  store_ = connect_tcp_store(options_.store_host, options_.store_port, options_.timeout,
                             options_.secret);
}

int64_t Rendezvous::latest_round() {
  if (!store_->check({"elastic/latest"})) return 0;
  return std::stoll(to_string(store_->get("elastic/latest", milliseconds(0))));
}

Membership Rendezvous::join(int64_t after_round, const std::string& reason,
                            const std::vector<int64_t>& suspects) {
  const std::string id = std::to_string(options_.worker_id);
  std::string why = reason.substr(0, 400);
  std::replace(why.begin(), why.end(), '\n', ' ');
  std::string named;
  for (int64_t suspect : suspects) named += (named.empty() ? "" : ",") + std::to_string(suspect);
  store_->set("elastic/join/" + id,
              to_bytes(std::to_string(after_round) + "\n" + why + "\n" + named));
  store_->add("elastic/events", 1);
  // Rounds only grow. Start from the newest one published (a worker that was
  // away for several rounds skips those it is not in) and wait for the next
  // one while this worker is not a member.
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  int64_t round = std::max(after_round + 1, latest_round());
  for (;;) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      throw TimeoutError("kolo elastic: worker " + id + " waited " +
                         std::to_string(options_.timeout.count()) +
                         " ms (KOLO_ELASTIC_TIMEOUT_SECONDS) for kolorun to form a world with "
                         "it (last round looked for: " +
                         std::to_string(round) + ")");
    }
    const std::string text = to_string(store_->get(round_key(round), left));
    if (Membership::contains(text, options_.worker_id)) {
      // A newer round may already exist (formed while this one was being
      // read): prefer it, so nobody builds a world kolorun has given up on.
      const int64_t newest = latest_round();
      if (newest > round) {
        round = newest;
        continue;
      }
      return Membership::parse(text, options_.worker_id);
    }
    round = std::max(round + 1, latest_round());
  }
}

}  // namespace kolo::elastic

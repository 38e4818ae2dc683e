// The parameter server's shape: roles, partition, links (parameter_server.h).
#include "kolo/core/parameter_server.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <thread>

#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/core/split.h"
#include "kolo/core/store.h"

namespace kolo::ps {

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kSync:
      return "sync";
    case Mode::kAsync:
      return "async";
    case Mode::kSsp:
      return "ssp";
  }
  return "?";
}

Mode parse_mode(const std::string& text, const std::string& what) {
  if (text == "sync") return Mode::kSync;
  if (text == "async") return Mode::kAsync;
  if (text == "ssp") return Mode::kSsp;
  throw ContractError(what + ": unknown parameter-server mode '" + text +
                      "'; use sync, async or ssp");
}

Roles roles_from(const Topology& topology, const Config& config) {
  const int64_t servers = config.get_int("KOLO_PS_SERVERS");
  if (servers <= 0) {
    throw ContractError(
        "kolo::ps::roles: KOLO_PS_SERVERS is not set, so this job has no parameter servers; "
        "launch with kolorun -np W --servers S (or set KOLO_PS_SERVERS=S for mpirun: the last "
        "S ranks serve)");
  }
  if (servers >= topology.size) {
    throw ContractError("kolo::ps::roles: KOLO_PS_SERVERS=" + std::to_string(servers) +
                        " leaves no worker in a job of " + std::to_string(topology.size) +
                        " ranks; start W + S ranks (kolorun -np W --servers S)");
  }
  Roles roles;
  roles.servers = static_cast<int>(servers);
  roles.workers = topology.size - roles.servers;
  roles.rank = topology.rank;
  return roles;
}

int64_t VariableSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Partition Partition::by_bytes(const std::vector<VariableSpec>& specs, int servers) {
  if (servers < 1) {
    throw ContractError("kolo::ps::Partition: needs at least one server, got " +
                        std::to_string(servers));
  }
  // Byte offsets of the variables laid end to end; server s takes part s of
  // the bytes by kolo's one split rule (split.h), rounded to whole elements.
  int64_t total = 0;
  for (const VariableSpec& v : specs)
    total += v.numel() * static_cast<int64_t>(dtype_size(v.dtype));
  Partition p;
  p.slices.resize(servers);
  p.shard_numel.assign(servers, 0);
  int64_t offset = 0;  // bytes before variable i
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t esize = static_cast<int64_t>(dtype_size(specs[i].dtype));
    const int64_t n = specs[i].numel();
    for (int s = 0; s < servers; ++s) {
      const EvenSplit part = even_split(total, servers, s);
      const int64_t lo = part.begin;
      const int64_t hi = part.begin + part.count;
      // Elements whose first byte lies in [lo, hi) (a negative numerator
      // rounds toward zero, and the clamp takes it to 0 either way).
      const int64_t begin = std::clamp<int64_t>((lo - offset + esize - 1) / esize, 0, n);
      const int64_t end = std::clamp<int64_t>((hi - offset + esize - 1) / esize, 0, n);
      if (end > begin) {
        p.slices[s].push_back({static_cast<int>(i), begin, end});
        p.shard_numel[s] += end - begin;
      }
    }
    offset += n * esize;
  }
  return p;
}

int64_t fingerprint(const std::vector<VariableSpec>& specs) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, size_t n) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  };
  for (const VariableSpec& v : specs) {
    mix(v.name.data(), v.name.size() + 1);
    const int64_t dims = static_cast<int64_t>(v.shape.size());
    mix(&dims, sizeof(dims));
    mix(v.shape.data(), v.shape.size() * sizeof(int64_t));
    const int dtype = static_cast<int>(v.dtype);
    mix(&dtype, sizeof(dtype));
  }
  return static_cast<int64_t>(h & 0x7fffffffffffffffull);
}

// ---- links ----

namespace {

// The store keys of rejoining (under LinkOptions::name): a worker's
// announced generation, a server's acceptance of it, a server's end.
struct RejoinKeys {
  std::string base;
  std::string announced(int worker) const { return base + "/w" + std::to_string(worker); }
  std::string accepted(int worker, int64_t generation, int server) const {
    return announced(worker) + "/g" + std::to_string(generation) + "/s" + std::to_string(server);
  }
  std::string closed(int server) const { return base + "/closed/s" + std::to_string(server); }
};

// The link's name in the store: generation 0 is the job's first start.
std::string link_name(const LinkOptions& options, int server, int worker, int64_t generation) {
  return options.name + "/s" + std::to_string(server) + "w" + std::to_string(worker) +
         (generation > 0 ? "/r" + std::to_string(generation) : "");
}

std::chrono::milliseconds runtime_timeout(const Runtime& runtime) {
  return std::chrono::milliseconds(
      static_cast<int64_t>(runtime.config().get_double("KOLO_TIMEOUT_SECONDS") * 1000.0));
}

std::shared_ptr<RejoinChannel> server_channel(Runtime& runtime, const Roles& roles,
                                              const LinkOptions& options) {
  std::shared_ptr<Store> store = runtime.store();
  if (!store) return nullptr;  // mpi without a store: a lost worker stays lost
  const RejoinKeys keys{options.name + "/rejoin"};
  const int server = roles.server_index();
  auto channel = std::make_shared<RejoinChannel>();
  channel->announced = [store, keys](int worker) -> int64_t {
    const std::string key = keys.announced(worker);
    if (!store->check({key})) return 0;
    return std::strtoll(to_string(store->get(key, std::chrono::seconds(10))).c_str(), nullptr, 10);
  };
  channel->accept = [&runtime, store, keys, roles, options, server](int worker,
                                                                    int64_t generation) {
    store->set(keys.accepted(worker, generation, server), to_bytes("1"));
    return runtime.group_communicator({worker, roles.rank},
                                      link_name(options, server, worker, generation));
  };
  channel->close = [store, keys, server] { store->set(keys.closed(server), to_bytes("1")); };
  channel->evict = [&runtime](int worker, int64_t generation, const std::string& why) {
    return runtime.request_eviction(worker, generation, why);
  };
  return channel;
}

// A restarted worker's links: announce, wait for every server's answer,
// then build the links of this generation.
Links rejoin(Runtime& runtime, const Roles& roles, const LinkOptions& options, int64_t generation) {
  const std::shared_ptr<Store>& store = runtime.store();
  const RejoinKeys keys{options.name + "/rejoin"};
  const int self = roles.rank;
  const std::string who = "kolo::ps::connect: worker " + std::to_string(self) + " (restart " +
                          std::to_string(generation) + ")";
  store->set(keys.announced(self), to_bytes(std::to_string(generation)));
  const auto deadline = std::chrono::steady_clock::now() + runtime_timeout(runtime);
  for (int s = 0; s < roles.servers; ++s) {
    const std::string server = "parameter server " + std::to_string(s) + " (world rank " +
                               std::to_string(roles.server_rank(s)) + ")";
    for (;;) {
      if (store->check({keys.accepted(self, generation, s)})) break;
      if (store->check({keys.closed(s)})) {
        throw RuntimeFault(who + ": " + server +
                               " has already ended (every other worker had finished or left, "
                               "or it stopped), so there is no job to rejoin",
                           {roles.server_rank(s)});
      }
      if (std::chrono::steady_clock::now() > deadline) {
        throw TimeoutError(who + ": " + server +
                               " did not accept the restarted worker within KOLO_TIMEOUT_SECONDS; "
                               "is it running in mode async or ssp (sync servers stop when a "
                               "worker dies)?",
                           {roles.server_rank(s)});
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  Links links;
  links.roles = roles;
  links.timeout = runtime_timeout(runtime);
  links.generation = generation;
  for (int s = 0; s < roles.servers; ++s) {
    links.peers.push_back(runtime.group_communicator({self, roles.server_rank(s)},
                                                     link_name(options, s, self, generation)));
  }
  return links;
}

}  // namespace

Links connect(Runtime& runtime, const Roles& roles, const LinkOptions& options) {
  const int64_t generation = runtime.config().get_int("KOLO_PS_REJOIN");
  if (generation > 0 && !roles.is_server()) return rejoin(runtime, roles, options, generation);
  if (generation > 0) {
    throw ContractError("kolo::ps::connect: rank " + std::to_string(roles.rank) +
                        " is a server but KOLO_PS_REJOIN is set: only workers can be restarted "
                        "into a running job (kolorun --restart-workers)");
  }
  Links links;
  links.roles = roles;
  links.timeout = runtime_timeout(runtime);
  const int self = roles.rank;
  if (roles.is_server()) {
    links.rejoin = server_channel(runtime, roles, options);
    for (int w = 0; w < roles.workers; ++w) {
      links.peers.push_back(
          runtime.group_communicator({w, self}, link_name(options, roles.server_index(), w, 0)));
    }
  } else {
    for (int s = 0; s < roles.servers; ++s) {
      links.peers.push_back(
          runtime.group_communicator({self, roles.server_rank(s)}, link_name(options, s, self, 0)));
    }
  }
  return links;
}

Links connect(Runtime& runtime, const LinkOptions& options) {
  return connect(runtime, roles_from(runtime.topology(), runtime.config()), options);
}

std::vector<Links> make_thread_links(int workers, int servers, std::chrono::milliseconds timeout) {
  std::vector<Links> links(workers + servers);
  for (int r = 0; r < workers + servers; ++r) {
    links[r].roles = Roles{workers, servers, r};
    links[r].timeout = timeout;
    links[r].peers.resize(r < workers ? servers : workers);
  }
  for (int s = 0; s < servers; ++s) {
    for (int w = 0; w < workers; ++w) {
      auto pair = make_thread_communicators(2, timeout);
      links[w].peers[s] = std::move(pair[kWorkerPeer]);
      links[workers + s].peers[w] = std::move(pair[kServerPeer]);
    }
  }
  return links;
}

}  // namespace kolo::ps

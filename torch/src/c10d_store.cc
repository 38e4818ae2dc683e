// kolo::Store over libtorch's c10d::TCPStore, and init_torch() (c10d_store.h).
#include "kolo/torch/c10d_store.h"

#include <algorithm>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>
#include <vector>

#include "kolo/core/config.h"
#include "kolo/core/errors.h"
#include "kolo/core/topology.h"

namespace kolo {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// c10::Error's what() carries a C++ backtrace after its first line.
std::string first_line(const std::exception& e) {
  const std::string text = e.what();
  return text.substr(0, text.find('\n'));
}

class C10dStore : public Store {
 public:
  C10dStore(const std::string& host, int port, milliseconds timeout)
      : address_(host + ":" + std::to_string(port)) {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);
    options.isServer = false;
    options.waitWorkers = false;  // the launcher's store counts no workers of ours
    options.timeout = timeout;
    try {
      client_ = std::make_unique<c10d::TCPStore>(host, options);
    } catch (const std::exception& e) {
      throw RuntimeFault("kolo: cannot reach the c10d store at " + address_ + " within " +
                         std::to_string(timeout.count()) + " ms: " + first_line(e));
    }
  }

  void set(const std::string& key, const Bytes& value) override {
    call([&] { client_->set(key, value); });
  }

  Bytes get(const std::string& key, milliseconds timeout) override {
    wait({key}, timeout);
    Bytes value;
    call([&] { value = client_->get(key); });
    return value;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t value = 0;
    call([&] { value = client_->add(key, delta); });
    return value;
  }

  bool check(const std::vector<std::string>& keys) override {
    bool present = false;
    call([&] { present = client_->check(keys); });
    return present;
  }

  // Polls (1 ms growing to 50 ms) rather than calling c10d's blocking wait,
  // which would hold the client's one connection for the whole wait.
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    milliseconds pause(1);
    while (!check(keys)) {
      if (Clock::now() >= deadline) {
        std::string missing;
        for (const auto& key : keys) {
          if (!check({key})) missing += (missing.empty() ? "" : ", ") + key;
        }
        throw TimeoutError("kolo: waited " + std::to_string(timeout.count()) +
                           " ms for keys of the c10d store at " + address_ +
                           " that no rank set: " + missing);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, milliseconds(50));
    }
  }

  bool erase(const std::string& key) override {
    bool existed = false;
    call([&] { existed = client_->deleteKey(key); });
    return existed;
  }

 private:
  template <typename F>
  void call(F&& operation) {
    try {
      operation();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw RuntimeFault("kolo: the c10d store at " + address_ + " failed: " + first_line(e));
    }
  }

  const std::string address_;
  std::unique_ptr<c10d::TCPStore> client_;  // thread-safe: one request at a time
};

}  // namespace

std::shared_ptr<Store> connect_c10d_store(const std::string& host, int port, milliseconds timeout) {
  if (port < 1 || port > 65535) {
    throw ContractError("kolo connect_c10d_store: port " + std::to_string(port) +
                        " is not a TCP port in [1, 65535]");
  }
  if (timeout.count() <= 0) {
    throw ContractError("kolo connect_c10d_store: timeout must be > 0 ms, got " +
                        std::to_string(timeout.count()));
  }
  return std::make_shared<C10dStore>(host, port, timeout);
}

InitOptions with_launcher_store(const InitOptions& options) {
  InitOptions joined = options;
  if (!joined.store) {
    const EnvLookup env = options.env ? options.env : process_env();
    const Config config = Config::load(env);
    const Topology topology = detect_topology(env, config);
    if (topology.size > 1 && topology.store_kind == "c10d") {
      const milliseconds timeout =
          options.timeout ? *options.timeout
                          : milliseconds(static_cast<int64_t>(
                                config.get_double("KOLO_TIMEOUT_SECONDS") * 1000.0 + 0.5));
      joined.store = connect_c10d_store(topology.store_host, topology.store_port, timeout);
    }
  }
  return joined;
}

void init_torch(const InitOptions& options) { init(with_launcher_store(options)); }

}  // namespace kolo

// kolo::Store over libtorch's c10d::TCPStore, and init_torch() (c10d_store.h).
#include "kolo/torch/c10d_store.h"

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
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

// How long past its timeout a connection may take before kolo reports the
// server silent (see C10dStore's constructor).
constexpr milliseconds kConnectGrace{5000};

// c10::Error's what() carries a C++ backtrace after its first line.
std::string first_line(const std::exception& e) {
  const std::string text = e.what();
  return text.substr(0, text.find('\n'));
}

// What to add to libtorch's message when the server closed the connection
// on a c10d request or answered its ping with something else: the usual
// cause is a server of another protocol, such as kolorun's own store, whose
// frames a c10d client cannot speak. (libtorch 1.13 says "Connection reset by
// peer"; 2.x "Connection closed by peer", "Remote peer closed the
// connection", or, when the server answered, "Ping failed, invalid value
// returned from server".)
std::string other_protocol_hint(std::string message) {
  std::transform(message.begin(), message.end(), message.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const bool closed = message.find("reset by peer") != std::string::npos ||
                      message.find("broken pipe") != std::string::npos ||
                      message.find("closed") != std::string::npos;
  const bool misanswered = message.find("ping failed") != std::string::npos;
  if (!closed && !misanswered) return "";
  return std::string("; the server ") +
         (closed ? "closed the connection on" : "gave a wrong answer to") +
         " a c10d request: is it a c10d TCPStore "
         "(torchrun's agent store at MASTER_ADDR:MASTER_PORT)? Under kolorun, which serves "
         "kolo's own store, leave KOLO_STORE unset";
}

// Runs the client's calls one at a time on a thread of its own, each bounded
// by a timeout. libtorch's client has no timeout on its receives: against a
// server that accepts and never answers (not a c10d store, a stopped
// process), its constructor's ping and every request would block forever.
// A call that runs past its timeout is a TimeoutError; the connection's state
// is unknown afterwards, so every later call is a RuntimeFault, and the
// thread stuck in it is left to end with the connection (detached, holding
// the client).
class BoundedCalls {
 public:
  BoundedCalls() : shared_(std::make_shared<Shared>()) {
    std::thread([shared = shared_] { shared->serve(); }).swap(thread_);
  }
  ~BoundedCalls() {
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      shared_->stop = true;
    }
    shared_->wake.notify_all();
    if (shared_->stuck) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  BoundedCalls(const BoundedCalls&) = delete;
  BoundedCalls& operator=(const BoundedCalls&) = delete;

  // Runs `call` on the thread; rethrows what it throws; TimeoutError naming
  // `what` and `address` when it takes longer than `timeout`.
  void run(const std::function<void()>& call, milliseconds timeout, const std::string& what,
           const std::string& address) {
    std::unique_lock<std::mutex> lock(shared_->mutex);
    if (shared_->stuck) {
      throw RuntimeFault("kolo: the c10d store at " + address +
                         " did not answer an earlier request in time (" + shared_->stuck_on +
                         "), so its connection cannot be used any more");
    }
    shared_->call = call;
    shared_->error = nullptr;
    shared_->done = false;
    shared_->wake.notify_all();
    if (!shared_->finished.wait_for(lock, timeout, [&] { return shared_->done; })) {
      shared_->stuck = true;
      shared_->stuck_on = what;
      throw TimeoutError("kolo: the c10d store at " + address + " did not answer " + what +
                         " within " + std::to_string(timeout.count()) +
                         " ms (KOLO_TIMEOUT_SECONDS): the server accepted the connection but "
                         "does not reply; is it a c10d TCPStore (torchrun's agent store at "
                         "MASTER_ADDR:MASTER_PORT), and is it running? Under kolorun, which "
                         "serves kolo's own store, leave KOLO_STORE unset");
    }
    if (shared_->error) std::rethrow_exception(shared_->error);
  }

 private:
  struct Shared {
    std::mutex mutex;
    std::condition_variable wake, finished;
    std::function<void()> call;  // pending when set
    std::exception_ptr error;
    bool done = false, stop = false, stuck = false;
    std::string stuck_on;

    void serve() {
      std::unique_lock<std::mutex> lock(mutex);
      for (;;) {
        wake.wait(lock, [&] { return stop || call; });
        if (!call) return;  // stopped with nothing to do
        std::function<void()> mine = std::move(call);
        call = nullptr;
        lock.unlock();
        std::exception_ptr caught;
        try {
          mine();
        } catch (...) {
          caught = std::current_exception();
        }
        lock.lock();
        error = caught;
        done = true;
        finished.notify_all();
        if (stuck) return;  // the caller gave up on this call and on the connection
      }
    }
  };
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

class C10dStore : public Store {
 public:
  C10dStore(const std::string& host, int port, milliseconds timeout)
      : address_(host + ":" + std::to_string(port)), timeout_(timeout) {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);
    options.isServer = false;
    options.waitWorkers = false;  // the launcher's store counts no workers of ours
    options.timeout = timeout;
    auto client = std::make_shared<std::unique_ptr<c10d::TCPStore>>();
    try {
      // libtorch retries the connection within `timeout` and reports a
      // server that is not there; the ping after it may block (a server
      // that never answers): the whole is bounded by the timeout plus a
      // grace that lets libtorch's own connect error come first.
      calls_.run(
          [host, options, client] { *client = std::make_unique<c10d::TCPStore>(host, options); },
          timeout + kConnectGrace, "the connection's first ping", address_);
    } catch (const TimeoutError&) {
      throw;
    } catch (const std::exception& e) {
      const std::string message = first_line(e);
      throw RuntimeFault("kolo: cannot reach the c10d store at " + address_ + " within " +
                         std::to_string(timeout.count()) + " ms: " + message +
                         other_protocol_hint(message));
    }
    client_ = std::move(client);
  }

  void set(const std::string& key, const Bytes& value) override {
    call<bool>("set('" + key + "')", [key, value](c10d::TCPStore& c) {
      c.set(key, value);
      return true;
    });
  }

  Bytes get(const std::string& key, milliseconds timeout) override {
    wait({key}, timeout);
    return call<Bytes>("get('" + key + "')", [key](c10d::TCPStore& c) { return c.get(key); });
  }

  int64_t add(const std::string& key, int64_t delta) override {
    return call<int64_t>("add('" + key + "')",
                         [key, delta](c10d::TCPStore& c) { return c.add(key, delta); });
  }

  bool check(const std::vector<std::string>& keys) override {
    return call<bool>("check", [keys](c10d::TCPStore& c) { return c.check(keys); });
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
    return call<bool>("erase('" + key + "')",
                      [key](c10d::TCPStore& c) { return c.deleteKey(key); });
  }

 private:
  // One request, bounded by the store's timeout; libtorch's exceptions (a
  // reply it cannot parse, a closed connection) become RuntimeFault.
  // `operation` owns copies of its arguments and the result lives on the
  // heap: a call left stuck on the thread touches nothing of this frame
  // when (if ever) it returns.
  template <typename R, typename F>
  R call(const std::string& what, F operation) {
    auto result = std::make_shared<std::optional<R>>();
    try {
      calls_.run([result, client = client_, operation] { result->emplace(operation(**client)); },
                 timeout_, what, address_);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      const std::string message = first_line(e);
      throw RuntimeFault("kolo: the c10d store at " + address_ + " failed in " + what + ": " +
                         message + other_protocol_hint(message));
    }
    return std::move(**result);
  }

  const std::string address_;
  const milliseconds timeout_;  // per request
  // Declared before the client: destroyed after it (a detached stuck thread
  // keeps its own reference to the client).
  BoundedCalls calls_;
  std::shared_ptr<std::unique_ptr<c10d::TCPStore>> client_;
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

// Rendezvous key-value store: how ranks find each other.
//
// Values are byte strings. get() and wait() block until the key exists or the
// timeout passes (TimeoutError naming the missing keys). add() is an atomic
// counter (value stored as decimal text) and returns the new value.
// Implementations are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/export.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const Bytes& value) = 0;
  virtual Bytes get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True if every key exists now; never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Removes a key; returns whether it existed.
  virtual bool erase(const std::string& key) = 0;
};

Bytes to_bytes(const std::string& text);
std::string to_string(const Bytes& bytes);

// In-process store (a map under a mutex) for ranks-as-threads tests.
std::shared_ptr<Store> make_memory_store();

// A store in a directory shared by the ranks (one file per key, written
// atomically). For tests of separate processes without a server.
std::shared_ptr<Store> make_file_store(const std::string& directory);

// Every key is transparently prefixed with `prefix + "/"`.
std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> inner, const std::string& prefix);

// Client of a TcpStoreServer. Connects with retries until `connect_timeout`.
// A lost connection raises RuntimeFault naming the server address. `secret`
// must be the server's (see TcpStoreServer::Options::secret); "" for a server
// without one.
std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port,
                                         std::chrono::milliseconds connect_timeout,
                                         const std::string& secret = "");

// TCP store server. Served by kolorun (or, without kolorun, by rank 0 in
// torchrun-style bootstrap). Runs its own thread until destroyed.
class Config;

class TcpStoreServer {
 public:
  struct Options {
    std::string bind_address = "127.0.0.1";  // "0.0.0.0" when other hosts take part
    int port = 0;                            // 0 = pick a free port
    // When non-empty, every message in both directions carries HMAC-SHA256
    // tags under this key over (direction, a random per-connection nonce the
    // server sends first, a message counter, the message's length, the
    // message): a client without the secret can neither read nor write the
    // store, a recorded message cannot be replayed, and a connection whose
    // first 36 bytes carry no valid tag is closed before anything else of it
    // is read.
    std::string secret;
    // Called on the server's thread for each connection closed for a bad
    // tag and for connections refused at max_connections, with the peer
    // address and the reason (kolorun logs it).
    std::function<void(const std::string& message)> on_reject;

    // Limits against broken or hostile clients (kolorun and rank 0 take them
    // from KOLO_STORE_*; see store_limits_from). Memory per connection stays
    // below max_message_bytes + 1 MiB of unsent replies + a small constant.
    // Largest request (key + value + 13 bytes); a bigger one is answered
    // with an error naming this limit and its bytes are skipped unread.
    size_t max_message_bytes = size_t{16} << 20;
    // Open connections; at the limit a new one replaces the oldest that has
    // not yet sent a whole valid request, else it is closed at once.
    int max_connections = 1024;
    // A connection with no request parked and no traffic for this long is
    // closed (clients reconnect by themselves); one that has not sent a whole
    // valid request is closed after min(idle_timeout, 10 s).
    std::chrono::milliseconds idle_timeout{std::chrono::seconds(300)};
  };
  explicit TcpStoreServer(const Options& options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const;

 private:
  struct KOLO_HIDDEN Impl;
  std::unique_ptr<Impl> impl_;
};

// Sets options' limits from KOLO_STORE_MAX_MESSAGE_BYTES,
// KOLO_STORE_MAX_CONNECTIONS and KOLO_STORE_IDLE_TIMEOUT_SECONDS; a value out
// of range is a ContractError naming the variable.
void store_limits_from(const Config& config, TcpStoreServer::Options& options);

}  // namespace kolo
#pragma GCC visibility pop

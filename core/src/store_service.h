// The rendezvous store's server side without sockets (internal): the keys
// and values, and one Session per client connection that turns received
// bytes into handled requests and queued replies (store_protocol.h has the
// wire format). TcpStoreServer (store_tcp.cc) owns the sockets and the poll
// loop; the fuzzer (tests/fuzz/store_fuzz.cc) feeds a Session arbitrary bytes.
//
// Bounds, whatever a client sends: a Session never buffers more than one
// frame header, then (once the header is authenticated, with a secret) one
// message of at most Limits::max_message_bytes; a bigger message is answered
// with kError and its bytes are skipped unread, so the client gets a clear
// error. A Session takes no input while a request is parked (get/wait) or
// while more than Limits::max_reply_backlog_bytes of replies wait to be sent:
// a client that never reads its replies stalls itself, not the server.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kolo/core/store.h"

namespace kolo::detail {

class StoreService {
 public:
  using Clock = std::chrono::steady_clock;

  struct Limits {
    size_t max_message_bytes = size_t{64} << 20;
    size_t max_reply_backlog_bytes = size_t{1} << 20;
  };

  struct Session {
    std::string peer;       // for messages ("10.0.0.2:51234")
    std::string nonce;      // authenticated stores: sent first
    uint64_t requests = 0;  // requests handled (the tag counter)
    bool proven = false;    // sent one whole, valid request
    // The frame being received: its header, then its message (+ tag), or
    // `skip` bytes of a refused message.
    std::string head;
    bool in_message = false;
    std::string message;
    size_t message_bytes = 0;  // of the message itself, without its tag
    uint64_t skip = 0;
    std::string out;  // replies not yet sent
    // A parked get/wait: answered when `keys` all exist or at `deadline`.
    bool parked = false;
    uint8_t parked_op = 0;
    std::vector<std::string> parked_keys;
    Clock::time_point deadline;
  };

  // `secret` "" = unauthenticated. `on_reject` (may be empty) hears about
  // each connection closed for a bad tag.
  StoreService(std::string secret, Limits limits,
               std::function<void(const std::string&)> on_reject);

  // A new connection: queues the nonce frame when authenticated.
  void open(Session& s, const std::string& nonce) const;
  // How many bytes `s` takes now (0 while parked or its replies back up);
  // never past the end of the current frame part.
  size_t wanted(const Session& s) const;
  // Takes `n` <= wanted(s) bytes. Returns false when the connection must be
  // closed (a bad tag, a malformed request); `changed` is set when the store
  // changed (parked requests may now be answerable).
  bool receive(Session& s, const char* data, size_t n, Clock::time_point now, bool& changed);
  // Answers a parked request if its keys exist or its deadline passed.
  void try_unpark(Session& s, Clock::time_point now);

  size_t keys() const { return data_.size(); }

 private:
  bool authenticated() const { return !secret_.empty(); }
  // A whole message arrived (tag verified): handle it.
  bool handle_message(Session& s, Clock::time_point now, bool& changed);
  void reply(Session& s, const std::string& message);
  void reject(const Session& s, const std::string& why) const;

  const std::string secret_;
  const Limits limits_;
  const std::function<void(const std::string&)> on_reject_;
  std::unordered_map<std::string, Bytes> data_;
};

}  // namespace kolo::detail

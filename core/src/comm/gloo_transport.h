// The gloo backend's transport (internal; gloo_communicator.cc runs kolo's
// algorithms over it, gloo_p2p.h its point-to-point transfers): gloo's TCP
// pairs as kolo uses them. A SigpipeGuard keeps a write to a dead peer from
// killing the process; the PeerMonitor watches every pair of the mesh with a
// sentinel receive and aborts the caller's wait, naming the peer, when one
// breaks; a Channel is one direction of traffic with one peer over one
// buffer, so that a failed wait names its peer; StoreAdapter is gloo's
// rendezvous over kolo's store; a FaultReport is what a rank that gives up
// writes to the store before closing its connections, so that every
// survivor names the rank that actually failed.
#pragma once

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/unbound_buffer.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/call_scratch.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"

namespace kolo::detail::gloo_tcp {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// gloo writes to its sockets with writev(), so a write to a peer that died
// raises SIGPIPE, whose default action kills the process. The guard blocks
// SIGPIPE in the calling thread while gloo runs in it (the failed write then
// returns EPIPE, which gloo reports as an error) and discards a SIGPIPE raised
// meanwhile. gloo's event-loop thread inherits the blocked mask because the
// device (which starts it) is created under a guard.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_mask_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec no_wait{0, 0};
        sigtimedwait(&pipe_, nullptr, &no_wait);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_mask_;
  bool was_pending_ = false;
};

// A transport failure while talking to `peer`; becomes a RuntimeFault (or
// TimeoutError) at the API boundary, in GlooCommunicator::handle_fault.
struct PeerError {
  int peer;
  bool timed_out;
  std::string detail;
};

// gloo's messages start with "[file:line] "; users need only the rest.
inline std::string without_location(const std::string& text) {
  if (text.empty() || text[0] != '[') return text;
  const size_t end = text.find("] ");
  return end == std::string::npos ? text : text.substr(end + 2);
}

// Watches every pair of the mesh and aborts the caller's wait when one fails.
//
// gloo signals a dead connection only to operations still queued on the
// pair; a send or receive already in progress when the peer dies (the common
// case for large messages) would wait for its full timeout. So each rank keeps
// one "sentinel" receive posted on every pair, on a slot the algorithms never
// use: gloo reliably fails it when the pair breaks, which wakes this monitor's
// thread; it records which peer broke (from the address in gloo's message) and
// aborts whatever wait the calling thread is in.
//
// A rank destroying its communicator first sends one byte on the sentinel slot
// to every peer ("goodbye"): that completes the peer's sentinel receive
// instead of failing it, so the connection closing afterwards is not taken for
// a crash (the peer's last collective may still be finishing with other ranks;
// everything it needed from the departed rank arrived before the goodbye).
class PeerMonitor {
 public:
  static constexpr uint64_t kSentinelSlot = ~uint64_t{0};  // algorithms use (seq << 8) | phase

  // `addresses` maps the peer address gloo prints in its errors to the rank.
  PeerMonitor(gloo::Context& context, std::vector<std::pair<std::string, int>> addresses)
      : addresses_(std::move(addresses)) {
    sentinel_ = context.createUnboundBuffer(&sentinel_byte_, 1);
    for (int peer = 0; peer < context.size; ++peer) {
      if (peer != context.rank) sentinel_->recv(peer, kSentinelSlot, 0, 1);
    }
    thread_ = std::thread([this] { run(); });
  }

  ~PeerMonitor() {
    sentinel_->abortWaitRecv();
    thread_.join();
  }

  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  // Brackets one blocking wait of a thread on `buffer` for `peer` (the
  // caller's collectives, and point-to-point transfers waited for by other
  // threads at the same time). Throws at once if a pair has already failed.
  void begin_wait(gloo::transport::UnboundBuffer* buffer, bool recv, int peer) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_) throw PeerError{peer, false, reason(peer)};
    waiting_.push_back({buffer, recv, peer});
  }
  void end_wait(gloo::transport::UnboundBuffer* buffer) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if (it->buffer == buffer) {
        waiting_.erase(it);
        return;
      }
    }
  }

  // The peers of the waits in progress (any thread).
  std::vector<int> waiting_peers() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int> peers;
    for (const Wait& wait : waiting_) {
      if (std::find(peers.begin(), peers.end(), wait.peer) == peers.end()) {
        peers.push_back(wait.peer);
      }
    }
    return peers;
  }

  // Communicator::abort from any thread: the wait in progress (and every
  // later one) ends as if a pair had failed; aborted() says why. True when
  // a wait was in progress (or an earlier abort() came first).
  bool abort(const std::string& why, const std::vector<int>& ranks) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) return true;
    aborted_ = true;
    abort_reason_ = why;
    abort_ranks_ = ranks;
    broken_ = true;
    if (detail_.empty()) detail_ = why;
    abort_waits();
    return !waiting_.empty();
  }
  // True (with the reason and ranks) once abort() was called.
  bool aborted(std::string* why, std::vector<int>* ranks) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_) return false;
    *why = abort_reason_;
    *ranks = abort_ranks_;
    return true;
  }

  // Why a wait on `peer` was aborted.
  std::string why_aborted(int peer) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return reason(peer);
  }

  // True once `peer` destroyed its communicator in order.
  bool has_departed(int peer) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return departed(peer);
  }

  // The peer whose connection failed first, -1 if none (or not identified).
  int broken_peer() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return broken_peer_;
  }
  // The peers a gloo message `text` points at: the one whose end of a pair
  // it prints, else every peer at the address it prints (gloo sometimes
  // prints a connection end that was never published: seen across test
  // hosts), else none. addresses_ never changes: no lock needed.
  std::vector<int> peers_named_in(const std::string& text) const {
    const int exact = peer_in(text);
    if (exact >= 0) return {exact};
    std::vector<int> peers;
    const size_t close = text.find("]:");  // "[ip]:port", after any "[file:line] "
    const size_t open = close == std::string::npos ? close : text.rfind('[', close);
    if (open == std::string::npos) return peers;
    const std::string host = text.substr(open, close + 1 - open);  // "[ip]"
    for (const auto& [address, rank] : addresses_) {
      if (address.compare(0, host.size(), host) == 0) peers.push_back(rank);
    }
    return peers;
  }
  // gloo's description of that failure ("" if none).
  std::string detail() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return detail_;
  }

 private:
  // gloo turns the wait into a timeout that closes every pair; never reached.
  static constexpr milliseconds kForever{std::chrono::hours(24 * 365)};

  void run() {
    while (true) {
      int from = -1;
      std::string failure;
      try {
        if (!sentinel_->waitRecv(&from, kForever)) return;  // aborted: shutting down
      } catch (const std::exception& error) {
        failure = without_location(error.what());
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure.empty()) {
        departed_.push_back(from);  // goodbye
        continue;
      }
      broken_ = true;
      detail_ = failure;
      broken_peer_ = peer_in(failure);
      abort_waits();
      return;
    }
  }

  void abort_waits() {
    for (const Wait& wait : waiting_) {
      if (wait.recv) {
        wait.buffer->abortWaitRecv();
      } else {
        wait.buffer->abortWaitSend();
      }
    }
  }

  bool departed(int peer) const {
    return std::find(departed_.begin(), departed_.end(), peer) != departed_.end();
  }

  std::string reason(int /*peer*/) const {
    return detail_.empty() ? "a connection of this rank failed" : detail_;
  }

  int peer_in(const std::string& text) const {
    for (const auto& [address, rank] : addresses_) {
      for (size_t at = text.find(address); at != std::string::npos;
           at = text.find(address, at + 1)) {
        const size_t end = at + address.size();
        if (end == text.size() || !std::isdigit(static_cast<unsigned char>(text[end]))) {
          return rank;
        }
      }
    }
    return -1;
  }

  std::vector<std::pair<std::string, int>> addresses_;
  uint8_t sentinel_byte_ = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> sentinel_;
  std::thread thread_;
  mutable std::mutex mutex_;
  // Waits in progress, of the collective thread and of point-to-point waiters.
  struct Wait {
    gloo::transport::UnboundBuffer* buffer;
    bool recv;
    int peer;
  };
  std::vector<Wait> waiting_;
  bool aborted_ = false;
  std::string abort_reason_;
  std::vector<int> abort_ranks_;
  std::vector<int> departed_;
  bool broken_ = false;
  int broken_peer_ = -1;
  std::string detail_;
};

// What a channel needs from its communicator.
struct Link {
  gloo::Context& context;
  PeerMonitor& monitor;
};

// One direction of traffic with one peer over one memory region. Separate
// channels per peer are what let a failed wait name the peer.
class Channel {
 public:
  Channel(Link link, int peer, void* base, size_t bytes, uint64_t slot)
      : monitor_(&link.monitor), peer_(peer), slot_(slot) {
    if (bytes > 0) buffer_ = link.context.createUnboundBuffer(base, bytes);
  }
  Channel(Channel&&) = default;

  int peer() const { return peer_; }

  // Zero-byte transfers are skipped on both sides (their sizes always agree).
  void post_send(size_t offset_bytes, size_t bytes) {
    if (bytes == 0) return;
    guard([&] { buffer_->send(peer_, slot_, offset_bytes, bytes); });
    ++sends_pending_;
  }
  void post_recv(size_t offset_bytes, size_t bytes) {
    if (bytes == 0) return;
    guard([&] { buffer_->recv(peer_, slot_, offset_bytes, bytes); });
    ++recvs_pending_;
  }
  // Waits for the oldest pending receive (completions arrive in post order).
  void wait_recv(const Deadline& deadline) {
    if (recvs_pending_ == 0) return;
    wait(deadline, true, [&](milliseconds left) { return buffer_->waitRecv(nullptr, left); });
    --recvs_pending_;
  }
  void wait_send(const Deadline& deadline) {
    if (sends_pending_ == 0) return;
    wait(deadline, false, [&](milliseconds left) { return buffer_->waitSend(nullptr, left); });
    --sends_pending_;
  }
  void drain(const Deadline& deadline) {
    while (recvs_pending_ > 0) wait_recv(deadline);
    while (sends_pending_ > 0) wait_send(deadline);
  }
  // Makes a wait on this channel in another thread return at once (as
  // aborted); used when the communicator goes away.
  void abort() {
    if (!buffer_) return;
    buffer_->abortWaitRecv();
    buffer_->abortWaitSend();
  }

 private:
  template <typename F>
  void guard(F&& call) {
    try {
      call();
    } catch (const std::exception& error) {
      throw PeerError{peer_, false, error.what()};
    }
  }

  template <typename F>
  void wait(const Deadline& deadline, bool recv, F&& call) {
    const milliseconds left = deadline.remaining();
    if (left.count() <= 0) throw PeerError{peer_, true, "deadline passed"};
    monitor_->begin_wait(buffer_.get(), recv, peer_);
    bool completed = false;
    try {
      completed = call(left);
    } catch (const std::exception& error) {
      monitor_->end_wait(buffer_.get());
      // gloo reports its own timeout as an IoException too; the clock decides.
      throw PeerError{peer_, deadline.passed(), error.what()};
    }
    monitor_->end_wait(buffer_.get());
    if (!completed) throw PeerError{peer_, false, monitor_->why_aborted(peer_)};
  }

  PeerMonitor* monitor_;
  int peer_;
  uint64_t slot_;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
  size_t sends_pending_ = 0;
  size_t recvs_pending_ = 0;
};

// gloo's rendezvous store interface over a kolo Store, under a key prefix.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<kolo::Store> store, std::string prefix, milliseconds timeout)
      : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const Bytes value = store_->get(prefix_ + key, timeout_);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const auto& key : keys) full.push_back(prefix_ + key);
    store_->wait(full, timeout.count() > 0 ? timeout : timeout_);
  }

 private:
  std::shared_ptr<kolo::Store> store_;
  std::string prefix_;
  milliseconds timeout_;
};

inline std::string system_host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

inline std::string join_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (int rank : ranks) text += (text.empty() ? "" : ", ") + std::to_string(rank);
  return text;
}

// What a rank that gave up writes to the store before closing its connections.
struct FaultReport {
  bool timed_out = false;
  // The reporter gave up on the blamed ranks by its own decision
  // (Communicator::abort: a stall check, the user), not because it saw them
  // fail: a blamed rank that is alive carries this reason too.
  bool aborted = false;
  std::vector<int> ranks;  // blamed ranks
  std::string text;        // the reporter's message

  std::string encode() const {
    std::string line = timed_out ? "T" : aborted ? "A" : "F";
    for (int rank : ranks) line += " " + std::to_string(rank);
    return line + "\n" + text;
  }
  static std::optional<FaultReport> decode(const std::string& value) {
    FaultReport report;
    const size_t newline = value.find('\n');
    std::istringstream head(value.substr(0, newline));
    std::string kind;
    if (!(head >> kind) || (kind != "T" && kind != "F" && kind != "A")) return std::nullopt;
    report.timed_out = kind == "T";
    report.aborted = kind == "A";
    int rank = 0;
    while (head >> rank) report.ranks.push_back(rank);
    if (newline != std::string::npos) report.text = value.substr(newline + 1);
    return report;
  }
};

}  // namespace kolo::detail::gloo_tcp

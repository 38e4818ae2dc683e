// TCP rendezvous store: a single-threaded poll() server and a thread-safe client.
//
// The wire protocol is in store_protocol.h, the server's handling of it
// (keys, parked requests, per-connection bounds) in store_service.h; this
// file owns the sockets. A client sends one request at a time per
// connection. Blocking requests (get, wait) are parked on the server and
// answered when their keys appear or their deadline passes, so clients never
// poll. The client keeps a small pool of connections so that threads sharing
// one Store do not serialise behind a blocked get.
//
// The server's thread is never blocked by a client: sockets are
// non-blocking, each connection is read at most kReadBudget bytes per loop
// and only as far as its current frame, a connection whose replies back up
// is not read at all (TCP pushes back on the client), and running out of
// descriptors pauses accepting instead of sleeping. Connections are limited
// (Options::max_connections) and closed when idle (Options::idle_timeout).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "kolo/core/config.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"
#include "store_protocol.h"
#include "store_service.h"

namespace kolo {
namespace {

namespace sp = store_protocol;
using Clock = std::chrono::steady_clock;
using detail::StoreService;

// Bytes read from one connection per pass of the server's loop (fairness).
constexpr size_t kReadBudget = size_t{256} << 10;
// How long a connection may take to send its first whole valid request.
constexpr std::chrono::milliseconds kHandshakeTimeout{10000};
// How long accepting pauses when the process is out of descriptors.
constexpr std::chrono::milliseconds kAcceptPause{100};
// At most one "refused connections" report per this interval.
constexpr std::chrono::seconds kRefusalReportInterval{10};

std::string errno_text(int error) { return std::strerror(error); }

std::string quoted_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "'" : ", '") + key + "'";
  return out;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string peer_address(int fd) {
  sockaddr_storage peer{};
  socklen_t length = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) return "an unknown peer";
  char host[NI_MAXHOST] = {}, port[NI_MAXSERV] = {};
  if (getnameinfo(reinterpret_cast<sockaddr*>(&peer), length, host, sizeof(host), port,
                  sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown peer";
  }
  return std::string(host) + ":" + port;
}

// ---- server ----

struct Connection {
  int fd = -1;
  StoreService::Session session;
  Clock::time_point opened;
  Clock::time_point last_activity;
};

}  // namespace

struct TcpStoreServer::Impl {
  explicit Impl(const Options& options)
      : options(options), service(options.secret, limits_of(options), options.on_reject) {}

  static StoreService::Limits limits_of(const Options& options) {
    StoreService::Limits limits;
    limits.max_message_bytes = options.max_message_bytes;
    return limits;
  }

  const Options options;
  int listen_fd = -1;
  int wake_fd = -1;  // eventfd: the destructor asks the thread to stop
  int port = 0;
  std::thread thread;
  // Owned by the server thread only.
  StoreService service;
  std::map<int, Connection> connections;  // by fd
  Clock::time_point accept_paused_until;
  int64_t refused = 0;  // connections refused since the last report
  Clock::time_point last_refusal_report;

  void run();
  void accept_all(Clock::time_point now);
  // Reads what `c` wants (up to kReadBudget); false = drop the connection.
  bool read_from(Connection& c, Clock::time_point now, bool& changed);
  // Sends queued replies; false = drop the connection.
  bool flush(Connection& c, Clock::time_point now);
  void drop(int fd) {
    close(fd);
    connections.erase(fd);
  }
  // When `c` is closed for idleness.
  Clock::time_point idle_deadline(const Connection& c) const {
    const auto limit =
        c.session.proven ? options.idle_timeout : std::min(options.idle_timeout, kHandshakeTimeout);
    return c.last_activity + limit;
  }
  void report(const std::string& message) const {
    if (options.on_reject) options.on_reject(message);
  }
};

TcpStoreServer::TcpStoreServer(const Options& options) : impl_(std::make_unique<Impl>(options)) {
  const std::string where = options.bind_address + ":" + std::to_string(options.port);
  if (options.max_message_bytes < 64 || options.max_connections < 1 ||
      options.idle_timeout.count() <= 0) {
    throw ContractError("kolo TcpStoreServer: limits must be positive (max_message_bytes " +
                        std::to_string(options.max_message_bytes) + " >= 64, max_connections " +
                        std::to_string(options.max_connections) + ", idle_timeout " +
                        std::to_string(options.idle_timeout.count()) + " ms)");
  }
  if (options.port < 0 || options.port > 65535) {
    throw ContractError("kolo TcpStoreServer: port " + std::to_string(options.port) +
                        " is not in [0, 65535]; use 0 to pick a free port");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(options.bind_address.c_str(), std::to_string(options.port).c_str(), &hints,
                       &found);
  if (rc != 0) {
    throw ContractError("kolo TcpStoreServer: cannot resolve bind address '" +
                        options.bind_address + "': " + gai_strerror(rc) +
                        "; use an IP address such as 127.0.0.1 or 0.0.0.0");
  }
  int last_error = 0;
  for (addrinfo* a = found; a != nullptr && impl_->listen_fd < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last_error = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
      last_error = errno;
      close(fd);
      continue;
    }
    impl_->listen_fd = fd;
  }
  freeaddrinfo(found);
  if (impl_->listen_fd < 0) {
    throw RuntimeFault(
        "kolo TcpStoreServer: cannot listen on " + where + ": " + errno_text(last_error) +
        (last_error == EADDRINUSE ? "; another process uses this port, pick another" : ""));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&bound), &length);
  impl_->port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  impl_->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl_->wake_fd < 0) {
    close(impl_->listen_fd);
    throw RuntimeFault("kolo TcpStoreServer: eventfd failed: " + errno_text(errno));
  }
  Impl* impl = impl_.get();
  impl_->thread = std::thread([impl] { impl->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  uint64_t one = 1;
  if (write(impl_->wake_fd, &one, sizeof(one)) < 0) {
    // eventfd writes cannot fail short of a counter overflow; the thread still
    // exits on its next wake-up.
  }
  impl_->thread.join();
  for (auto& entry : impl_->connections) close(entry.first);
  close(impl_->listen_fd);
  close(impl_->wake_fd);
}

int TcpStoreServer::port() const { return impl_->port; }

void TcpStoreServer::Impl::run() {
  std::vector<pollfd> fds;
  std::vector<int> dropped;
  for (;;) {
    // Sleep until I/O, a parked deadline, an idle deadline or the end of an
    // accept pause.
    Clock::time_point now = Clock::now();
    Clock::time_point wake = Clock::time_point::max();
    for (auto& entry : connections) {
      const Connection& c = entry.second;
      wake = std::min(wake, c.session.parked ? c.session.deadline : idle_deadline(c));
    }
    const bool accepting = now >= accept_paused_until;
    if (!accepting) wake = std::min(wake, accept_paused_until);
    int timeout_ms = -1;
    if (wake != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
    }
    fds.clear();
    fds.push_back({wake_fd, POLLIN, 0});
    fds.push_back({accepting ? listen_fd : -1, POLLIN, 0});
    for (auto& entry : connections) {
      short events = 0;
      if (service.wanted(entry.second.session) > 0) events |= POLLIN;
      if (!entry.second.session.out.empty()) events |= POLLOUT;
      fds.push_back({entry.first, events, 0});  // POLLHUP/POLLERR come regardless
    }
    const int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) return;  // poll on valid fds does not fail otherwise
    if (fds[0].revents) return;           // destructor asked us to stop
    now = Clock::now();
    if (fds[1].revents & POLLIN) accept_all(now);

    bool changed = false;
    dropped.clear();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto it = connections.find(fds[i].fd);
      if (it == connections.end()) continue;
      Connection& c = it->second;
      bool ok = true;
      if (fds[i].revents & POLLIN) ok = read_from(c, now, changed);
      if (ok && (fds[i].revents & POLLOUT)) ok = flush(c, now);
      // Hung up or failed while we did not want its input: it is gone.
      if (ok && (fds[i].revents & (POLLHUP | POLLERR)) && !(fds[i].revents & POLLIN)) ok = false;
      if (!ok) dropped.push_back(c.fd);
    }
    for (int fd : dropped) drop(fd);

    // Parked requests whose keys appeared or whose deadline passed; idle
    // connections.
    dropped.clear();
    for (auto& entry : connections) {
      Connection& c = entry.second;
      if (c.session.parked) {
        service.try_unpark(c.session, now);
        if (!c.session.parked && !flush(c, now)) dropped.push_back(c.fd);
      } else if (now >= idle_deadline(c)) {
        dropped.push_back(c.fd);
      }
    }
    (void)changed;  // every parked request is looked at each pass anyway
    for (int fd : dropped) drop(fd);
  }
}

bool TcpStoreServer::Impl::read_from(Connection& c, Clock::time_point now, bool& changed) {
  char buffer[65536];
  size_t budget = kReadBudget;
  for (;;) {
    const size_t want = std::min({service.wanted(c.session), sizeof(buffer), budget});
    if (want == 0) return true;
    const ssize_t got = recv(c.fd, buffer, want, 0);
    if (got > 0) {
      c.last_activity = now;
      budget -= static_cast<size_t>(got);
      if (!service.receive(c.session, buffer, static_cast<size_t>(got), now, changed)) return false;
      if (!c.session.out.empty() && !flush(c, now)) return false;
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // closed by the client, or an error
  }
}

bool TcpStoreServer::Impl::flush(Connection& c, Clock::time_point now) {
  std::string& out = c.session.out;
  size_t sent_total = 0;
  while (sent_total < out.size()) {
    const ssize_t sent = send(c.fd, out.data() + sent_total, out.size() - sent_total, MSG_NOSIGNAL);
    if (sent > 0) {
      sent_total += static_cast<size_t>(sent);
      c.last_activity = now;
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;  // POLLOUT later
    return false;
  }
  out.erase(0, sent_total);
  return true;
}

void TcpStoreServer::Impl::accept_all(Clock::time_point now) {
  for (;;) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of descriptors: the listening socket stays readable, so pause
      // accepting (without blocking the loop) instead of spinning.
      if (errno == EMFILE || errno == ENFILE) accept_paused_until = now + kAcceptPause;
      return;  // otherwise EAGAIN, or a client that gave up
    }
    if (static_cast<int>(connections.size()) >= options.max_connections) {
      // Make room by closing the oldest connection that has not proven
      // itself; when every connection has, refuse the new one.
      auto oldest = connections.end();
      for (auto it = connections.begin(); it != connections.end(); ++it) {
        if (!it->second.session.proven &&
            (oldest == connections.end() || it->second.opened < oldest->second.opened)) {
          oldest = it;
        }
      }
      if (oldest != connections.end()) {
        drop(oldest->first);
      } else {
        close(fd);
        ++refused;
        if (now - last_refusal_report >= kRefusalReportInterval) {
          report("refused " + std::to_string(refused) +
                 " connection(s): " + std::to_string(options.max_connections) +
                 " connections are open (KOLO_STORE_MAX_CONNECTIONS)");
          refused = 0;
          last_refusal_report = now;
        }
        continue;
      }
    }
    set_nodelay(fd);
    Connection& c = connections[fd];
    c.fd = fd;
    c.opened = c.last_activity = now;
    c.session.peer = peer_address(fd);
    service.open(c.session, options.secret.empty() ? "" : sp::random_nonce());
    if (!c.session.out.empty() && !flush(c, now)) drop(fd);
  }
}

void store_limits_from(const Config& config, TcpStoreServer::Options& options) {
  const int64_t bytes = config.get_int("KOLO_STORE_MAX_MESSAGE_BYTES");
  const int64_t connections = config.get_int("KOLO_STORE_MAX_CONNECTIONS");
  const double idle = config.get_double("KOLO_STORE_IDLE_TIMEOUT_SECONDS");
  if (bytes < 64 || bytes > sp::kMaxFrameBytes) {
    throw ContractError("kolo config: KOLO_STORE_MAX_MESSAGE_BYTES=" + std::to_string(bytes) +
                        " is not in [64, " + std::to_string(sp::kMaxFrameBytes) + "]");
  }
  if (connections < 1 || connections > 1000000) {
    throw ContractError("kolo config: KOLO_STORE_MAX_CONNECTIONS=" + std::to_string(connections) +
                        " is not in [1, 1000000]");
  }
  if (!(idle > 0) || idle > 1e9) {
    throw ContractError("kolo config: KOLO_STORE_IDLE_TIMEOUT_SECONDS=" + std::to_string(idle) +
                        " is not a number of seconds > 0");
  }
  options.max_message_bytes = static_cast<size_t>(bytes);
  options.max_connections = static_cast<int>(connections);
  options.idle_timeout = std::chrono::milliseconds(static_cast<int64_t>(idle * 1000.0 + 0.5));
}

// ---- client ----

namespace {

// Extra time a client waits for an answer beyond a blocking request's own
// timeout before it declares the server unresponsive (the server answers
// parked requests itself at their deadline, so this covers only its latency),
// and the least time it waits for any answer.
constexpr std::chrono::milliseconds kReplyGrace{5000};

class TcpStore : public Store {
 public:
  TcpStore(std::string host, int port, std::chrono::milliseconds connect_timeout,
           std::string secret)
      : host_(std::move(host)),
        port_(port),
        connect_timeout_(connect_timeout),
        secret_(std::move(secret)) {
    idle_.push_back(open_connection());
  }

  ~TcpStore() override {
    for (const Link& link : idle_) close(link.fd);
  }

  void set(const std::string& key, const Bytes& value) override {
    if (value.size() + key.size() > sp::kMaxFrameBytes - 64) {
      throw ContractError("kolo store: set('" + key + "'): value of " +
                          std::to_string(value.size()) + " bytes exceeds the limit of " +
                          std::to_string(sp::kMaxFrameBytes - 64) + " bytes");
    }
    sp::Writer w;
    w.u8(sp::kSet);
    w.str(key);
    w.bytes(value);
    call("set('" + key + "')", w, std::chrono::milliseconds(0));
  }

  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    sp::Writer w;
    w.u8(sp::kGet);
    w.str(key);
    w.i64(timeout.count());
    std::string reply = call("get('" + key + "')", w, timeout);
    sp::Reader r(reply.data(), reply.size());
    uint8_t status = r.u8();
    if (status == sp::kTimeout) {
      throw TimeoutError("kolo store " + where() + ": get timed out after " +
                         std::to_string(timeout.count()) + " ms waiting for key '" + key +
                         "'; the rank that should set it has not arrived (is it running?)");
    }
    return r.bytes();
  }

  int64_t add(const std::string& key, int64_t delta) override {
    sp::Writer w;
    w.u8(sp::kAdd);
    w.str(key);
    w.i64(delta);
    std::string reply = call("add('" + key + "')", w, std::chrono::milliseconds(0));
    sp::Reader r(reply.data(), reply.size());
    r.u8();
    return r.i64();
  }

  bool check(const std::vector<std::string>& keys) override {
    sp::Writer w;
    w.u8(sp::kCheck);
    w.u32(static_cast<uint32_t>(keys.size()));
    for (const auto& key : keys) w.str(key);
    std::string reply = call("check", w, std::chrono::milliseconds(0));
    sp::Reader r(reply.data(), reply.size());
    r.u8();
    return r.u8() != 0;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    sp::Writer w;
    w.u8(sp::kWait);
    w.u32(static_cast<uint32_t>(keys.size()));
    for (const auto& key : keys) w.str(key);
    w.i64(timeout.count());
    std::string reply = call("wait", w, timeout);
    sp::Reader r(reply.data(), reply.size());
    if (r.u8() == sp::kTimeout) {
      std::vector<std::string> missing(r.u32());
      for (auto& key : missing) key = r.str();
      throw TimeoutError("kolo store " + where() + ": wait timed out after " +
                         std::to_string(timeout.count()) +
                         " ms; missing keys: " + quoted_keys(missing));
    }
  }

  bool erase(const std::string& key) override {
    sp::Writer w;
    w.u8(sp::kErase);
    w.str(key);
    std::string reply = call("erase('" + key + "')", w, std::chrono::milliseconds(0));
    sp::Reader r(reply.data(), reply.size());
    r.u8();
    return r.u8() != 0;
  }

 private:
  std::string where() const { return host_ + ":" + std::to_string(port_); }

  [[noreturn]] void lost(const std::string& what, const std::string& reason) const {
    throw RuntimeFault("kolo store: lost the connection to the rendezvous store at " + where() +
                       " during " + what + ": " + reason +
                       "; the process serving it (kolorun, or rank 0 under torchrun-style "
                       "launch) has probably exited");
  }

  // One connection: its socket and, when authenticated, the server's nonce
  // and the number of requests sent so far.
  struct Link {
    int fd = -1;
    std::string nonce;
    uint64_t requests = 0;
  };

  // Sends one request on a pooled connection and returns the reply body (its
  // status byte first). A kError reply is a ContractError.
  std::string call(const std::string& what, const sp::Writer& request,
                   std::chrono::milliseconds timeout) {
    for (int attempt = 0;; ++attempt) {
      bool reused = false;
      Link link = acquire(reused);
      bool answered = false;  // any byte of the reply arrived
      std::string body;
      try {
        // A silent server fails the request at its own timeout (get, wait)
        // plus the grace, or at the store's timeout (set, add, check, erase):
        // the timeouts kolo was given, not a multiple of them.
        const auto deadline =
            Clock::now() +
            (timeout.count() > 0 ? timeout + kReplyGrace : std::max(connect_timeout_, kReplyGrace));
        send_all(link.fd, sp::seal(secret_, 'Q', link.nonce, link.requests, request.body()), what);
        body = read_reply(link, deadline, what, answered);
      } catch (const TimeoutError&) {
        close(link.fd);  // the request may have been handled: no retry
        throw;
      } catch (const RuntimeFault&) {
        close(link.fd);  // the stream may be mid-message: never reuse it
        // The server closes connections idle for long: a pooled one may have
        // been closed just before this request went out. It did not handle
        // the request then (it closes only connections with nothing in
        // flight), so one retry on a fresh connection is safe.
        if (reused && !answered && attempt == 0) continue;
        throw;
      } catch (...) {
        close(link.fd);
        throw;
      }
      ++link.requests;
      release(link);
      if (static_cast<uint8_t>(body[0]) == sp::kError) {
        sp::Reader r(body.data(), body.size());
        r.u8();
        std::string message;
        try {
          message = r.str();
        } catch (const sp::ProtocolError&) {
          message = "(no message)";
        }
        throw ContractError("kolo store " + where() + ": " + what + ": " + message);
      }
      return body;
    }
  }

  // One reply frame: with a secret, its header tag is checked before the
  // message is read, and its message tag after.
  std::string read_reply(const Link& link, Clock::time_point deadline, const std::string& what,
                         bool& answered) {
    const bool authenticated = !secret_.empty();
    const std::string header =
        recv_exactly(link.fd, sp::header_bytes(authenticated), deadline, what, answered);
    if (authenticated &&
        !sp::header_valid(secret_, 'R', link.nonce, link.requests, header.data())) {
      lost(what,
           "a reply without a valid tag of this job's secret (KOLO_JOB_SECRET differs from "
           "the server's, or another process answered)");
    }
    const uint32_t bytes = sp::get_u32(header.data());
    if (bytes == 0 || bytes > sp::kMaxFrameBytes) lost(what, "malformed reply");
    std::string body = recv_exactly(link.fd, bytes + (authenticated ? sp::kTagBytes : 0), deadline,
                                    what, answered);
    if (authenticated) {
      if (!sp::message_valid(secret_, 'R', link.nonce, link.requests, body.data(), bytes)) {
        lost(what, "a reply whose tag does not match its contents");
      }
      body.resize(bytes);
    }
    return body;
  }

  std::string read_frame(int fd, Clock::time_point deadline, const std::string& what) {
    bool answered = false;
    const std::string header = recv_exactly(fd, 4, deadline, what, answered);
    const uint32_t body_bytes = sp::get_u32(header.data());
    if (body_bytes == 0 || body_bytes > sp::kMaxFrameBytes) lost(what, "malformed reply");
    return recv_exactly(fd, body_bytes, deadline, what, answered);
  }

  // A pooled connection (`reused`) or a new one. A pooled one that the
  // server has closed (idle) reads as ready: it is dropped.
  Link acquire(bool& reused) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (!idle_.empty()) {
        Link link = idle_.back();
        idle_.pop_back();
        pollfd p{link.fd, POLLIN, 0};
        if (poll(&p, 1, 0) != 0) {  // closed by the server (it never speaks first)
          close(link.fd);
          continue;
        }
        reused = true;
        return link;
      }
    }
    reused = false;
    return open_connection();
  }

  void release(const Link& link) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(link);
  }

  void send_all(int fd, const std::string& data, const std::string& what) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t sent = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (sent < 0 && errno == EINTR) continue;
      if (sent <= 0) lost(what, errno_text(errno));
      done += static_cast<size_t>(sent);
    }
  }

  // `answered` becomes true once any byte arrived.
  std::string recv_exactly(int fd, size_t n, Clock::time_point deadline, const std::string& what,
                           bool& answered) {
    std::string out(n, '\0');
    size_t done = 0;
    while (done < n) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        throw TimeoutError("kolo store: the rendezvous store at " + where() + " did not answer " +
                           what +
                           " in time; is the server overloaded or "
                           "its host unreachable?");
      }
      pollfd p{fd, POLLIN, 0};
      int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) continue;
      ssize_t got = recv(fd, out.data() + done, n - done, 0);
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got == 0) lost(what, "connection closed by the server");
      if (got < 0) lost(what, errno_text(errno));
      answered = true;
      done += static_cast<size_t>(got);
    }
    return out;
  }

  // Connects (retrying refused/unreachable attempts until connect_timeout_)
  // and, when authenticated, reads the server's nonce.
  Link open_connection() {
    Link link;
    link.fd = connect_socket();
    if (!secret_.empty()) {
      try {
        link.nonce = read_frame(link.fd, Clock::now() + std::max(connect_timeout_, kReplyGrace),
                                "the authentication handshake");
      } catch (...) {
        close(link.fd);
        throw;
      }
      if (link.nonce.size() != sp::kNonceBytes) {
        close(link.fd);
        lost("the authentication handshake",
             "the server sent no nonce (it serves the store without a secret: unset "
             "KOLO_JOB_SECRET)");
      }
    }
    return link;
  }

  int connect_socket() {
    auto deadline = Clock::now() + connect_timeout_;
    std::string last_error = "no attempt made";
    for (;;) {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* found = nullptr;
      int rc = getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found);
      if (rc != 0) {
        last_error = std::string("cannot resolve host: ") + gai_strerror(rc);
      } else {
        for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
          int fd = try_connect(a, deadline, last_error);
          if (fd >= 0) {
            freeaddrinfo(found);
            set_nodelay(fd);
            return fd;
          }
        }
        freeaddrinfo(found);
      }
      if (Clock::now() + std::chrono::milliseconds(50) >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    throw RuntimeFault("kolo store: cannot connect to the rendezvous store at " + where() +
                       " within " + std::to_string(connect_timeout_.count()) + " ms (" +
                       last_error +
                       "); check that kolorun (or rank 0) is serving it and that the address "
                       "and port (KOLO_STORE_ADDR/KOLO_STORE_PORT or MASTER_ADDR/MASTER_PORT) "
                       "are right");
  }

  // Non-blocking connect bounded by `deadline`; returns a blocking fd or -1.
  static int try_connect(const addrinfo* a, Clock::time_point deadline, std::string& last_error) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last_error = errno_text(errno);
      return -1;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last_error = errno_text(errno);
        close(fd);
        return -1;
      }
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd p{fd, POLLOUT, 0};
      int ready = poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left)));
      int error = 0;
      socklen_t length = sizeof(error);
      if (ready <= 0) {
        last_error = "connect timed out";
        close(fd);
        return -1;
      }
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        last_error = errno_text(error);
        close(fd);
        return -1;
      }
    }
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
  }

  const std::string host_;
  const int port_;
  const std::chrono::milliseconds connect_timeout_;
  const std::string secret_;
  std::mutex mutex_;
  std::vector<Link> idle_;  // connected, not in use
};

}  // namespace

std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port,
                                         std::chrono::milliseconds connect_timeout,
                                         const std::string& secret) {
  if (port <= 0 || port > 65535) {
    throw ContractError("kolo connect_tcp_store: port " + std::to_string(port) +
                        " is not in [1, 65535]");
  }
  if (host.empty()) {
    throw ContractError("kolo connect_tcp_store: empty host; give an address such as 127.0.0.1");
  }
  return std::make_shared<TcpStore>(host, port, connect_timeout, secret);
}

}  // namespace kolo

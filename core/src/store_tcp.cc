// TCP rendezvous store: a single-threaded poll() server and a thread-safe client.
//
// Wire protocol (all integers little-endian):
//   frame    = u32 body_bytes, body
//   request  = u8 op, fields...      string = u32 length, bytes
//     kSet   key value               -> kOk
//     kGet   key i64 timeout_ms      -> kOk value | kTimeout
//     kAdd   key i64 delta           -> kOk i64 new_value | kError message
//     kCheck u32 n, n * key          -> kOk u8 all_present
//     kWait  u32 n, n * key, i64 timeout_ms -> kOk | kTimeout u32 n, n * missing key
//     kErase key                     -> kOk u8 existed
//   response = u8 status, fields...
// A client sends one request at a time per connection. Blocking requests (get,
// wait) are parked on the server and answered when their keys appear or their
// deadline passes, so clients never poll. The client keeps a small pool of
// connections so that threads sharing one Store do not serialise behind a
// blocked get.
//
// Authentication (Options::secret set on both sides): on accept the server
// sends one frame holding a 16-byte random nonce. Every later frame body is
// tag(32 bytes) + message, tag = HMAC-SHA256(secret, d + nonce + u64 n +
// message) with d = 'q' for requests and 'r' for replies and n the index of
// the request on this connection. A bad tag closes the connection (and is
// reported through Options::on_reject); the client raises RuntimeFault.
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
#include <random>
#include <thread>
#include <unordered_map>

#include "kolo/core/errors.h"
#include "hmac_sha256.h"
#include "kolo/core/store.h"

namespace kolo {
namespace {

using Clock = std::chrono::steady_clock;

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5, kErase = 6 };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

// Largest frame either side accepts; a bigger length prefix means a corrupt or
// foreign peer.
constexpr uint32_t kMaxFrameBytes = 1u << 30;

std::string errno_text(int error) { return std::strerror(error); }

// ---- encoding ----

class Writer {
 public:
  void u8(uint8_t v) { body_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) body_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void i64(int64_t v) {
    uint64_t u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) body_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    body_.append(s);
  }
  void bytes(const Bytes& b) {
    u32(static_cast<uint32_t>(b.size()));
    body_.append(reinterpret_cast<const char*>(b.data()), b.size());
  }
  const std::string& body() const { return body_; }
  // The body with its length prefix.
  std::string frame() const {
    Writer w;
    w.u32(static_cast<uint32_t>(body_.size()));
    return w.body_ + body_;
  }

 private:
  std::string body_;
};

// Thrown by Reader on a malformed body (the server drops such a client).
struct ProtocolError : RuntimeFault {
  explicit ProtocolError(const std::string& what)
      : RuntimeFault("kolo store: malformed message (" + what + ")") {}
};

class Reader {
 public:
  Reader(const char* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(data_[pos_++]);
  }
  uint32_t u32() {
    need(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += 4;
    return v;
  }
  int64_t i64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    pos_ += 8;
    return static_cast<int64_t>(v);
  }
  std::string str() {
    uint32_t n = u32();
    need(n);
    std::string s(data_ + pos_, n);
    pos_ += n;
    return s;
  }
  Bytes bytes() {
    uint32_t n = u32();
    need(n);
    Bytes b(reinterpret_cast<const uint8_t*>(data_ + pos_),
            reinterpret_cast<const uint8_t*>(data_ + pos_ + n));
    pos_ += n;
    return b;
  }

 private:
  void need(size_t n) {
    if (size_ - pos_ < n) throw ProtocolError("truncated");
  }
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

uint32_t peek_u32(const std::string& buffer) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(static_cast<uint8_t>(buffer[i])) << (8 * i);
  return v;
}

std::string quoted_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "'" : ", '") + key + "'";
  return out;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

constexpr size_t kNonceBytes = 16;
constexpr size_t kTagBytes = 32;

std::string random_nonce() {
  std::random_device device;
  std::string nonce;
  while (nonce.size() < kNonceBytes) {
    uint32_t word = device();
    nonce.append(reinterpret_cast<const char*>(&word), sizeof(word));
  }
  return nonce.substr(0, kNonceBytes);
}

std::string tag_of(const std::string& secret, char direction, const std::string& nonce,
                   uint64_t counter, const char* message, size_t bytes) {
  std::string text;
  text.reserve(1 + nonce.size() + 8 + bytes);
  text += direction;
  text += nonce;
  for (int i = 0; i < 8; ++i) text += static_cast<char>((counter >> (8 * i)) & 0xff);
  text.append(message, bytes);
  detail::Digest digest = detail::hmac_sha256(secret, text);
  return std::string(reinterpret_cast<const char*>(digest.data()), digest.size());
}

// A frame holding `body` ("" secret: unsigned).
std::string seal(const std::string& secret, char direction, const std::string& nonce,
                 uint64_t counter, const std::string& body) {
  std::string payload =
      secret.empty() ? body
                     : tag_of(secret, direction, nonce, counter, body.data(), body.size()) + body;
  std::string frame(4, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((payload.size() >> (8 * i)) & 0xff);
  return frame + payload;
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
  std::string nonce;      // authenticated servers: sent on accept
  uint64_t requests = 0;  // requests handled (the tag counter)
  std::string in;   // received, not yet handled
  std::string out;  // to send
  // A parked get/wait: answered when `keys` all exist or at `deadline`.
  bool parked = false;
  uint8_t parked_op = 0;
  std::vector<std::string> parked_keys;
  Clock::time_point deadline;
};

}  // namespace

struct TcpStoreServer::Impl {
  std::string secret;
  std::function<void(const std::string&)> on_reject;
  int listen_fd = -1;
  int wake_fd = -1;  // eventfd: the destructor asks the thread to stop
  int port = 0;
  std::thread thread;
  // Owned by the server thread only.
  std::unordered_map<std::string, Bytes> data;
  std::map<int, Connection> connections;  // by fd

  void run();
  void accept_all();
  // Handles buffered requests of `c` until it parks or runs out of input;
  // returns whether the store changed. False from `ok` means: drop the client.
  bool handle_input(Connection& c, bool& ok);
  bool handle_request(Connection& c, Reader& r);  // returns whether the store changed
  // Queues one reply (signed under the request's counter when authenticated).
  void reply(Connection& c, const Writer& w);
  // Answers a parked request if its keys exist or its deadline passed.
  void try_unpark(Connection& c, Clock::time_point now);
  void flush(Connection& c, bool& ok);
  bool all_present(const std::vector<std::string>& keys) const {
    for (const auto& key : keys)
      if (!data.count(key)) return false;
    return true;
  }
};

TcpStoreServer::TcpStoreServer(const Options& options) : impl_(std::make_unique<Impl>()) {
  impl_->secret = options.secret;
  impl_->on_reject = options.on_reject;
  const std::string where = options.bind_address + ":" + std::to_string(options.port);
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
    // Sleep until I/O or the earliest parked deadline.
    Clock::time_point now = Clock::now();
    int timeout_ms = -1;
    for (auto& entry : connections) {
      if (!entry.second.parked) continue;
      auto left = std::chrono::ceil<std::chrono::milliseconds>(entry.second.deadline - now);
      int ms = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left.count(), 1 << 30)));
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }
    fds.clear();
    fds.push_back({wake_fd, POLLIN, 0});
    fds.push_back({listen_fd, POLLIN, 0});
    for (auto& entry : connections) {
      short events = POLLIN;
      if (!entry.second.out.empty()) events |= POLLOUT;
      fds.push_back({entry.first, events, 0});
    }
    int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) return;  // poll on valid fds does not fail otherwise
    if (fds[0].revents) return;           // destructor asked us to stop
    if (fds[1].revents & POLLIN) accept_all();

    dropped.clear();
    for (size_t i = 2; i < fds.size(); ++i) {
      auto it = connections.find(fds[i].fd);
      if (it == connections.end()) continue;
      Connection& c = it->second;
      bool ok = true;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buffer[65536];
        for (;;) {
          ssize_t got = recv(c.fd, buffer, sizeof(buffer), 0);
          if (got > 0) {
            c.in.append(buffer, static_cast<size_t>(got));
            continue;
          }
          if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) ok = false;
          if (got < 0 && errno == EINTR) continue;
          break;
        }
      }
      if (ok) handle_input(c, ok);
      if (ok && (fds[i].revents & POLLOUT)) flush(c, ok);
      if (!ok) dropped.push_back(c.fd);
    }
    for (int fd : dropped) {
      close(fd);
      connections.erase(fd);
    }
    // A set or add may release parked requests, whose answers may let further
    // buffered requests of those clients run (and change the store again).
    now = Clock::now();
    bool again = true;
    while (again) {
      again = false;
      dropped.clear();
      for (auto& entry : connections) {
        Connection& c = entry.second;
        if (!c.parked) continue;
        try_unpark(c, now);
        if (c.parked) continue;
        bool ok = true;
        if (handle_input(c, ok)) again = true;
        if (ok) flush(c, ok);
        if (!ok) dropped.push_back(c.fd);
      }
      for (int fd : dropped) {
        close(fd);
        connections.erase(fd);
      }
    }
  }
}

void TcpStoreServer::Impl::accept_all() {
  for (;;) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of descriptors: the listening socket stays readable, so back off
      // instead of spinning. Otherwise EAGAIN, or a client that gave up.
      if (errno == EMFILE || errno == ENFILE) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return;
    }
    set_nodelay(fd);
    Connection& c = connections[fd];
    c.fd = fd;
    if (!secret.empty()) {
      c.nonce = random_nonce();
      c.out = seal("", 0, "", 0, c.nonce);  // the challenge itself is not signed
      bool ok = true;
      flush(c, ok);
      if (!ok) {
        close(fd);
        connections.erase(fd);
      }
    }
  }
}

bool TcpStoreServer::Impl::handle_input(Connection& c, bool& ok) {
  bool changed = false;
  while (ok && !c.parked && c.in.size() >= 4) {
    uint32_t body_bytes = peek_u32(c.in);
    if (body_bytes > kMaxFrameBytes) {
      ok = false;  // not our protocol
      break;
    }
    if (c.in.size() < 4 + size_t(body_bytes)) break;
    const char* body = c.in.data() + 4;
    size_t message_bytes = body_bytes;
    if (!secret.empty()) {
      const bool signed_ok =
          body_bytes >= kTagBytes &&
          detail::digest_equal(
              reinterpret_cast<const uint8_t*>(body),
              reinterpret_cast<const uint8_t*>(
                  tag_of(secret, 'q', c.nonce, c.requests, body + kTagBytes, body_bytes - kTagBytes)
                      .data()),
              kTagBytes);
      if (!signed_ok) {
        if (on_reject) {
          on_reject("rejected a connection from " + peer_address(c.fd) +
                    ": a message without a valid tag of this job's secret (request " +
                    std::to_string(c.requests) + " on the connection)");
        }
        ok = false;
        break;
      }
      body += kTagBytes;
      message_bytes -= kTagBytes;
    }
    Reader r(body, message_bytes);
    try {
      changed |= handle_request(c, r);
    } catch (const std::exception&) {
      ok = false;  // malformed request (ProtocolError) or out of memory: drop this client
    }
    c.in.erase(0, 4 + size_t(body_bytes));
  }
  if (ok) flush(c, ok);
  return changed;
}

bool TcpStoreServer::Impl::handle_request(Connection& c, Reader& r) {
  Writer w;
  uint8_t op = r.u8();
  switch (op) {
    case kSet: {
      std::string key = r.str();
      data[key] = r.bytes();
      w.u8(kOk);
      reply(c, w);
      return true;
    }
    case kGet: {
      c.parked_keys = {r.str()};
      int64_t timeout_ms = r.i64();
      c.parked = true;
      c.parked_op = kGet;
      c.deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms));
      try_unpark(c, Clock::time_point::min());  // answers at once if the key exists
      return false;
    }
    case kWait: {
      uint32_t n = r.u32();
      std::vector<std::string> keys;
      for (uint32_t i = 0; i < n; ++i) keys.push_back(r.str());
      int64_t timeout_ms = r.i64();
      c.parked_keys = std::move(keys);
      c.parked = true;
      c.parked_op = kWait;
      c.deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms));
      try_unpark(c, Clock::time_point::min());
      return false;
    }
    case kAdd: {
      std::string key = r.str();
      int64_t delta = r.i64();
      int64_t value = 0;
      auto it = data.find(key);
      if (it != data.end()) {
        std::string text(it->second.begin(), it->second.end());
        char* end = nullptr;
        errno = 0;
        long long parsed = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno != 0) {
          w.u8(kError);
          w.str("the existing value of '" + key + "' is not a decimal integer");
          reply(c, w);
          return false;
        }
        value = parsed;
      }
      value += delta;
      std::string text = std::to_string(value);
      data[key] = Bytes(text.begin(), text.end());
      w.u8(kOk);
      w.i64(value);
      reply(c, w);
      return true;
    }
    case kCheck: {
      uint32_t n = r.u32();
      bool present = true;
      for (uint32_t i = 0; i < n; ++i) present &= data.count(r.str()) > 0;
      w.u8(kOk);
      w.u8(present ? 1 : 0);
      reply(c, w);
      return false;
    }
    case kErase: {
      bool existed = data.erase(r.str()) > 0;
      w.u8(kOk);
      w.u8(existed ? 1 : 0);
      reply(c, w);
      return existed;
    }
    default:
      throw ProtocolError("unknown op");
  }
}

void TcpStoreServer::Impl::reply(Connection& c, const Writer& w) {
  if (secret.empty()) {
    c.out += w.frame();
  } else {
    c.out += seal(secret, 'r', c.nonce, c.requests, w.body());
  }
  ++c.requests;
}

void TcpStoreServer::Impl::try_unpark(Connection& c, Clock::time_point now) {
  if (!c.parked) return;
  Writer w;
  if (all_present(c.parked_keys)) {
    w.u8(kOk);
    if (c.parked_op == kGet) w.bytes(data[c.parked_keys[0]]);
  } else if (now >= c.deadline) {
    w.u8(kTimeout);
    if (c.parked_op == kWait) {
      std::vector<std::string> missing;
      for (const auto& key : c.parked_keys)
        if (!data.count(key)) missing.push_back(key);
      w.u32(static_cast<uint32_t>(missing.size()));
      for (const auto& key : missing) w.str(key);
    }
  } else {
    return;
  }
  reply(c, w);
  c.parked = false;
  c.parked_keys.clear();
}

void TcpStoreServer::Impl::flush(Connection& c, bool& ok) {
  while (!c.out.empty()) {
    ssize_t sent = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (sent > 0) {
      c.out.erase(0, static_cast<size_t>(sent));
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // POLLOUT later
    ok = false;
    return;
  }
}

// ---- client ----

namespace {

// Extra time a client waits for an answer beyond the request's own timeout
// before it declares the server unresponsive (the server answers parked
// requests itself at their deadline).
constexpr std::chrono::milliseconds kReplyGrace{30000};

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
    if (value.size() + key.size() > kMaxFrameBytes - 64) {
      throw ContractError("kolo store: set('" + key + "'): value of " +
                          std::to_string(value.size()) + " bytes exceeds the limit of " +
                          std::to_string(kMaxFrameBytes - 64) + " bytes");
    }
    Writer w;
    w.u8(kSet);
    w.str(key);
    w.bytes(value);
    call("set('" + key + "')", w, std::chrono::milliseconds(0));
  }

  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    Writer w;
    w.u8(kGet);
    w.str(key);
    w.i64(timeout.count());
    std::string reply = call("get('" + key + "')", w, timeout);
    Reader r(reply.data(), reply.size());
    uint8_t status = r.u8();
    if (status == kTimeout) {
      throw TimeoutError("kolo store " + where() + ": get timed out after " +
                         std::to_string(timeout.count()) + " ms waiting for key '" + key +
                         "'; the rank that should set it has not arrived (is it running?)");
    }
    return r.bytes();
  }

  int64_t add(const std::string& key, int64_t delta) override {
    Writer w;
    w.u8(kAdd);
    w.str(key);
    w.i64(delta);
    std::string reply = call("add('" + key + "')", w, std::chrono::milliseconds(0));
    Reader r(reply.data(), reply.size());
    if (r.u8() == kError) throw ContractError("kolo store " + where() + ": add: " + r.str());
    return r.i64();
  }

  bool check(const std::vector<std::string>& keys) override {
    Writer w;
    w.u8(kCheck);
    w.u32(static_cast<uint32_t>(keys.size()));
    for (const auto& key : keys) w.str(key);
    std::string reply = call("check", w, std::chrono::milliseconds(0));
    Reader r(reply.data(), reply.size());
    r.u8();
    return r.u8() != 0;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    Writer w;
    w.u8(kWait);
    w.u32(static_cast<uint32_t>(keys.size()));
    for (const auto& key : keys) w.str(key);
    w.i64(timeout.count());
    std::string reply = call("wait", w, timeout);
    Reader r(reply.data(), reply.size());
    if (r.u8() == kTimeout) {
      std::vector<std::string> missing(r.u32());
      for (auto& key : missing) key = r.str();
      throw TimeoutError("kolo store " + where() + ": wait timed out after " +
                         std::to_string(timeout.count()) +
                         " ms; missing keys: " + quoted_keys(missing));
    }
  }

  bool erase(const std::string& key) override {
    Writer w;
    w.u8(kErase);
    w.str(key);
    std::string reply = call("erase('" + key + "')", w, std::chrono::milliseconds(0));
    Reader r(reply.data(), reply.size());
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

  // Sends one request on a pooled connection and returns the reply body.
  std::string call(const std::string& what, const Writer& request,
                   std::chrono::milliseconds timeout) {
    Link link = acquire();
    try {
      auto deadline = Clock::now() + std::max(timeout, std::chrono::milliseconds(0)) +
                      std::max(connect_timeout_, kReplyGrace);
      send_all(link.fd, seal(secret_, 'q', link.nonce, link.requests, request.body()), what);
      std::string body = read_frame(link.fd, deadline, what);
      if (!secret_.empty()) {
        const std::string tag = body.size() >= kTagBytes
                                    ? tag_of(secret_, 'r', link.nonce, link.requests,
                                             body.data() + kTagBytes, body.size() - kTagBytes)
                                    : std::string();
        if (tag.empty() || !detail::digest_equal(reinterpret_cast<const uint8_t*>(body.data()),
                                                 reinterpret_cast<const uint8_t*>(tag.data()),
                                                 kTagBytes)) {
          lost(what,
               "a reply without a valid tag of this job's secret (KOLO_JOB_SECRET differs from "
               "the server's, or another process answered)");
        }
        body.erase(0, kTagBytes);
        if (body.empty()) lost(what, "malformed reply");
      }
      ++link.requests;
      release(link);
      return body;
    } catch (...) {
      close(link.fd);  // the stream may be mid-message: never reuse it
      throw;
    }
  }

  std::string read_frame(int fd, Clock::time_point deadline, const std::string& what) {
    std::string header = recv_exactly(fd, 4, deadline, what);
    uint32_t body_bytes = peek_u32(header);
    if (body_bytes == 0 || body_bytes > kMaxFrameBytes) lost(what, "malformed reply");
    return recv_exactly(fd, body_bytes, deadline, what);
  }

  Link acquire() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!idle_.empty()) {
        Link link = idle_.back();
        idle_.pop_back();
        return link;
      }
    }
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

  std::string recv_exactly(int fd, size_t n, Clock::time_point deadline, const std::string& what) {
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
      if (link.nonce.size() != kNonceBytes) {
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

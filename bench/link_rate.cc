#include "link_rate.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo::bench {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& what) {
  throw RuntimeFault("kolo-bench link rate: " + what + ": " + std::strerror(errno));
}

// Closes the descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

Fd connect_to(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    throw RuntimeFault("kolo-bench link rate: cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  Fd fd(socket(AF_INET, SOCK_STREAM, 0));
  const int connected = fd.fd < 0 ? -1 : connect(fd.fd, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  if (connected != 0) fail("connect to " + host + ":" + std::to_string(port));
  return fd;
}

// Receiver: accepts `streams` connections and reads each to its end.
double receive(Store& store, const std::string& key, int streams) {
  Fd listener(socket(AF_INET, SOCK_STREAM, 0));
  if (listener.fd < 0) fail("socket");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(address);
  if (bind(listener.fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener.fd, streams) != 0 ||
      getsockname(listener.fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    fail("listen");
  }
  const std::string where = host_name() + " " + std::to_string(ntohs(address.sin_port));
  store.set(key, Bytes(where.begin(), where.end()));
  std::vector<Fd> peers;
  for (int s = 0; s < streams; ++s) {
    peers.emplace_back(accept(listener.fd, nullptr, nullptr));
    if (peers.back().fd < 0) fail("accept");
  }
  std::atomic<int64_t> total{0};
  std::atomic<int64_t> first_ns{INT64_MAX}, last_ns{0};
  const auto origin = Clock::now();
  std::vector<std::thread> readers;
  for (auto& peer : peers) {
    readers.emplace_back([&, fd = peer.fd] {
      std::vector<char> buffer(size_t{1} << 20);
      for (;;) {
        const ssize_t got = recv(fd, buffer.data(), buffer.size(), 0);
        if (got <= 0) break;
        const int64_t at = (Clock::now() - origin).count();
        int64_t seen = first_ns.load();
        while (at < seen && !first_ns.compare_exchange_weak(seen, at)) {
        }
        seen = last_ns.load();
        while (at > seen && !last_ns.compare_exchange_weak(seen, at)) {
        }
        total += got;
      }
    });
  }
  for (auto& reader : readers) reader.join();
  const double seconds = static_cast<double>(last_ns - first_ns) * 1e-9;
  return seconds > 0 ? static_cast<double>(total) / seconds : 0.0;
}

// Sender: `streams` connections, each sending until the deadline.
void send_for(Store& store, const std::string& key, int streams, double seconds) {
  const Bytes where = store.get(key, std::chrono::seconds(60));
  const std::string text(where.begin(), where.end());
  const size_t space = text.find(' ');
  const std::string host = text.substr(0, space);
  const int port = std::stoi(text.substr(space + 1));
  std::vector<Fd> sockets;
  for (int s = 0; s < streams; ++s) sockets.push_back(connect_to(host, port));
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  std::vector<std::thread> writers;
  for (auto& socket_fd : sockets) {
    writers.emplace_back([&deadline, fd = socket_fd.fd] {
      std::vector<char> buffer(size_t{1} << 20, 1);
      while (Clock::now() < deadline) {
        if (send(fd, buffer.data(), buffer.size(), MSG_NOSIGNAL) < 0) break;
      }
      shutdown(fd, SHUT_WR);
    });
  }
  for (auto& writer : writers) writer.join();
}

}  // namespace

double measure_link_rate(Communicator& world, Store& store, const LinkRateOptions& options) {
  const std::string& key = options.key;
  double rate = 0;
  if (world.rank() == options.receiver) {
    rate = receive(store, key, options.streams);
  } else if (world.rank() == options.sender) {
    send_for(store, key, options.streams, options.seconds);
  }
  world.allreduce(&rate, &rate, 1, DType::kF64, {});  // only the receiver's is non-zero
  return rate;
}

}  // namespace kolo::bench

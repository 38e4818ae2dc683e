// `kolo-bench store-attack` (store_attack.h).
#include "store_attack.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

namespace kolo::bench {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A non-blocking TCP connection to host:port, or -1.
int connect_to(const AttackOptions& o) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(o.host.c_str(), std::to_string(o.port).c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

std::string u32_le(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// An unsigned request frame (what a client without a secret sends).
std::string frame(const std::string& message) {
  return u32_le(static_cast<uint32_t>(message.size())) + message;
}

std::string str(const std::string& s) { return u32_le(static_cast<uint32_t>(s.size())) + s; }

// Reads and drops what is there; true when the server closed the connection.
bool drain_closed(int fd) {
  char buffer[65536];
  for (;;) {
    const ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
    if (got > 0) continue;
    if (got == 0) return true;
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }
}

// Samples the watched process's resident size.
struct Sampler {
  explicit Sampler(pid_t pid) : pid(pid) { sample(); }
  void sample() {
    if (pid > 0) peak = std::max(peak, resident_bytes(pid));
  }
  pid_t pid;
  int64_t peak = 0;
};

// Sends `bytes` once, as far as the socket takes them, sampling meanwhile;
// returns the bytes sent (stops at a close, or when `deadline` passes).
int64_t send_until(int fd, const std::string& bytes, Clock::time_point deadline, Sampler& sampler) {
  size_t sent = 0;
  while (sent < bytes.size() && Clock::now() < deadline) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) break;
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, 20);
    sampler.sample();
  }
  return static_cast<int64_t>(sent);
}

}  // namespace

int64_t resident_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

int listening_port(pid_t pid) {
  // The socket inodes the process holds...
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* dir = opendir(fd_dir.c_str())) {
    while (dirent* entry = readdir(dir)) {
      char target[256] = {};
      const std::string link = fd_dir + "/" + entry->d_name;
      const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      const std::string text(target, n > 0 ? static_cast<size_t>(n) : 0);
      if (text.rfind("socket:[", 0) == 0) inodes.insert(text.substr(8, text.size() - 9));
    }
    closedir(dir);
  }
  // ...and which of them listens (state 0A) on which local port.
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state == "0A" && inodes.count(inode)) {
        return static_cast<int>(std::stoul(local.substr(local.find(':') + 1), nullptr, 16));
      }
    }
  }
  return 0;
}

AttackResult attack_big_frame(const AttackOptions& o) {
  AttackResult r;
  r.name = "big-frame";
  Sampler sampler(o.watch_pid);
  const int fd = connect_to(o);
  if (fd < 0) return r;
  r.connections = 1;
  const auto deadline = Clock::now() + o.duration;
  // 1 GiB announced; 32 bytes where an authenticated frame has its header tag.
  r.bytes_sent = send_until(fd, u32_le(1u << 30) + std::string(32, 'T'), deadline, sampler);
  const std::string chunk(1 << 20, 'x');
  bool closed = false;
  while (!closed && r.bytes_sent < (int64_t{1} << 30) && Clock::now() < deadline) {
    const int64_t n = send_until(fd, chunk, deadline, sampler);
    r.bytes_sent += n;
    closed = drain_closed(fd) || n < static_cast<int64_t>(chunk.size());
  }
  // Was it closed (now or within a second)?
  for (int i = 0; i < 50 && !closed; ++i) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) > 0) closed = drain_closed(fd);
    sampler.sample();
  }
  r.closed_by_server = closed ? 1 : 0;
  close(fd);
  r.peak_rss_bytes = sampler.peak;
  return r;
}

AttackResult attack_unread_replies(const AttackOptions& o) {
  AttackResult r;
  r.name = "unread-replies";
  Sampler sampler(o.watch_pid);
  const int fd = connect_to(o);
  if (fd < 0) return r;
  r.connections = 1;
  const auto deadline = Clock::now() + o.duration;
  const std::string key = "kolo-store-attack/big";
  // set(key, 256 KiB), then gets with timeout 0, never read; finally erase.
  std::string requests = frame(std::string(1, 1) + str(key) + str(std::string(256 << 10, 'v')));
  const std::string get = frame(std::string(1, 2) + str(key) + std::string(8, '\0'));
  for (int i = 0; i < 4000; ++i) requests += get;  // 1000 MiB of replies asked for
  r.bytes_sent = send_until(fd, requests, deadline, sampler);
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
    sampler.sample();
  }
  close(fd);
  // Remove the value again through a well-behaved connection.
  const int cleanup = connect_to(o);
  if (cleanup >= 0) {
    const std::string erase = frame(std::string(1, 6) + str(key));
    Sampler ignored(0);
    send_until(cleanup, erase, Clock::now() + std::chrono::seconds(2), ignored);
    pollfd p{cleanup, POLLIN, 0};
    poll(&p, 1, 2000);
    close(cleanup);
  }
  r.peak_rss_bytes = sampler.peak;
  return r;
}

namespace {

// Opens `count` connections, sends `opening` on each, holds them for the
// attack's duration and counts those the server closed.
AttackResult hold_connections(const AttackOptions& o, const std::string& name, int count,
                              const std::string& opening) {
  AttackResult r;
  r.name = name;
  Sampler sampler(o.watch_pid);
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    const int fd = connect_to(o);
    if (fd < 0) break;
    if (!opening.empty()) send(fd, opening.data(), opening.size(), MSG_NOSIGNAL);
    fds.push_back(fd);
    if (i % 100 == 0) sampler.sample();
  }
  r.connections = static_cast<int>(fds.size());
  r.bytes_sent = static_cast<int64_t>(fds.size() * opening.size());
  std::vector<bool> closed(fds.size(), false);
  const auto deadline = Clock::now() + o.duration;
  while (Clock::now() < deadline) {
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!closed[i]) closed[i] = drain_closed(fds[i]);
    }
    sampler.sample();
    std::this_thread::sleep_for(milliseconds(50));
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!closed[i]) closed[i] = drain_closed(fds[i]);
    r.closed_by_server += closed[i] ? 1 : 0;
    close(fds[i]);
  }
  r.peak_rss_bytes = sampler.peak;
  return r;
}

}  // namespace

AttackResult attack_connection_flood(const AttackOptions& o, int connections) {
  return hold_connections(o, "connection-flood", connections, "");
}

AttackResult attack_half_frames(const AttackOptions& o, int connections) {
  return hold_connections(o, "half-frames", connections, std::string("\x10\x00", 2));
}

int run_store_attack_bench(const StoreAttackOptions& options) {
  AttackOptions o;
  o.host = options.host;
  o.port = options.port > 0 ? options.port : listening_port(options.pid);
  o.watch_pid = options.pid;
  o.duration = milliseconds(static_cast<int64_t>(options.seconds_per_attack * 1000));
  if (o.port == 0) {
    std::cerr << "kolo-bench store-attack: process " << options.pid
              << " listens on no TCP port (give --port)" << std::endl;
    return 1;
  }
  const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  const int64_t idle = resident_bytes(options.pid);
  if (!options.json) {
    std::printf("store at %s:%d, process %d: %.1f MiB resident before the attacks\n",
                o.host.c_str(), o.port, static_cast<int>(options.pid), mib(idle));
    std::printf("%-17s %12s %12s %10s %10s %10s\n", "attack", "sent_MiB", "connections", "closed",
                "peak_MiB", "after_MiB");
  }
  const std::vector<AttackResult (*)(const AttackOptions&)> attacks = {
      attack_big_frame, attack_unread_replies,
      [](const AttackOptions& a) { return attack_connection_flood(a); },
      [](const AttackOptions& a) { return attack_half_frames(a); }};
  for (const auto& attack : attacks) {
    const AttackResult r = attack(o);
    std::this_thread::sleep_for(milliseconds(200));
    const int64_t after = resident_bytes(options.pid);
    if (options.json) {
      std::printf(
          "{\"attack\": \"%s\", \"sent_bytes\": %lld, \"connections\": %d, "
          "\"closed_by_server\": %d, \"idle_rss_bytes\": %lld, \"peak_rss_bytes\": %lld, "
          "\"after_rss_bytes\": %lld}\n",
          r.name.c_str(), static_cast<long long>(r.bytes_sent), r.connections, r.closed_by_server,
          static_cast<long long>(idle), static_cast<long long>(r.peak_rss_bytes),
          static_cast<long long>(after));
    } else {
      std::printf("%-17s %12.1f %12d %10d %10.1f %10.1f\n", r.name.c_str(), mib(r.bytes_sent),
                  r.connections, r.closed_by_server, mib(r.peak_rss_bytes), mib(after));
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace kolo::bench

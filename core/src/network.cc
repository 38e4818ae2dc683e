// reachable_address (topology.h): which of this host's addresses its peers reach.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>

#include "kolo/core/topology.h"

namespace kolo {
namespace {

bool is_loopback(const sockaddr_in& address) {
  return (ntohl(address.sin_addr.s_addr) >> 24) == 127;
}

std::string text_of(const sockaddr_in& address) {
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &address.sin_addr, text, sizeof(text));
  return text;
}

// Every IPv4 address `host` resolves to (none when it does not resolve).
std::vector<sockaddr_in> resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  std::vector<sockaddr_in> addresses;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return addresses;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    addresses.push_back(*reinterpret_cast<const sockaddr_in*>(a->ai_addr));
  }
  freeaddrinfo(found);
  return addresses;
}

// The source address the kernel picks for packets to `peer`: connect() on a
// UDP socket routes without sending anything.
std::optional<sockaddr_in> route_source(sockaddr_in peer) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  peer.sin_port = htons(9);  // any port: nothing is sent
  std::optional<sockaddr_in> source;
  sockaddr_in local{};
  socklen_t length = sizeof(local);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&peer), sizeof(peer)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
    source = local;
  }
  close(fd);
  return source;
}

}  // namespace

std::string reachable_address(const std::string& this_host,
                              const std::vector<std::string>& peer_hosts) {
  for (const auto& address : resolve(this_host)) {
    if (!is_loopback(address)) return text_of(address);
  }
  for (const auto& peer : peer_hosts) {
    if (peer == this_host) continue;
    for (const auto& address : resolve(peer)) {
      if (is_loopback(address)) continue;
      const auto source = route_source(address);
      if (source && !is_loopback(*source)) return text_of(*source);
    }
  }
  ifaddrs* interfaces = nullptr;
  std::string result = this_host;
  if (getifaddrs(&interfaces) == 0) {
    for (ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET ||
          (i->ifa_flags & IFF_UP) == 0) {
        continue;
      }
      const auto& address = *reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if (!is_loopback(address)) {
        result = text_of(address);
        break;
      }
    }
    freeifaddrs(interfaces);
  }
  return result;
}

}  // namespace kolo

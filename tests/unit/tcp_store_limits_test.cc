// TcpStoreServer under hostile input (issue 15): a frame announced by a peer
// without the secret, a client that never reads its replies, connection
// floods, idle and half-sent connections, oversized requests. Each attack
// runs while a legitimate client keeps working, and the server's memory
// (this process's resident size) stays put.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/config.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"
#include "store_attack.h"

namespace kolo {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kTimeout{10000};
const std::string kSecret = "0123456789abcdef0123456789abcdef";
constexpr int64_t kMiB = 1 << 20;

// The bound on the server's growth in resident memory during an attack.
// Under AddressSanitizer (scripts/sanitize.sh) freed blocks stay resident in
// its quarantine (256 MiB by default) and every allocation adds shadow
// memory, so there resident size does not measure what the server keeps and
// the bound is lifted; the attacks' other expectations still hold.
#if defined(__SANITIZE_ADDRESS__)
#define KOLO_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KOLO_TEST_UNDER_ASAN 1
#endif
#endif
#ifdef KOLO_TEST_UNDER_ASAN
constexpr int64_t kRssGrowthBound = INT64_MAX;
#else
constexpr int64_t kRssGrowthBound = 16 * kMiB;
#endif

using bench::AttackOptions;
using bench::resident_bytes;

// Attacks on `port` for `duration`, watching this process (the server's).
AttackOptions attack_on(int port, milliseconds duration = milliseconds(2000)) {
  AttackOptions o;
  o.port = port;
  o.duration = duration;
  o.watch_pid = getpid();
  return o;
}

// A raw TCP connection to the server, non-blocking.
int raw_connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` within `timeout` (reads and drops data).
bool closed_by_server(int fd, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char buffer[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

struct Reports {
  std::mutex mutex;
  std::vector<std::string> messages;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(m);
    };
  }
  std::string all() {
    std::lock_guard<std::mutex> lock(mutex);
    std::string out;
    for (const auto& m : messages) out += m + "\n";
    return out;
  }
};

// Round trips of a legitimate client while an attack runs.
void expect_store_works(Store& store, const std::string& tag) {
  for (int i = 0; i < 20; ++i) {
    store.set(tag + "/" + std::to_string(i), to_bytes("v" + std::to_string(i)));
    EXPECT_EQ(to_string(store.get(tag + "/" + std::to_string(i), kTimeout)),
              "v" + std::to_string(i));
  }
}

// Before: the server buffered a whole frame before checking its tag, so a
// peer without the secret could announce 1 GiB and stream it (kolorun grew by
// 2 GB, the store thread hashed it for seconds). Now the frame's first 36
// bytes carry a header tag: without it the connection is closed at once.
TEST(TcpStoreLimits, AFrameWithoutTheSecretIsDroppedAfterItsHeader) {
  Reports reports;
  TcpStoreServer::Options options;
  options.secret = kSecret;
  options.on_reject = reports.sink();
  TcpStoreServer server(options);
  auto good = connect_tcp_store("127.0.0.1", server.port(), kTimeout, kSecret);
  const int64_t before = resident_bytes(getpid());

  std::thread attacker_thread;
  bench::AttackResult attack;
  attacker_thread =
      std::thread([&] { attack = bench::attack_big_frame(attack_on(server.port())); });
  expect_store_works(*good, "during");
  attacker_thread.join();
  EXPECT_EQ(attack.closed_by_server, 1);
  // Only what the kernel's socket buffers took before the close went out.
  EXPECT_LT(attack.bytes_sent, 64 * kMiB);
  EXPECT_LT(attack.peak_rss_bytes - before, kRssGrowthBound);
  EXPECT_NE(reports.all().find("without a valid tag"), std::string::npos) << reports.all();
}

// Before: on the unauthenticated store a client that pipelined requests and
// never read the replies made the server buffer every reply. Now the server
// stops reading a connection whose replies back up past 1 MiB.
TEST(TcpStoreLimits, AClientThatNeverReadsItsRepliesStallsOnlyItself) {
  TcpStoreServer server(TcpStoreServer::Options{});
  auto good = connect_tcp_store("127.0.0.1", server.port(), kTimeout);
  good->set("big", Bytes(256 << 10, 7));  // every get of it answers 256 KiB
  const int64_t before = resident_bytes(getpid());

  bench::AttackResult attack;
  std::thread attacker_thread(
      [&] { attack = bench::attack_unread_replies(attack_on(server.port())); });
  expect_store_works(*good, "during");
  attacker_thread.join();
  EXPECT_GT(attack.bytes_sent, 300 << 10);  // the value and some gets went out
  EXPECT_LT(attack.peak_rss_bytes - before, kRssGrowthBound);
  expect_store_works(*good, "after");
}

// Before: nothing limited connections or closed idle ones. Now at the limit
// a new connection replaces the oldest one that never sent a valid request,
// such connections are closed after 10 s at most, and idle ones after
// idle_timeout; a client whose pooled connection was closed reconnects.
TEST(TcpStoreLimits, ConnectionFloodsAndIdleConnectionsAreBounded) {
  Reports reports;
  TcpStoreServer::Options options;
  options.max_connections = 8;
  options.idle_timeout = milliseconds(300);
  options.on_reject = reports.sink();
  TcpStoreServer server(options);

  // 20 connections that never send anything, while a legitimate client
  // works (its connection replaces the oldest idle one): every one of them is
  // closed, replaced or after 300 ms idle.
  auto good = connect_tcp_store("127.0.0.1", server.port(), kTimeout);
  bench::AttackResult attack;
  std::thread attacker_thread([&] {
    attack = bench::attack_connection_flood(attack_on(server.port(), milliseconds(3000)), 20);
  });
  expect_store_works(*good, "flood");
  attacker_thread.join();
  EXPECT_EQ(attack.connections, 20);
  EXPECT_EQ(attack.closed_by_server, 20);

  // The client's pooled connection is closed after 300 ms idle; its next
  // requests reconnect transparently.
  std::this_thread::sleep_for(milliseconds(900));
  expect_store_works(*good, "after-idle");

  // 8 proven connections (each sent a request) fill the server: a 9th is
  // refused at once and reported, not left waiting.
  options.idle_timeout = std::chrono::seconds(300);
  TcpStoreServer full(options);
  std::vector<std::shared_ptr<Store>> clients;
  for (int i = 0; i < 8; ++i) {
    clients.push_back(connect_tcp_store("127.0.0.1", full.port(), kTimeout));
    clients.back()->set("k" + std::to_string(i), to_bytes("v"));
  }
  const int extra = raw_connect(full.port());
  EXPECT_TRUE(closed_by_server(extra, kTimeout));
  close(extra);
  for (int i = 0; i < 100 && reports.all().find("refused") == std::string::npos; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_NE(reports.all().find("refused 1 connection(s): 8 connections are open "
                               "(KOLO_STORE_MAX_CONNECTIONS)"),
            std::string::npos)
      << reports.all();
  EXPECT_EQ(to_string(clients[3]->get("k3", kTimeout)), "v");
}

// A half-sent frame (a "slowloris" client) ties up nothing but its own
// connection, which is closed once it has been silent for the handshake time
// (here idle_timeout, shorter).
TEST(TcpStoreLimits, AHalfSentFrameIsClosedAndBlocksNobody) {
  TcpStoreServer::Options options;
  options.idle_timeout = milliseconds(300);
  TcpStoreServer server(options);
  auto good = connect_tcp_store("127.0.0.1", server.port(), kTimeout);
  bench::AttackResult attack;
  std::thread attacker_thread(
      [&] { attack = bench::attack_half_frames(attack_on(server.port(), milliseconds(3000)), 5); });
  expect_store_works(*good, "slow");
  attacker_thread.join();
  EXPECT_EQ(attack.closed_by_server, 5);
}

// A request over max_message_bytes is answered with an error naming the
// limit, its bytes are skipped unread, and the connection goes on.
TEST(TcpStoreLimits, AnOversizedRequestIsAClearErrorAndTheConnectionGoesOn) {
  for (const std::string& secret : {std::string(), kSecret}) {
    TcpStoreServer::Options options;
    options.secret = secret;
    options.max_message_bytes = 1 << 20;
    TcpStoreServer server(options);
    auto client = connect_tcp_store("127.0.0.1", server.port(), kTimeout, secret);
    try {
      client->set("big", Bytes(2 << 20, 1));
      FAIL() << "a 2 MiB set went through a 1 MiB limit";
    } catch (const ContractError& e) {
      EXPECT_NE(std::string(e.what()).find("set('big'): a request of 2097164 bytes is over this "
                                           "store's limit of 1048576 bytes "
                                           "(KOLO_STORE_MAX_MESSAGE_BYTES"),
                std::string::npos)
          << e.what();
    }
    client->set("small", to_bytes("ok"));
    EXPECT_EQ(to_string(client->get("small", kTimeout)), "ok");
    EXPECT_FALSE(client->check({"big"}));
  }
}

TEST(TcpStoreLimits, LimitsComeFromTheConfigAndBadValuesNameTheVariable) {
  TcpStoreServer::Options options;
  store_limits_from(Config::load(map_env({{"KOLO_STORE_MAX_MESSAGE_BYTES", "4096"},
                                          {"KOLO_STORE_MAX_CONNECTIONS", "16"},
                                          {"KOLO_STORE_IDLE_TIMEOUT_SECONDS", "2.5"}})),
                    options);
  EXPECT_EQ(options.max_message_bytes, 4096u);
  EXPECT_EQ(options.max_connections, 16);
  EXPECT_EQ(options.idle_timeout, milliseconds(2500));
  try {
    store_limits_from(Config::load(map_env({{"KOLO_STORE_MAX_CONNECTIONS", "0"}})), options);
    FAIL();
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("KOLO_STORE_MAX_CONNECTIONS"), std::string::npos);
  }
}

}  // namespace
}  // namespace kolo

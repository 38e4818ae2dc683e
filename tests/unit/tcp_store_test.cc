// TcpStoreServer + connect_tcp_store: several clients in threads, blocking gets
// released by sets, atomic add under contention, timeouts, a vanished server.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/core/store.h"

namespace kolo {
namespace {

using std::chrono::milliseconds;

Bytes bytes_of(const std::string& text) { return Bytes(text.begin(), text.end()); }
std::string text_of(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }

// Every blocking wait in these tests is bounded by this.
constexpr milliseconds kTimeout{10000};

std::shared_ptr<Store> connect(const TcpStoreServer& server) {
  return connect_tcp_store("127.0.0.1", server.port(), kTimeout);
}

TEST(TcpStore, SetGetCheckEraseAdd) {
  TcpStoreServer server({});
  ASSERT_GT(server.port(), 0);
  auto store = connect(server);
  EXPECT_FALSE(store->check({"a"}));
  store->set("a", bytes_of("hello"));
  EXPECT_EQ(text_of(store->get("a", kTimeout)), "hello");
  EXPECT_TRUE(store->check({"a"}));
  EXPECT_TRUE(store->check({}));
  EXPECT_FALSE(store->check({"a", "b"}));
  store->set("a", bytes_of(""));  // overwrite with an empty value
  EXPECT_EQ(text_of(store->get("a", kTimeout)), "");
  EXPECT_TRUE(store->erase("a"));
  EXPECT_FALSE(store->erase("a"));
  EXPECT_FALSE(store->check({"a"}));
  EXPECT_EQ(store->add("n", 5), 5);
  EXPECT_EQ(store->add("n", -2), 3);
  EXPECT_EQ(text_of(store->get("n", kTimeout)), "3");
  store->wait({}, milliseconds(0));  // no keys: returns at once
}

TEST(TcpStore, BinaryAndLargeValuesRoundTrip) {
  TcpStoreServer server({});
  auto store = connect(server);
  Bytes value(4 << 20);
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<uint8_t>(i * 131 + 7);
  value[0] = 0;
  store->set(std::string("key\0with nul", 12), value);
  EXPECT_EQ(store->get(std::string("key\0with nul", 12), kTimeout), value);
}

TEST(TcpStore, ClientsInThreadsSeeEachOthersKeys) {
  TcpStoreServer server({});
  constexpr int kClients = 6;
  std::vector<std::future<std::vector<std::string>>> results;
  for (int i = 0; i < kClients; ++i) {
    results.push_back(std::async(std::launch::async, [&server, i] {
      auto store = connect(server);
      store->set("rank/" + std::to_string(i), bytes_of("host" + std::to_string(i)));
      std::vector<std::string> seen;
      for (int k = 0; k < kClients; ++k)
        seen.push_back(text_of(store->get("rank/" + std::to_string(k), kTimeout)));
      return seen;
    }));
  }
  for (auto& result : results) {
    auto seen = result.get();
    for (int k = 0; k < kClients; ++k) EXPECT_EQ(seen[k], "host" + std::to_string(k));
  }
}

TEST(TcpStore, BlockingGetIsReleasedBySet) {
  TcpStoreServer server({});
  auto waiter = connect(server);
  auto setter = connect(server);
  auto got = std::async(std::launch::async, [&] { return text_of(waiter->get("late", kTimeout)); });
  auto waited = std::async(std::launch::async, [&] { waiter->wait({"late", "later"}, kTimeout); });
  // Both requests are parked on the server (the key does not exist yet).
  std::this_thread::sleep_for(milliseconds(50));
  setter->set("late", bytes_of("value"));
  EXPECT_EQ(got.get(), "value");
  setter->set("later", bytes_of("x"));
  waited.get();
}

TEST(TcpStore, OneClientSharedByThreadsDoesNotSerialiseBlockedGets) {
  TcpStoreServer server({});
  auto store = connect(server);
  constexpr int kThreads = 8;
  std::vector<std::future<std::string>> gets;
  for (int i = 0; i < kThreads; ++i) {
    gets.push_back(std::async(std::launch::async, [&store, i] {
      return text_of(store->get("k" + std::to_string(i), kTimeout));
    }));
  }
  // Released in reverse order: a client that serialised its requests would
  // deadlock here (until the timeout) because get k7 waits behind get k0.
  for (int i = kThreads - 1; i >= 0; --i) store->set("k" + std::to_string(i), bytes_of("v"));
  for (auto& g : gets) EXPECT_EQ(g.get(), "v");
}

TEST(TcpStore, AddIsAtomicUnderContention) {
  TcpStoreServer server({});
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 200;
  std::vector<std::future<std::vector<int64_t>>> results;
  for (int t = 0; t < kThreads; ++t) {
    results.push_back(std::async(std::launch::async, [&server] {
      auto store = connect(server);
      std::vector<int64_t> values;
      for (int i = 0; i < kAddsPerThread; ++i) values.push_back(store->add("counter", 1));
      return values;
    }));
  }
  std::set<int64_t> all;
  for (auto& result : results)
    for (int64_t v : result.get()) all.insert(v);
  // Every add saw a distinct value: 1 .. total.
  EXPECT_EQ(all.size(), size_t(kThreads * kAddsPerThread));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAddsPerThread);
}

TEST(TcpStore, AddOnNonNumberIsContractError) {
  TcpStoreServer server({});
  auto store = connect(server);
  store->set("text", bytes_of("abc"));
  EXPECT_THROW(store->add("text", 1), ContractError);
  EXPECT_EQ(store->add("other", 2), 2);  // the connection is still usable
}

TEST(TcpStore, TimeoutsNameTheMissingKeys) {
  TcpStoreServer server({});
  auto store = connect(server);
  store->set("present", bytes_of("1"));
  try {
    store->wait({"present", "absent/1", "absent/2"}, milliseconds(100));
    FAIL() << "wait should time out";
  } catch (const TimeoutError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("'absent/1', 'absent/2'"), std::string::npos) << message;
    EXPECT_EQ(message.find("'present'"), std::string::npos) << message;
  }
  try {
    store->get("nobody", milliseconds(50));
    FAIL() << "get should time out";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("'nobody'"), std::string::npos) << e.what();
  }
  // A timed-out request leaves the client usable.
  EXPECT_EQ(text_of(store->get("present", kTimeout)), "1");
}

TEST(TcpStore, ServerGoneIsRuntimeFaultNamingAddress) {
  auto server = std::make_unique<TcpStoreServer>(TcpStoreServer::Options{});
  const int port = server->port();
  // A short connect timeout: reconnecting after the loss fails fast.
  auto store = connect_tcp_store("127.0.0.1", port, milliseconds(300));
  store->set("a", bytes_of("1"));
  auto parked = std::async(std::launch::async, [&] { store->get("never", kTimeout); });
  std::this_thread::sleep_for(milliseconds(50));
  server.reset();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  try {
    parked.get();
    FAIL() << "a get parked on a destroyed server should fail";
  } catch (const TimeoutError& e) {
    FAIL() << "expected a lost connection, got a timeout: " << e.what();
  } catch (const RuntimeFault& e) {
    EXPECT_NE(std::string(e.what()).find(address), std::string::npos) << e.what();
  }
  // Later calls cannot reconnect either.
  EXPECT_THROW(store->set("b", bytes_of("2")), RuntimeFault);
}

// A server that accepts connections and never answers (a hung process, the
// wrong service on the port): each request fails with a TimeoutError at the
// timeout it was given, a blocking get at its own timeout plus the 5 s grace
// and a set at the store's timeout (at least the grace), not at twice the
// timeout nor after a fixed 30 s.
TEST(TcpStore, ASilentServerFailsEachRequestAtItsTimeout) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 8), 0);  // the kernel completes connections; nobody reads them
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);
  const milliseconds timeout(7000);
  auto store = connect_tcp_store("127.0.0.1", port, timeout);
  const auto seconds_of = [](const std::function<void()>& call) {
    const auto start = std::chrono::steady_clock::now();
    try {
      call();
      ADD_FAILURE() << "a silent server answered";
    } catch (const TimeoutError& e) {
      EXPECT_NE(std::string(e.what()).find("did not answer"), std::string::npos) << e.what();
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double set = seconds_of([&] { store->set("a", bytes_of("1")); });
  EXPECT_GE(set, 6.5);
  EXPECT_LT(set, 10.0);  // 7 s; it was 30 s
  const double get = seconds_of([&] { store->get("a", milliseconds(1000)); });
  EXPECT_GE(get, 5.5);
  EXPECT_LT(get, 9.0);  // 1 + 5 s; it was 1 + 30 s
  close(listener);
}

TEST(TcpStore, ConnectRetriesThenFailsNamingAddress) {
  int port = 0;
  {
    TcpStoreServer probe({});
    port = probe.port();  // free once probe is destroyed
  }
  try {
    connect_tcp_store("127.0.0.1", port, milliseconds(200));
    FAIL() << "nothing listens on port " << port;
  } catch (const RuntimeFault& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
}

TEST(TcpStore, ConnectWaitsForALateServer) {
  int port = 0;
  {
    TcpStoreServer probe({});
    port = probe.port();
  }
  auto client = std::async(std::launch::async,
                           [port] { return connect_tcp_store("127.0.0.1", port, kTimeout); });
  std::this_thread::sleep_for(milliseconds(100));
  TcpStoreServer::Options options;
  options.port = port;
  TcpStoreServer server(options);
  auto store = client.get();
  store->set("x", bytes_of("y"));
  EXPECT_EQ(text_of(store->get("x", kTimeout)), "y");
}

TEST(TcpStore, BadArgumentsAreContractErrors) {
  EXPECT_THROW(connect_tcp_store("127.0.0.1", 0, milliseconds(10)), ContractError);
  EXPECT_THROW(connect_tcp_store("", 1234, milliseconds(10)), ContractError);
  TcpStoreServer::Options options;
  options.port = 70000;
  EXPECT_THROW(TcpStoreServer server(options), ContractError);
}

TEST(TcpStore, PortInUseIsRuntimeFault) {
  TcpStoreServer first({});
  TcpStoreServer::Options options;
  options.port = first.port();
  EXPECT_THROW(TcpStoreServer second(options), RuntimeFault);
}

}  // namespace
}  // namespace kolo

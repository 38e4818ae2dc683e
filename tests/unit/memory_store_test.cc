// In-memory store and prefix store: blocking get/wait released by set,
// timeouts naming the missing keys, atomic add, erase, prefix isolation.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/core/store.h"

namespace kolo {
namespace {

using std::chrono::milliseconds;

// Every blocking call in these tests is bounded by this.
constexpr milliseconds kTimeout{10000};

TEST(MemoryStore, BytesHelpersRoundTrip) {
  const std::string text("a\0b", 3);
  EXPECT_EQ(to_bytes(text).size(), 3u);
  EXPECT_EQ(to_string(to_bytes(text)), text);
}

TEST(MemoryStore, SetGetCheckErase) {
  auto store = make_memory_store();
  EXPECT_FALSE(store->check({"a"}));
  store->set("a", to_bytes("1"));
  store->set("b", {});
  EXPECT_TRUE(store->check({"a", "b"}));
  EXPECT_EQ(to_string(store->get("a", kTimeout)), "1");
  EXPECT_TRUE(store->get("b", kTimeout).empty());
  store->set("a", to_bytes("2"));
  EXPECT_EQ(to_string(store->get("a", kTimeout)), "2");
  EXPECT_TRUE(store->erase("a"));
  EXPECT_FALSE(store->erase("a"));
  EXPECT_FALSE(store->check({"a", "b"}));
}

TEST(MemoryStore, GetAndWaitBlockUntilSet) {
  auto store = make_memory_store();
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(20));
    store->set("x", to_bytes("hello"));
    store->set("y", to_bytes("world"));
  });
  EXPECT_EQ(to_string(store->get("x", kTimeout)), "hello");
  store->wait({"x", "y"}, kTimeout);
  EXPECT_EQ(to_string(store->get("y", kTimeout)), "world");
  setter.join();
}

TEST(MemoryStore, TimeoutNamesTheMissingKeys) {
  auto store = make_memory_store();
  store->set("present", to_bytes("1"));
  try {
    store->wait({"present", "rank/3/addr"}, milliseconds(30));
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'rank/3/addr'"), std::string::npos) << message;
    EXPECT_EQ(message.find("'present'"), std::string::npos) << message;
  }
  EXPECT_THROW(store->get("missing", milliseconds(0)), TimeoutError);
}

TEST(MemoryStore, AddIsAtomicAcrossThreads) {
  auto store = make_memory_store();
  EXPECT_EQ(store->add("counter", 5), 5);
  EXPECT_EQ(store->add("counter", -2), 3);
  EXPECT_EQ(to_string(store->get("counter", kTimeout)), "3");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) store->add("counter", 1);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(store->add("counter", 0), 4003);

  store->set("text", to_bytes("not a number"));
  try {
    store->add("text", 1);
    FAIL() << "expected ContractError";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("'text'"), std::string::npos) << e.what();
  }
}

TEST(MemoryStore, WaitForeverIsReleasedBySet) {
  auto store = make_memory_store();
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(10));
    store->set("late", to_bytes("1"));
  });
  store->wait({"late"}, milliseconds::max());  // no clock overflow
  setter.join();
}

TEST(PrefixStore, IsolatesNamespaces) {
  auto inner = make_memory_store();
  auto a = make_prefix_store(inner, "world/0");
  auto b = make_prefix_store(inner, "world/1");
  a->set("key", to_bytes("a"));
  b->set("key", to_bytes("b"));
  EXPECT_EQ(to_string(a->get("key", kTimeout)), "a");
  EXPECT_EQ(to_string(b->get("key", kTimeout)), "b");
  EXPECT_EQ(to_string(inner->get("world/0/key", kTimeout)), "a");
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_EQ(b->add("n", 1), 1);
  EXPECT_TRUE(a->check({"key", "n"}));
  EXPECT_TRUE(a->erase("key"));
  EXPECT_FALSE(a->check({"key"}));
  EXPECT_TRUE(b->check({"key"}));
  // Nested prefixes compose.
  auto nested = make_prefix_store(a, "sub");
  nested->set("k", to_bytes("v"));
  EXPECT_TRUE(inner->check({"world/0/sub/k"}));
  try {
    b->wait({"absent"}, milliseconds(10));
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("world/1/absent"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_prefix_store(nullptr, "p"), ContractError);
}

}  // namespace
}  // namespace kolo

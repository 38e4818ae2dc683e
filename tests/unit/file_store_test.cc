// make_file_store: key escaping, atomic add across threads and processes,
// blocking get released by a set, timeouts naming the missing keys.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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
constexpr milliseconds kTimeout{10000};

Bytes bytes_of(const std::string& text) { return Bytes(text.begin(), text.end()); }
std::string text_of(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }

class FileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/kolo_file_store_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

// A value file is a checked file: one damaged on disk is an error naming it,
// not a wrong value handed to the rank.
TEST_F(FileStoreTest, ADamagedValueFileIsAnErrorNamingIt) {
  auto store = make_file_store(dir_);
  store->set("peer/address", bytes_of("10.0.0.1:4000"));
  const std::string path = dir_ + "/k.peer%2Faddress";
  ASSERT_TRUE(std::filesystem::exists(path));
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(-1, std::ios::end);
  file.put('9');
  file.close();
  try {
    store->get("peer/address", kTimeout);
    FAIL() << "read a damaged value";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("'" + path + "': corrupt"), std::string::npos) << e.what();
  }
}

TEST_F(FileStoreTest, SetGetCheckEraseAdd) {
  auto store = make_file_store(dir_ + "/nested/dir");  // created on demand
  EXPECT_FALSE(store->check({"a"}));
  store->set("a", bytes_of("hello"));
  EXPECT_EQ(text_of(store->get("a", kTimeout)), "hello");
  EXPECT_TRUE(store->check({"a"}));
  EXPECT_TRUE(store->check({}));
  store->set("a", bytes_of("again"));
  EXPECT_EQ(text_of(store->get("a", kTimeout)), "again");
  EXPECT_TRUE(store->erase("a"));
  EXPECT_FALSE(store->erase("a"));
  EXPECT_EQ(store->add("n", 4), 4);
  EXPECT_EQ(store->add("n", -1), 3);
  EXPECT_EQ(text_of(store->get("n", kTimeout)), "3");
  store->set("text", bytes_of("x"));
  EXPECT_THROW(store->add("text", 1), ContractError);
}

TEST_F(FileStoreTest, KeysAreEscapedWithoutCollisions) {
  auto store = make_file_store(dir_);
  const std::vector<std::string> keys = {
      "a/b", "a%2Fb", "..", ".", "", "with space", std::string("nul\0byte", 8), "world/0/rank/3"};
  for (size_t i = 0; i < keys.size(); ++i) store->set(keys[i], bytes_of(std::to_string(i)));
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(text_of(store->get(keys[i], kTimeout)), std::to_string(i)) << keys[i];
  }
  // Every key is a plain file directly in the directory.
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_TRUE(entry.is_regular_file()) << entry.path();
  }
  EXPECT_THROW(store->set(std::string(300, 'k'), bytes_of("x")), ContractError);
}

TEST_F(FileStoreTest, StoresOnTheSameDirectoryShareKeys) {
  auto first = make_file_store(dir_);
  auto second = make_file_store(dir_);
  first->set("shared", bytes_of("1"));
  EXPECT_EQ(text_of(second->get("shared", kTimeout)), "1");
}

TEST_F(FileStoreTest, BlockingGetIsReleasedBySet) {
  auto waiter = make_file_store(dir_);
  auto setter = make_file_store(dir_);
  auto got = std::async(std::launch::async, [&] { return text_of(waiter->get("late", kTimeout)); });
  auto waited = std::async(std::launch::async, [&] { waiter->wait({"late", "later"}, kTimeout); });
  std::this_thread::sleep_for(milliseconds(30));
  setter->set("late", bytes_of("value"));
  EXPECT_EQ(got.get(), "value");
  setter->set("later", bytes_of("x"));
  waited.get();
}

TEST_F(FileStoreTest, TimeoutsNameTheMissingKeys) {
  auto store = make_file_store(dir_);
  store->set("present", bytes_of("1"));
  try {
    store->wait({"present", "absent/1", "absent/2"}, milliseconds(50));
    FAIL() << "wait should time out";
  } catch (const TimeoutError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("'absent/1', 'absent/2'"), std::string::npos) << message;
    EXPECT_EQ(message.find("'present'"), std::string::npos) << message;
  }
  try {
    store->get("nobody", milliseconds(20));
    FAIL() << "get should time out";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("'nobody'"), std::string::npos) << e.what();
  }
}

TEST_F(FileStoreTest, AddIsAtomicAcrossThreads) {
  constexpr int kThreads = 6;
  constexpr int kAdds = 50;
  std::vector<std::future<std::vector<int64_t>>> results;
  for (int t = 0; t < kThreads; ++t) {
    results.push_back(std::async(std::launch::async, [this] {
      auto store = make_file_store(dir_);  // separate instances, same directory
      std::vector<int64_t> values;
      for (int i = 0; i < kAdds; ++i) values.push_back(store->add("counter", 1));
      return values;
    }));
  }
  std::set<int64_t> all;
  for (auto& result : results)
    for (int64_t v : result.get()) all.insert(v);
  EXPECT_EQ(all.size(), size_t(kThreads * kAdds));
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
}

TEST_F(FileStoreTest, AddIsAtomicAcrossProcesses) {
  constexpr int kChildren = 4;
  constexpr int kAdds = 50;
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        auto store = make_file_store(dir_);
        int64_t last = 0;
        for (int i = 0; i < kAdds; ++i) {
          int64_t v = store->add("counter", 1);
          if (v <= last) code = 2;  // values seen by one process only grow
          last = v;
        }
      } catch (...) {
        code = 1;
      }
      _exit(code);
    }
    children.push_back(pid);
  }
  // Reap every child; kill any that is still running after the deadline.
  auto deadline = std::chrono::steady_clock::now() + kTimeout;
  for (pid_t pid : children) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  auto store = make_file_store(dir_);
  EXPECT_EQ(text_of(store->get("counter", kTimeout)), std::to_string(kChildren * kAdds));
}

TEST_F(FileStoreTest, EmptyDirectoryIsContractError) {
  EXPECT_THROW(make_file_store(""), ContractError);
}

}  // namespace
}  // namespace kolo

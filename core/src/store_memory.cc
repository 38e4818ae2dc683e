// In-process store (ranks as threads) and the key-prefixing wrapper.
#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>

#include "kolo/core/errors.h"
#include "kolo/core/store.h"

namespace kolo {

Bytes to_bytes(const std::string& text) { return Bytes(text.begin(), text.end()); }

std::string to_string(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }

namespace {

constexpr int64_t kMaxWaitMs = int64_t{1000} * 3600 * 24 * 365;

std::string join_keys(const std::vector<std::string>& keys) {
  std::string text;
  for (const auto& key : keys) text += (text.empty() ? "'" : ", '") + key + "'";
  return text;
}

// Parses a counter value written by add(); throws ContractError otherwise.
int64_t parse_counter(const std::string& key, const Bytes& value) {
  const std::string text = to_string(value);
  size_t used = 0;
  int64_t number = 0;
  try {
    number = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size()) {
    throw ContractError("kolo store add: key '" + key + "' holds '" + text +
                        "', not a decimal counter; use a key that only add() writes");
  }
  return number;
}

class MemoryStore final : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      values_[key] = value;
    }
    changed_.notify_all();
  }

  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_locked(lock, {key}, timeout, "get");
    return values_.at(key);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t result = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = values_.find(key);
      const int64_t current = it == values_.end() ? 0 : parse_counter(key, it->second);
      // Wrap like a machine counter instead of signed-overflow UB.
      result = static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(delta));
      values_[key] = to_bytes(std::to_string(result));
    }
    changed_.notify_all();
    return result;
  }

  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return missing_locked(keys).empty();
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_locked(lock, keys, timeout, "wait");
  }

  bool erase(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return values_.erase(key) > 0;
  }

 private:
  std::vector<std::string> missing_locked(const std::vector<std::string>& keys) const {
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (values_.find(key) == values_.end()) missing.push_back(key);
    }
    return missing;
  }

  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout, const char* operation) {
    // Clamped so that "wait forever" (milliseconds::max()) does not overflow the clock.
    const auto deadline =
        std::chrono::steady_clock::now() + std::min(timeout, std::chrono::milliseconds(kMaxWaitMs));
    while (true) {
      const auto missing = missing_locked(keys);
      if (missing.empty()) return;
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout &&
          !missing_locked(keys).empty()) {
        throw TimeoutError("kolo memory store " + std::string(operation) + ": timed out after " +
                           std::to_string(timeout.count()) + " ms waiting for key(s) " +
                           join_keys(missing_locked(keys)) +
                           "; the rank that should set them has not (is it alive, and does "
                           "it use the same prefix?)");
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> values_;
};

class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> inner, std::string prefix)
      : inner_(std::move(inner)), prefix_(std::move(prefix) + "/") {}

  void set(const std::string& key, const Bytes& value) override { inner_->set(full(key), value); }
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_->get(full(key), timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return inner_->add(full(key), delta);
  }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(full(keys)); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner_->wait(full(keys), timeout);
  }
  bool erase(const std::string& key) override { return inner_->erase(full(key)); }

 private:
  std::string full(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const {
    std::vector<std::string> result;
    result.reserve(keys.size());
    for (const auto& key : keys) result.push_back(full(key));
    return result;
  }

  std::shared_ptr<Store> inner_;
  std::string prefix_;
};

}  // namespace

std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }

std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> inner, const std::string& prefix) {
  if (!inner) {
    throw ContractError("kolo make_prefix_store: inner store is null; pass the store to wrap");
  }
  return std::make_shared<PrefixStore>(std::move(inner), prefix);
}

}  // namespace kolo

// Notices through kolorun's store: early exits and evictions (exit_notices.h).
#include "exit_notices.h"

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo::detail {
namespace {

constexpr const char* kExitsKey = "launcher/exits";
constexpr const char* kEvictionsKey = "launcher/evictions";

std::string exited_key(int rank) { return "launcher/exited/" + std::to_string(rank); }
std::string eviction_key(int64_t n) { return "launcher/eviction/" + std::to_string(n); }

}  // namespace

void announce_clean_exit(Store& store, int rank) {
  store.set(exited_key(rank), to_bytes("exited with code 0"));
  store.add(kExitsKey, 1);
}

std::function<void()> exited_ranks_check(std::shared_ptr<Store> store, int self, int size) {
  return [store = std::move(store), self, size] {
    if (store->add(kExitsKey, 0) == 0) return;  // nobody left: one round trip
    std::vector<int> gone;
    std::string what;
    for (int r = 0; r < size; ++r) {
      if (r == self || !store->check({exited_key(r)})) continue;
      gone.push_back(r);
      what += (what.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " " +
              to_string(store->get(exited_key(r), std::chrono::seconds(1)));
    }
    if (gone.empty()) return;
    throw RuntimeFault("kolo::init: " + what +
                           " before joining the job's rendezvous, so the world of " +
                           std::to_string(size) +
                           " ranks cannot form (a rank that returned or called exit(0) before "
                           "its first collective?); every rank must call kolo::init() (or make "
                           "its first collective) before it leaves",
                       gone);
  };
}

void request_eviction(Store& store, int rank, int64_t start, const std::string& why) {
  const int64_t n = store.add(kEvictionsKey, 1);
  store.set(eviction_key(n),
            to_bytes(std::to_string(rank) + " " + std::to_string(start) + " " + why));
}

std::vector<EvictionRequest> new_evictions(Store& store, int64_t* seen) {
  std::vector<EvictionRequest> requests;
  const int64_t made = store.add(kEvictionsKey, 0);
  // A request is counted before its text is set: one whose text is not
  // there yet is left, with those after it, for the next call.
  while (*seen < made) {
    const std::string key = eviction_key(*seen + 1);
    if (!store.check({key})) break;
    const std::string text = to_string(store.get(key, std::chrono::seconds(1)));
    *seen += 1;
    EvictionRequest request;
    char* end = nullptr;
    request.rank = static_cast<int>(std::strtol(text.c_str(), &end, 10));
    request.start = std::strtoll(end, &end, 10);
    request.why = *end == ' ' ? std::string(end + 1) : std::string(end);
    requests.push_back(std::move(request));
  }
  return requests;
}

}  // namespace kolo::detail

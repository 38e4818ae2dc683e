// Early exits announced through kolorun's store (exit_notices.h).
#include "exit_notices.h"

#include <string>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo::detail {
namespace {

constexpr const char* kExitsKey = "launcher/exits";

std::string exited_key(int rank) { return "launcher/exited/" + std::to_string(rank); }

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

}  // namespace kolo::detail

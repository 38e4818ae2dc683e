// The store an elastic round's runtime rendezvouses through (run.cc).
//
// Building a round's communicators (and, later, its engine's) waits in the
// store for every member's keys. If a member dies between kolorun publishing
// the round and its own init, those keys never come: without help the others
// would wait out the whole KOLO_TIMEOUT_SECONDS (300 s by default) before
// rejoining. kolorun marks a round it gave up on with the key
// elastic/failed/<round> (the reason as its value); RoundStore's blocking
// waits look for that key every `poll` and then throw RuntimeFault, so the
// members go back to the rendezvous within about `poll` of kolorun noticing.
// shm's members also wait for each other in shared memory, outside the store:
// run() hands throw_if_failed() to them as InitOptions::rendezvous_check.
// A round superseded only because workers wait to join is not marked: its
// members keep training until their next commit.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/store.h"

namespace kolo::elastic {

// The key kolorun sets when it gives up on `round`.
std::string failed_round_key(int64_t round);

class RoundStore : public Store {
 public:
  // `inner` is unprefixed (the failed key lives at the store's root).
  RoundStore(std::shared_ptr<Store> inner, int64_t round,
             std::chrono::milliseconds poll = std::chrono::milliseconds(100));

  void set(const std::string& key, const Bytes& value) override;
  // Waits as wait() does, then reads the key.
  Bytes get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  // Waits in slices of `poll`; between slices, RuntimeFault naming the round
  // and kolorun's reason if the round was marked failed. TimeoutError (the
  // inner store's) after `timeout` as usual.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool erase(const std::string& key) override;
  // RuntimeFault (as wait() throws it) when kolorun gave up on the round;
  // the runtime's rendezvous_check for waits outside the store (shm).
  void throw_if_failed(const std::string& waiting_for);

 private:
  std::shared_ptr<Store> inner_;
  int64_t round_;
  std::chrono::milliseconds poll_;
};

}  // namespace kolo::elastic

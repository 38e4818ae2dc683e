// Notices between kolorun and its ranks through its store: ranks that left a
// job early (kolorun tells the others), and ranks a job asks kolorun to stop
// (a rank tells kolorun).
//
// A rank that exits 0 while its job runs on (an early return, sys.exit(0)
// after init) is normal once it has done its part, but a rank still waiting
// for it to join the world's rendezvous would wait out the whole timeout
// (KOLO_TIMEOUT_SECONDS, 300 s) for nothing. kolorun announces each such
// exit; the world's rendezvous checks the announcements on its liveness
// ticks and fails at once, naming the rank.
//
// Keys: "launcher/exits" counts the announcements (one add() per check
// tick tells whether anything changed), "launcher/exited/<rank>" says what
// happened ("exited with code 0").
//
// A parameter server that finds a worker frozen (it sends nothing while the
// others' pulls wait for it; a SIGSTOPped or swapped-out process) evicts it
// from its clocks and asks kolorun to stop it, so that kolorun kills it and,
// with --restart-workers, starts it again to rejoin. Keys: "launcher/
// evictions" counts the requests, "launcher/eviction/<n>" (n from 1) holds
// "<rank> <start> <why>".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/store.h"

namespace kolo::detail {

// kolorun's side: `rank` exited 0 while the job runs on.
void announce_clean_exit(Store& store, int rank);

// A CommunicatorOptions::rendezvous_check for the world of `size` ranks:
// throws RuntimeFault naming every announced rank other than `self` (and
// carrying them as failed ranks).
std::function<void()> exited_ranks_check(std::shared_ptr<Store> store, int self, int size);

// A rank's side: asks kolorun to stop `rank` in its `start`-th restart
// (KOLO_PS_REJOIN; 0: its first start), so that a late request never stops
// a later start; `why` says who asks and why (it ends kolorun's report).
void request_eviction(Store& store, int rank, int64_t start, const std::string& why);

struct EvictionRequest {
  int rank = 0;
  int64_t start = 0;
  std::string why;
};
// kolorun's side: the requests made after the first `*seen`, oldest first;
// advances `*seen`. One round trip when there are none.
std::vector<EvictionRequest> new_evictions(Store& store, int64_t* seen);

}  // namespace kolo::detail

// Ranks that left a job early, as kolorun tells the others through its store.
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
#pragma once

#include <functional>
#include <memory>

#include "kolo/core/store.h"

namespace kolo::detail {

// kolorun's side: `rank` exited 0 while the job runs on.
void announce_clean_exit(Store& store, int rank);

// A CommunicatorOptions::rendezvous_check for the world of `size` ranks:
// throws RuntimeFault naming every announced rank other than `self` (and
// carrying them as failed ranks).
std::function<void()> exited_ranks_check(std::shared_ptr<Store> store, int self, int size);

}  // namespace kolo::detail

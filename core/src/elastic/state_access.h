// run()'s access to the parts of elastic::State that users must not call
// (kolo/core/elastic.h keeps them private): attaching the round's rendezvous
// and running the reset callbacks after a re-formation.
#pragma once

#include <cstdint>

#include "kolo/core/elastic.h"

namespace kolo::detail {

struct ElasticStateAccess {
  // Where state.commit() asks about newer rounds (nullptr, 0 outside run()).
  static void attach(elastic::State& state, elastic::Rendezvous* rendezvous, int64_t round) {
    state.attach(rendezvous, round);
  }
  // The callbacks of state.on_reset(), in the order they were added.
  static void run_reset_callbacks(elastic::State& state) { state.run_reset_callbacks(); }
};

}  // namespace kolo::detail

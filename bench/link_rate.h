// The rate of the link between two hosts, measured in the same run as the
// collectives across them (`kolo-bench collectives` when ranks span hosts):
// plain TCP streams from one rank to another, as iperf would, so that a
// collective's bandwidth can be stated as a fraction of what the link moves.
#pragma once

#include <memory>
#include <string>

#include "kolo/core/communicator.h"
#include "kolo/core/store.h"

namespace kolo::bench {

struct LinkRateOptions {
  int sender = 0;                 // world rank that sends
  int receiver = 1;               // world rank that receives (on another host)
  int streams = 1;                // parallel TCP connections
  double seconds = 1.5;           // how long the sender keeps sending
  std::string key = "link_rate";  // store key of this measurement, unique per call
};

// Collective over `world` (every rank calls it; only sender and receiver
// move data). The receiver listens on a free port of every interface and
// publishes its host name and port in `store` (the sender connects to that
// name, as gloo's peers do). Returns, on every rank, the receiver's count of
// bytes divided by the time from its first to its last byte, in bytes per
// second. Throws RuntimeFault when a socket call fails.
double measure_link_rate(Communicator& world, Store& store, const LinkRateOptions& options);

}  // namespace kolo::bench

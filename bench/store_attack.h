// `kolo-bench store-attack`: attacks a running rendezvous store (kolorun's,
// found from its pid) as a hostile client on the same host would, and prints
// the server process's resident memory before, at the peak of and after each
// attack (issue 15). The attacks are also the store's unit tests' attackers
// (tests/unit/tcp_store_limits_test.cc).
//
//   kolo-bench store-attack --pid $(pgrep -n kolorun) [--json]
//
// Attacks, none of them knowing the job's secret:
//   big-frame:      a frame header announcing 1 GiB, then as many bytes as
//                   the server takes (until it closes, or 1 GiB);
//   unread-replies: (unauthenticated stores) a 256 KiB value, then thousands
//                   of pipelined gets of it whose replies are never read;
//   connection-flood: 2000 connections opened and held, sending nothing;
//   half-frames:    200 connections that send 2 bytes of a frame header and
//                   stop.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace kolo::bench {

struct AttackResult {
  std::string name;
  int64_t bytes_sent = 0;
  int connections = 0;         // opened
  int closed_by_server = 0;    // of those, closed by the server during the attack
  int64_t peak_rss_bytes = 0;  // of the watched process during the attack (0 = not watched)
};

// Each attack runs against host:port for about `duration` and samples the
// resident size of `watch_pid` (0 = none) while it runs.
struct AttackOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::chrono::milliseconds duration{3000};
  pid_t watch_pid = 0;
};

AttackResult attack_big_frame(const AttackOptions& options);
AttackResult attack_unread_replies(const AttackOptions& options);
AttackResult attack_connection_flood(const AttackOptions& options, int connections = 2000);
AttackResult attack_half_frames(const AttackOptions& options, int connections = 200);

// VmRSS of `pid` in bytes (-1 when unreadable).
int64_t resident_bytes(pid_t pid);
// The TCP port `pid` listens on (its first listening IPv4/IPv6 socket), or 0.
int listening_port(pid_t pid);

struct StoreAttackOptions {
  pid_t pid = 0;  // the process serving the store (kolorun)
  int port = 0;   // 0 = the port `pid` listens on
  std::string host = "127.0.0.1";
  double seconds_per_attack = 3;
  bool json = false;
};

int run_store_attack_bench(const StoreAttackOptions& options);

}  // namespace kolo::bench

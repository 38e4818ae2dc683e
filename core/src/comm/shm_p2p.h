// Point-to-point transfers of the shm communicator (internal).
//
// Shared memory holds, after the collectives' part of the segment:
//   RankArea[n]     per rank: the futex word a rank waiting for a transfer
//                   sleeps on, and how many of its threads sleep on it
//   Channel[n * n]  per ordered pair (s, d), s != d:
//     rts    ring of P2PFrames s -> d: the sends s posted to d
//     rtr    ring of P2PFrames d -> s: the receives d posted from s
//     data   ring of cells s -> d, each (tag, sequence, offset, bytes) and up
//            to kCellBytes of payload
// Every ring has one producer and one consumer (head and tail counters), so no
// locks. The protocol is p2p.h's: both sides post a frame; each compares the
// two when it sees the other's; the sender streams the payload through the
// data ring only after that, so every cell in a ring has a posted receive to
// go to and the receiver can always drain it: transfers of different tags
// never block each other, and at most kCells * kCellBytes per pair sit in
// shared memory. A send finishes once its last byte is in the ring.
//
// Progress is made by whichever point-to-point call of this rank runs
// (post, test, wait), and between calls by the pump, a thread of this rank
// started with its first transfer: one pass announces queued frames, takes
// the peers' frames, fills free cells and drains full ones, for every peer.
// Without the pump a transfer would move only when its owner next calls in:
// a pipeline stage that posts an isend and then computes would hold its peer
// (waiting for the header, then for the payload) for the whole computation.
// The pump sleeps while nothing is pending or the caller itself waits; it
// never fails the communicator (corrupt input it finds is raised by the
// caller's next call). A rank waiting for a transfer spins, then sleeps on
// its own futex word; a peer that publishes anything for it (a frame, a
// cell, or freed cells) wakes it (and the pump).
// A sleeping waiter checks every 100 ms that the peer it waits for is alive
// and has not destroyed its communicator; a dead or departed peer (after a
// last pass has taken whatever it left in the rings) is a RuntimeFault naming
// it, a passed deadline a TimeoutError, and both abort the segment, which
// makes every rank's communicator unusable (communicator.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/p2p.h"
#include "kolo/core/communicator.h"

namespace kolo::detail {

// Bytes of the point-to-point part of a segment for `size` ranks (a multiple
// of the page size; untouched channels cost no memory).
size_t shm_p2p_bytes(int size);

// What the point-to-point engine needs from the communicator owning the segment.
struct ShmP2PHooks {
  enum class Peer { kOk, kLeft, kDead };
  // State of `peer`; `liveness`: also check that its process is alive (slow).
  std::function<Peer(int peer, bool liveness)> peer_state;
  // The pid `peer` registered (for messages).
  std::function<int(int peer)> peer_pid;
  // Throws RuntimeFault when the communicator is unusable (an earlier fault,
  // or the segment aborted by another rank); `what` names the operation
  // without the leading "kolo " ("recv from rank 1 (tag 0)").
  std::function<void(const std::string& what)> check_usable;
  // Aborts the segment for every rank and throws RuntimeFault (TimeoutError
  // when `timeout`) with `message` and `ranks`.
  std::function<void(const std::string& message, const std::vector<int>& ranks, bool timeout)> fail;
};

class ShmP2P {
 public:
  // `area` points at shm_p2p_bytes(size) bytes of the mapped segment, zeroed
  // by its creator.
  ShmP2P(char* area, int rank, int size, std::chrono::milliseconds default_timeout,
         std::chrono::microseconds spin, ShmP2PHooks hooks);
  // Stops the pump and fails the transfers still pending (their handles then
  // throw).
  ~ShmP2P();
  ShmP2P(const ShmP2P&) = delete;
  ShmP2P& operator=(const ShmP2P&) = delete;

  P2PHandle post(P2PKind kind, const void* data, size_t count, DType dtype, int peer,
                 const P2POptions& options);

  // Wakes every rank sleeping in a point-to-point wait on this segment (after
  // an abort, or when this rank leaves), so that it looks again at once.
  void wake_all();

  struct State;  // shared with the handles (shm_p2p.cc)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace kolo::detail

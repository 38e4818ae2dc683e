// Point-to-point transfers of the gloo backend (internal): each transfer
// posted whole on gloo's unbound buffers, completed by gloo's own thread
// (below). gloo_communicator.cc posts them (isend, irecv) and owns the fault
// path they report to.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/gloo_transport.h"
#include "comm/p2p.h"

namespace kolo::detail::gloo_tcp {

// Every transfer posts everything it needs when it is posted, so that it
// completes through gloo's own thread with no further action of either rank
// (a blocking wait on one transfer can then never hold up another):
//  - its P2PFrame to the peer and a receive of the peer's frame (slots kRts /
//    kRtr of (tag, sequence));
//  - the data, in chunks of at most kP2PChunkBytes, on slot kData. A sender
//    sends its chunks from its buffer; a receiver posts one receive of exactly
//    kP2PChunkBytes per chunk it expects: whole chunks straight into its
//    buffer, the last partial one into a bounce buffer (copied out at the
//    end). gloo accepts a message no longer than the receive it lands in, so
//    a sender that sends more or less than the receiver expects never breaks
//    the connection.
// Waiting compares the two frames: equal, it waits for every chunk; different,
// only for the chunks both sides posted (the rest are never matched and are
// dropped), then fails with the ContractError; the receive buffer's contents
// are then unspecified. wait() waits in the calling thread; test() hands the
// transfer to a thread of its own (gloo has no non-blocking test), whose
// outcome wait() then collects.

constexpr size_t kP2PChunkBytes = 256 * 1024;
constexpr uint64_t kP2PSlotBit = uint64_t{1} << 62;  // collectives: (seq << 8) | phase
constexpr uint64_t kP2PSequenceMask = (uint64_t{1} << 36) - 1;

enum class P2PSlot : uint64_t { kRts = 0, kRtr = 1, kData = 2 };

inline uint64_t p2p_slot(P2PSlot kind, int tag, uint64_t sequence) {
  return kP2PSlotBit | (static_cast<uint64_t>(kind) << 60) | (static_cast<uint64_t>(tag) << 36) |
         (sequence & kP2PSequenceMask);
}

inline size_t chunks_of(size_t bytes) { return (bytes + kP2PChunkBytes - 1) / kP2PChunkBytes; }

struct GlooP2PState;

struct GlooP2POp final : P2POp, std::enable_shared_from_this<GlooP2POp> {
  GlooP2POp(std::shared_ptr<GlooP2PState> state, P2PKind kind, int peer, const P2PFrame& mine,
            void* data, milliseconds timeout)
      : state(std::move(state)),
        kind(kind),
        peer(peer),
        mine(mine),
        data(static_cast<uint8_t*>(data)),
        bytes(mine.count * dtype_size(static_cast<DType>(mine.dtype))),
        deadline(timeout) {}
  bool test() override;
  void wait() override;
  std::string what() const { return "kolo " + p2p_what(kind, peer, mine.tag); }

  std::shared_ptr<GlooP2PState> state;
  const P2PKind kind;
  const int peer;
  const P2PFrame mine;
  P2PFrame theirs{};
  uint8_t* const data;
  const size_t bytes;
  const Deadline deadline;
  // Owned by whoever completes the transfer (the waiting caller or the
  // thread test() started); dropped once it finished.
  std::optional<Channel> frame_in, frame_out, payload, tail;
  std::vector<uint8_t> bounce;  // the last partial chunk of a receive
  size_t whole_chunks = 0;      // receive: chunks that land in `data` itself
  // Guarded by the state's mutex.
  bool claimed = false;  // someone is completing it
  bool done = false;
  std::exception_ptr error;                  // ContractError, or a fault already converted
  std::optional<PeerError> transport_error;  // still to be turned into the communicator's fault
};

struct GlooP2PState {
  GlooP2PState(Link link, int rank, int size, milliseconds default_timeout)
      : link(link), rank(rank), size(size), default_timeout(default_timeout) {}

  // Waits for every part of `op` (frames, chunks) and records the outcome.
  void complete(GlooP2POp& op);
  void settle(GlooP2POp& op);

  const Link link;
  const int rank;
  const int size;
  const milliseconds default_timeout;
  P2PSequences sequences;  // the posting thread's
  // The communicator's fault path (GlooCommunicator::handle_fault): reports,
  // closes every connection, throws RuntimeFault / TimeoutError.
  std::function<void(const char* op, const PeerError&, const Deadline&)> on_fault;
  // Throws RuntimeFault when the communicator is unusable.
  std::function<void(const std::string& what)> check_usable;

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::weak_ptr<GlooP2POp>> pending;  // to fail when the communicator goes away
  int helpers = 0;                                // threads started by test() still running
  bool closed = false;
};

}  // namespace kolo::detail::gloo_tcp

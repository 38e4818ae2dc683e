// Point-to-point transfers: what every backend shares (internal).
//
// The protocol, the same on every backend: each side of a transfer announces
// what it moves, a P2PFrame (sender: a request to send, RTS; receiver: a
// ready-to-receive, RTR) carrying the tag, a sequence number and the count and
// dtype. Transfers are matched by (peer, tag, sequence): the k-th send from A
// to B with tag t pairs with the k-th receive on B from A with tag t, so both
// sides know which frames belong together without searching. Each side
// compares the two frames itself: equal, the data moves; different, both
// sides fail the transfer with the same ContractError (worded for each side)
// and no data moves, so the communicator stays usable. The data itself moves
// only into a posted receive (rendezvous), in bounded pieces: nothing is
// buffered for a receive nobody posted.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "kolo/core/communicator.h"
#include "kolo/core/dtype.h"

namespace kolo::detail {

// A transfer in flight; P2PHandle's counterpart in each backend.
class P2POp {
 public:
  virtual ~P2POp() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

enum class P2PKind : uint8_t { kSend, kRecv };

// "send to rank 1 (tag 3)" / "recv from rank 0 (tag 3)".
std::string p2p_what(P2PKind kind, int peer, int tag);

// Checks one call's arguments at the API boundary (peer in range and not this
// rank, tag in range, a buffer for count > 0, a valid dtype); ContractError
// naming the operation, the argument and the value.
void check_p2p_args(P2PKind kind, int rank, int size, int peer, const void* data, size_t count,
                    DType dtype, const P2POptions& options);

// What a side announces. Trivially copyable; 32 bytes on the wire (shm rings,
// gloo control messages, mpi header messages).
struct P2PFrame {
  static constexpr uint32_t kMagic = 0x706b6f6cu;  // "lokp"
  enum Type : uint8_t { kRts = 1, kRtr = 2, kBye = 3 };

  uint32_t magic = kMagic;
  uint8_t type = kRts;
  uint8_t dtype = 0;
  uint16_t pad0 = 0;
  int32_t tag = 0;
  uint32_t pad1 = 0;
  uint64_t sequence = 0;
  uint64_t count = 0;
};
static_assert(sizeof(P2PFrame) == 32, "P2PFrame is exchanged as raw bytes");

P2PFrame make_frame(P2PFrame::Type type, int tag, uint64_t sequence, size_t count, DType dtype);

// Why a frame that arrived from a peer cannot be trusted ("" when it can):
// wrong magic, unknown type or dtype, tag out of range.
std::string frame_problem(const P2PFrame& frame);

// The ContractError message of a transfer whose frames differ, as seen from
// `rank` ("" when count and dtype agree). `mine` is this side's frame.
std::string p2p_mismatch(P2PKind kind, int rank, int peer, const P2PFrame& mine,
                         const P2PFrame& theirs);

// Per (peer, tag) counters: the sequence number of the next send and of the
// next receive. Sends and receives count separately.
class P2PSequences {
 public:
  uint64_t next(P2PKind kind, int peer, int tag) {
    return counters_[{static_cast<int>(kind), peer, tag}]++;
  }

 private:
  struct Key {
    int kind, peer, tag;
    bool operator<(const Key& o) const {
      return kind != o.kind ? kind < o.kind : peer != o.peer ? peer < o.peer : tag < o.tag;
    }
  };
  std::map<Key, uint64_t> counters_;
};

// Key of a transfer between this rank and one peer: (tag, sequence).
using P2PKey = std::pair<int32_t, uint64_t>;

}  // namespace kolo::detail

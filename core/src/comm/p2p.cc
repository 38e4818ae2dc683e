// Point-to-point pieces every backend shares (p2p.h), P2PHandle, and the
// Communicator's blocking forms.
#include "comm/p2p.h"

#include "kolo/core/errors.h"

namespace kolo {

bool P2PHandle::test() {
  if (!op_) throw ContractError("kolo P2PHandle::test: the handle is empty (default-constructed)");
  return op_->test();
}

void P2PHandle::wait() {
  if (!op_) throw ContractError("kolo P2PHandle::wait: the handle is empty (default-constructed)");
  op_->wait();
}

void Communicator::send(const void* data, size_t count, DType dtype, int peer,
                        const P2POptions& options) {
  isend(data, count, dtype, peer, options).wait();
}

void Communicator::recv(void* data, size_t count, DType dtype, int peer,
                        const P2POptions& options) {
  irecv(data, count, dtype, peer, options).wait();
}

P2PHandle Communicator::isend(const void*, size_t, DType, int, const P2POptions&) {
  throw ContractError(std::string("kolo isend: the ") + backend() +
                      " backend has no point-to-point transfers");
}

P2PHandle Communicator::irecv(void*, size_t, DType, int, const P2POptions&) {
  throw ContractError(std::string("kolo irecv: the ") + backend() +
                      " backend has no point-to-point transfers");
}

namespace detail {

namespace {

std::string dtype_text(uint8_t dtype) {
  if (dtype >= kNumDTypes) return "invalid dtype " + std::to_string(dtype);
  return dtype_name(static_cast<DType>(dtype));
}

const char* verb(P2PKind kind) { return kind == P2PKind::kSend ? "send" : "recv"; }

}  // namespace

std::string p2p_what(P2PKind kind, int peer, int tag) {
  return std::string(verb(kind)) + (kind == P2PKind::kSend ? " to rank " : " from rank ") +
         std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
}

void check_p2p_args(P2PKind kind, int rank, int size, int peer, const void* data, size_t count,
                    DType dtype, const P2POptions& options) {
  const std::string op = std::string("kolo ") + verb(kind);
  if (peer < 0 || peer >= size) {
    throw ContractError(op + ": peer " + std::to_string(peer) + " is not a rank of this " +
                        std::to_string(size) + "-rank communicator (valid: 0.." +
                        std::to_string(size - 1) + ")");
  }
  if (peer == rank) {
    throw ContractError(op + ": peer " + std::to_string(peer) +
                        " is this rank itself; copy the buffer instead of sending it to yourself");
  }
  if (options.tag < 0 || options.tag > kMaxP2PTag) {
    throw ContractError(op + " (rank " + std::to_string(peer) + "): tag " +
                        std::to_string(options.tag) + " is not in [0, " +
                        std::to_string(kMaxP2PTag) + "]");
  }
  if (static_cast<int>(dtype) >= kNumDTypes) {
    throw ContractError(op + ": dtype value " + std::to_string(static_cast<int>(dtype)) +
                        " is not a DType");
  }
  if (count > 0 && data == nullptr) {
    throw ContractError(op + " " + (kind == P2PKind::kSend ? "to" : "from") + " rank " +
                        std::to_string(peer) + ": data is null but count is " +
                        std::to_string(count) + "; pass a buffer of count elements");
  }
  if (options.timeout.count() < 0) {
    throw ContractError(op + ": timeout must be >= 0 ms (0 = the communicator's default), got " +
                        std::to_string(options.timeout.count()));
  }
}

P2PFrame make_frame(P2PFrame::Type type, int tag, uint64_t sequence, size_t count, DType dtype) {
  P2PFrame frame;
  frame.type = type;
  frame.tag = tag;
  frame.sequence = sequence;
  frame.count = count;
  frame.dtype = static_cast<uint8_t>(dtype);
  return frame;
}

std::string frame_problem(const P2PFrame& frame) {
  if (frame.magic != P2PFrame::kMagic) return "bad magic number";
  if (frame.type != P2PFrame::kRts && frame.type != P2PFrame::kRtr &&
      frame.type != P2PFrame::kBye) {
    return "unknown message type " + std::to_string(frame.type);
  }
  if (frame.type != P2PFrame::kBye) {
    if (frame.dtype >= kNumDTypes) return "unknown dtype " + std::to_string(frame.dtype);
    if (frame.tag < 0 || frame.tag > kMaxP2PTag) return "tag out of range";
  }
  return "";
}

std::string p2p_mismatch(P2PKind kind, int rank, int peer, const P2PFrame& mine,
                         const P2PFrame& theirs) {
  if (mine.count == theirs.count && mine.dtype == theirs.dtype) return "";
  const bool send = kind == P2PKind::kSend;
  const std::string me = "rank " + std::to_string(rank);
  const std::string them = "rank " + std::to_string(peer);
  const std::string mine_text = std::to_string(mine.count) + " " + dtype_text(mine.dtype);
  const std::string theirs_text = std::to_string(theirs.count) + " " + dtype_text(theirs.dtype);
  const std::string& sender = send ? me : them;
  const std::string& receiver = send ? them : me;
  const std::string& sent = send ? mine_text : theirs_text;
  const std::string& expected = send ? theirs_text : mine_text;
  return "kolo " + p2p_what(kind, peer, mine.tag) + " on rank " + std::to_string(rank) + ": " +
         sender + " sends " + sent + " elements, " + receiver + " receives " + expected +
         " elements; a send and its receive must agree on count and dtype (nothing was "
         "transferred; both ranks get this error)";
}

}  // namespace detail
}  // namespace kolo

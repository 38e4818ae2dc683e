// Point-to-point transfers of the gloo backend (gloo_p2p.h).
#include "comm/gloo_p2p.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "kolo/core/errors.h"

namespace kolo::detail::gloo_tcp {

void GlooP2PState::complete(GlooP2POp& op) {
  std::exception_ptr error;
  std::optional<PeerError> transport_error;
  try {
    op.frame_in->wait_recv(op.deadline);
    const std::string problem = frame_problem(op.theirs);
    if (!problem.empty()) {
      throw PeerError{op.peer, false,
                      "rank " + std::to_string(op.peer) + " sent a corrupt point-to-point frame (" +
                          problem + ")"};
    }
    const std::string mismatch = p2p_mismatch(op.kind, rank, op.peer, op.mine, op.theirs);
    const size_t their_bytes = op.theirs.count * dtype_size(static_cast<DType>(op.theirs.dtype));
    // On a mismatch only the chunks both sides posted are ever matched.
    const size_t chunks = std::min(chunks_of(op.bytes), chunks_of(their_bytes));
    for (size_t k = 0; k < chunks; ++k) {
      if (op.kind == P2PKind::kSend) {
        op.payload->wait_send(op.deadline);
      } else {
        (k < op.whole_chunks ? *op.payload : *op.tail).wait_recv(op.deadline);
      }
    }
    if (mismatch.empty() && op.kind == P2PKind::kRecv &&
        op.bytes > op.whole_chunks * kP2PChunkBytes) {
      const size_t at = op.whole_chunks * kP2PChunkBytes;
      std::memcpy(op.data + at, op.bounce.data(), op.bytes - at);
    }
    op.frame_out->wait_send(op.deadline);
    if (!mismatch.empty()) error = std::make_exception_ptr(ContractError(mismatch));
  } catch (const PeerError& failure) {
    transport_error = failure;
  }
  std::lock_guard<std::mutex> lock(mutex);
  // gloo must not touch the buffers again: unmatched chunks are dropped with
  // their channels (gloo holds weak references only).
  op.frame_in.reset();
  op.frame_out.reset();
  op.payload.reset();
  op.tail.reset();
  if (op.done) return;  // a waiter gave up on it meanwhile (and broke the communicator)
  op.done = true;
  op.error = error;
  op.transport_error = transport_error;
  changed.notify_all();
}

// Turns a recorded transport failure into the communicator's fault (in the
// caller's thread: the fault path throws).
void GlooP2PState::settle(GlooP2POp& op) {
  if (op.transport_error) {
    const PeerError failure = *op.transport_error;
    op.transport_error.reset();
    try {
      check_usable(op.what());
      const std::string name = p2p_what(op.kind, op.peer, op.mine.tag);
      on_fault(name.c_str(), failure, op.deadline);
    } catch (...) {
      op.error = std::current_exception();
    }
  }
  if (op.error) std::rethrow_exception(op.error);
}

bool GlooP2POp::test() {
  std::unique_lock<std::mutex> lock(state->mutex);
  if (done || state->closed) return true;
  if (!claimed) {
    claimed = true;
    ++state->helpers;
    std::shared_ptr<GlooP2POp> self = shared_from_this();
    std::thread([self] {
      SigpipeGuard guard;
      self->state->complete(*self);
      std::lock_guard<std::mutex> lock(self->state->mutex);
      --self->state->helpers;
      self->state->changed.notify_all();
    }).detach();
  }
  return false;
}

void GlooP2POp::wait() {
  std::unique_lock<std::mutex> lock(state->mutex);
  if (!done && !claimed && !state->closed) {
    claimed = true;
    lock.unlock();
    {
      SigpipeGuard guard;
      state->complete(*this);
    }
    lock.lock();
  }
  // A helper thread's gloo waits end at the deadline; a little slack for it
  // to report before this thread gives up on it.
  const auto until = Clock::now() + deadline.remaining() + std::chrono::seconds(1);
  state->changed.wait_until(lock, until, [&] { return done || state->closed; });
  if (!done) {
    done = true;
    transport_error = PeerError{peer, !state->closed,
                                state->closed ? "the communicator was destroyed while the "
                                                "transfer was pending"
                                              : "deadline passed"};
    if (state->closed) {
      error = std::make_exception_ptr(
          RuntimeFault(what() + ": the communicator was destroyed while the transfer was pending"));
      transport_error.reset();
    }
  }
  lock.unlock();
  state->settle(*this);
}

}  // namespace kolo::detail::gloo_tcp

// Point-to-point transfers of the shm communicator (shm_p2p.h).
#include "comm/shm_p2p.h"

#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "comm/shm_segment.h"
#include "kolo/core/errors.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kolo::detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kPageBytes = 4096;
constexpr size_t kFrameSlots = 64;        // frames per ring
constexpr size_t kCells = 8;              // cells per data ring
constexpr size_t kCellBytes = 64 * 1024;  // payload per cell
constexpr auto kLivenessPeriod = std::chrono::milliseconds(100);

struct alignas(64) RankArea {
  std::atomic<uint32_t> bell;  // futex word: bumped when a peer published something for this rank
  // Threads of this rank (about to be) blocked on the bell: a waiter and the pump.
  alignas(64) std::atomic<uint32_t> sleeping;
};

struct FrameRing {
  alignas(64) std::atomic<uint64_t> head;  // next slot to read (consumer)
  alignas(64) std::atomic<uint64_t> tail;  // next slot to write (producer)
  alignas(64) P2PFrame slots[kFrameSlots];
};

struct CellHeader {
  uint64_t sequence;
  uint64_t offset;  // bytes into the transfer
  uint32_t bytes;   // payload bytes in this cell
  int32_t tag;
};

struct alignas(64) Cell {
  CellHeader header;
  alignas(64) char data[kCellBytes];
};

struct DataRing {
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  Cell cells[kCells];
};

// Traffic of the ordered pair (s, d).
struct Channel {
  FrameRing rts;  // s -> d
  FrameRing rtr;  // d -> s
  DataRing data;  // s -> d
};

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

size_t ranks_bytes(int size) { return round_up(sizeof(RankArea) * size, kPageBytes); }

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

}  // namespace

size_t shm_p2p_bytes(int size) {
  return ranks_bytes(size) + round_up(sizeof(Channel) * size * size, kPageBytes);
}

namespace {

struct ShmP2POp;

}  // namespace

// Thrown inside a pass of the pump when a peer wrote something corrupt: the
// pump must not fail the communicator itself (that is the calling thread's
// job, with the hooks), so it records the fault and stops.
struct DeferredFault {};

// This rank's side of every transfer, shared by ShmP2P, the handles and the
// pump thread. The caller's thread (one at a time, the Communicator contract)
// and the pump take `mutex` around every look at this state; nobody holds it
// while blocked on the bell.
struct ShmP2P::State {
  State(char* area, int rank, int size, std::chrono::milliseconds default_timeout,
        std::chrono::microseconds spin, ShmP2PHooks hooks)
      : rank(rank),
        size(size),
        default_timeout(default_timeout),
        spin(spin),
        hooks(std::move(hooks)),
        ranks(reinterpret_cast<RankArea*>(area)),
        channels(reinterpret_cast<Channel*>(area + ranks_bytes(size))),
        peers(size) {}

  struct Peer {
    std::deque<std::shared_ptr<ShmP2POp>> unannounced_sends;  // frames waiting for ring space
    std::deque<std::shared_ptr<ShmP2POp>> unannounced_recvs;
    std::map<P2PKey, std::shared_ptr<ShmP2POp>> sends;  // posted, not finished
    std::map<P2PKey, std::shared_ptr<ShmP2POp>> recvs;
    std::map<P2PKey, P2PFrame> early_rtr;  // the peer's frames that came before our post
    std::map<P2PKey, P2PFrame> early_rts;
    std::deque<std::shared_ptr<ShmP2POp>> streaming;  // matched sends with bytes to push
  };

  Channel& channel(int from, int to) const {
    return channels[static_cast<size_t>(from) * size + to];
  }

  // One progress pass over every peer; true if anything moved.
  bool progress();
  bool progress_peer(int peer);
  void finish(ShmP2POp& op, std::exception_ptr error);
  void match(ShmP2POp& op, const P2PFrame& theirs);
  void take_frame(int peer, bool rts, const P2PFrame& frame);
  bool drain_frames(int peer, bool rts);
  void wake(int peer);
  bool test(ShmP2POp& op);
  void wait(ShmP2POp& op);
  [[noreturn]] void fail_peer(ShmP2POp& op, ShmP2PHooks::Peer state);
  void close();

  const int rank;
  const int size;
  const std::chrono::milliseconds default_timeout;
  const std::chrono::microseconds spin;
  const ShmP2PHooks hooks;
  RankArea* const ranks;
  Channel* const channels;
  std::vector<Peer> peers;
  P2PSequences sequences;
  bool closed = false;
  std::string closed_reason;

  // Transfers posted and not finished (the pump sleeps while there are none).
  size_t pending = 0;
  // The pump: a thread that makes progress while the caller's thread is away
  // (computing), so that a posted isend moves as soon as the peer posts its
  // receive, without waiting for this rank's next point-to-point call.
  std::mutex mutex;
  std::condition_variable pump_cv;  // pending work, a waiter leaving, or stop
  std::thread pump;
  bool pump_stop = false;
  int waiters = 0;             // caller threads inside wait(): the pump stands back meanwhile
  bool pumping = false;        // a pass of the pump is running (corrupt input is deferred)
  std::string deferred_fault;  // a corrupt peer the pump found; raised by the caller
  std::vector<int> deferred_ranks;

  void run_pump();
  void stop_pump();
  // Fails the communicator for a peer's corrupt data: through the hooks on the
  // caller's thread; recorded and raised at the caller's next call on the pump's.
  [[noreturn]] void corrupt(const std::string& message, int peer);
  void raise_deferred();
};

namespace {

struct ShmP2POp final : P2POp {
  ShmP2POp(std::shared_ptr<ShmP2P::State> state, P2PKind kind, int peer, const P2PFrame& frame,
           const void* data, std::chrono::milliseconds timeout)
      : state(std::move(state)),
        kind(kind),
        peer(peer),
        frame(frame),
        data(static_cast<const char*>(data)),
        bytes(frame.count * dtype_size(static_cast<DType>(frame.dtype))),
        timeout(timeout),
        deadline(Clock::now() + timeout) {}

  // Both keep the state alive through the call (wait() drops the op's own
  // reference); an op already waited for has none and only reports.
  bool test() override {
    const std::shared_ptr<ShmP2P::State> keep = state;
    return keep ? keep->test(*this) : true;
  }
  void wait() override {
    const std::shared_ptr<ShmP2P::State> keep = state;
    if (keep) {
      keep->wait(*this);
    } else if (error) {
      std::rethrow_exception(error);
    }
  }

  P2PKey key() const { return {frame.tag, frame.sequence}; }
  std::string name() const { return p2p_what(kind, peer, frame.tag); }
  std::string what() const { return "kolo " + name(); }

  std::shared_ptr<ShmP2P::State> state;  // cleared once finished (breaks the cycle)
  const P2PKind kind;
  const int peer;
  const P2PFrame frame;
  const char* const data;  // a recv writes through a cast (irecv took it non-const)
  const size_t bytes;
  const std::chrono::milliseconds timeout;
  const Clock::time_point deadline;
  bool announced = false;  // our frame is in its ring
  bool matched = false;
  size_t moved = 0;  // bytes pushed into cells (send) or copied out of them (recv)
  bool done = false;
  std::exception_ptr error;
};

}  // namespace

void ShmP2P::State::finish(ShmP2POp& op, std::exception_ptr error) {
  if (!op.done) --pending;
  op.done = true;
  op.error = std::move(error);
  Peer& p = peers[op.peer];
  (op.kind == P2PKind::kSend ? p.sends : p.recvs).erase(op.key());
}

// Both frames are known: compare (every side does, so both agree).
void ShmP2P::State::match(ShmP2POp& op, const P2PFrame& theirs) {
  const std::string mismatch = p2p_mismatch(op.kind, rank, op.peer, op.frame, theirs);
  if (!mismatch.empty()) {
    finish(op, std::make_exception_ptr(ContractError(mismatch)));
    return;
  }
  op.matched = true;
  if (op.bytes == 0) {
    finish(op, nullptr);
    return;
  }
  if (op.kind == P2PKind::kSend) {
    peers[op.peer].streaming.push_back(
        peers[op.peer].sends.at(op.key()));  // the map holds the shared_ptr
  }
}

void ShmP2P::State::take_frame(int peer, bool rts, const P2PFrame& frame) {
  const std::string problem = frame_problem(frame);
  if (!problem.empty() || frame.type != (rts ? P2PFrame::kRts : P2PFrame::kRtr)) {
    corrupt("kolo shm point-to-point: rank " + std::to_string(peer) + " wrote a corrupt frame (" +
                (problem.empty() ? "wrong type" : problem) + ") into the segment",
            peer);
  }
  Peer& p = peers[peer];
  const P2PKey key{frame.tag, frame.sequence};
  // An RTS matches one of our receives, an RTR one of our sends.
  auto& ops = rts ? p.recvs : p.sends;
  auto it = ops.find(key);
  if (it == ops.end()) {
    (rts ? p.early_rts : p.early_rtr)[key] = frame;
    return;
  }
  std::shared_ptr<ShmP2POp> op = it->second;
  match(*op, frame);
}

// Takes every frame the peer published in the ring; true if any.
bool ShmP2P::State::drain_frames(int peer, bool rts) {
  FrameRing& ring = rts ? channel(peer, rank).rts : channel(rank, peer).rtr;
  const uint64_t head = ring.head.load(std::memory_order_relaxed);
  const uint64_t tail = ring.tail.load(std::memory_order_acquire);
  if (head == tail) return false;
  for (uint64_t i = head; i < tail; ++i) {
    const P2PFrame frame = ring.slots[i % kFrameSlots];
    ring.head.store(i + 1, std::memory_order_release);
    take_frame(peer, rts, frame);
  }
  return true;
}

void ShmP2P::State::wake(int peer) {
  RankArea& area = ranks[peer];
  area.bell.fetch_add(1, std::memory_order_seq_cst);
  if (area.sleeping.load(std::memory_order_seq_cst) != 0) futex_wake_all(&area.bell);
}

bool ShmP2P::State::progress_peer(int peer) {
  Peer& p = peers[peer];
  bool moved_out = false;  // published something the peer consumes, or freed its space
  // 1. Announce queued frames while their rings have room.
  for (bool send : {true, false}) {
    auto& queue = send ? p.unannounced_sends : p.unannounced_recvs;
    FrameRing& ring = send ? channel(rank, peer).rts : channel(peer, rank).rtr;
    while (!queue.empty()) {
      const uint64_t tail = ring.tail.load(std::memory_order_relaxed);
      if (tail - ring.head.load(std::memory_order_acquire) >= kFrameSlots) break;
      ring.slots[tail % kFrameSlots] = queue.front()->frame;
      ring.tail.store(tail + 1, std::memory_order_release);
      queue.front()->announced = true;
      queue.pop_front();
      moved_out = true;
    }
  }
  // 2. The peer's frames: RTRs for our sends, RTSs for our receives.
  moved_out |= drain_frames(peer, false);
  moved_out |= drain_frames(peer, true);
  // 3. Stream matched sends into free cells, oldest match first.
  DataRing& out = channel(rank, peer).data;
  while (!p.streaming.empty()) {
    const uint64_t tail = out.tail.load(std::memory_order_relaxed);
    if (tail - out.head.load(std::memory_order_acquire) >= kCells) break;
    ShmP2POp& op = *p.streaming.front();
    // The receiver must find our frame before our first cell.
    if (!op.announced) break;
    Cell& cell = out.cells[tail % kCells];
    const size_t bytes = std::min(kCellBytes, op.bytes - op.moved);
    cell.header.sequence = op.frame.sequence;
    cell.header.tag = op.frame.tag;
    cell.header.offset = op.moved;
    cell.header.bytes = static_cast<uint32_t>(bytes);
    std::memcpy(cell.data, op.data + op.moved, bytes);
    out.tail.store(tail + 1, std::memory_order_release);
    moved_out = true;
    op.moved += bytes;
    if (op.moved == op.bytes) {
      std::shared_ptr<ShmP2POp> keep = p.streaming.front();
      p.streaming.pop_front();
      finish(*keep, nullptr);
    }
  }
  // 4. Drain the peer's cells into our posted receives.
  DataRing& in = channel(peer, rank).data;
  const uint64_t head = in.head.load(std::memory_order_relaxed);
  const uint64_t tail = in.tail.load(std::memory_order_acquire);
  for (uint64_t i = head; i < tail; ++i) {
    const Cell& cell = in.cells[i % kCells];
    const P2PKey key{cell.header.tag, cell.header.sequence};
    auto it = p.recvs.find(key);
    if (it != p.recvs.end() && !it->second->matched) {
      // The RTS was published before this cell, but our look at its ring may
      // have come first: look again.
      drain_frames(peer, true);
      it = p.recvs.find(key);
    }
    if (it == p.recvs.end() || !it->second->matched ||
        cell.header.offset + cell.header.bytes > it->second->bytes ||
        cell.header.bytes > kCellBytes) {
      corrupt("kolo shm point-to-point: rank " + std::to_string(peer) + " streamed data (tag " +
                  std::to_string(cell.header.tag) + ", message " +
                  std::to_string(cell.header.sequence) + ") that matches no receive of rank " +
                  std::to_string(rank) + "; the segment is corrupt",
              peer);
    }
    std::shared_ptr<ShmP2POp> op = it->second;
    std::memcpy(const_cast<char*>(op->data) + cell.header.offset, cell.data, cell.header.bytes);
    op->moved += cell.header.bytes;
    in.head.store(i + 1, std::memory_order_release);
    moved_out = true;
    if (op->moved == op->bytes) finish(*op, nullptr);
  }
  if (moved_out) wake(peer);
  return moved_out;
}

bool ShmP2P::State::progress() {
  bool any = false;
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) any |= progress_peer(peer);
  }
  return any;
}

bool ShmP2P::State::test(ShmP2POp& op) {
  std::lock_guard<std::mutex> lock(mutex);
  if (op.done || closed) return true;
  try {
    raise_deferred();
    hooks.check_usable(op.name());
    progress();
  } catch (...) {
    if (!op.done) finish(op, std::current_exception());
  }
  return op.done;
}

// The peer is gone and a last pass did not finish the transfer.
void ShmP2P::State::fail_peer(ShmP2POp& op, ShmP2PHooks::Peer state) {
  const std::string peer = "rank " + std::to_string(op.peer);
  const std::string message =
      state == ShmP2PHooks::Peer::kDead
          ? op.what() + ": " + peer + " died (pid " + std::to_string(hooks.peer_pid(op.peer)) +
                ") while rank " + std::to_string(rank) + " waited for it (shm)"
          : op.what() + ": " + peer + " destroyed its communicator while rank " +
                std::to_string(rank) + " waited for it (shm)";
  try {
    hooks.fail(message, {op.peer}, false);
  } catch (...) {
    finish(op, std::current_exception());
    throw;
  }
  throw RuntimeFault(message, {op.peer});  // fail() always throws; keeps [[noreturn]] honest
}

void ShmP2P::State::wait(ShmP2POp& op) {
  std::unique_lock<std::mutex> lock(mutex);
  auto rethrow = [&] {
    op.state.reset();  // the caller (ShmP2POp::wait) still holds the state
    if (op.error) std::rethrow_exception(op.error);
  };
  if (op.done) return rethrow();
  if (closed) {
    finish(op, std::make_exception_ptr(RuntimeFault(op.what() + ": " + closed_reason)));
    return rethrow();
  }
  try {
    raise_deferred();
    hooks.check_usable(op.name());
  } catch (...) {
    finish(op, std::current_exception());
    throw;
  }
  // The pump stands back while this thread waits (it would only compete for
  // the lock and the cores); it resumes when the wait ends with work left.
  ++waiters;
  struct Leave {
    State& s;
    ~Leave() {
      if (--s.waiters == 0 && s.pending > 0) s.pump_cv.notify_one();
    }
  } leave{*this};
  // Spin: the peer is often just about to post.
  const auto spin_end = Clock::now() + spin;
  for (uint32_t i = 1; !op.done; ++i) {
    progress();
    if (op.done) break;
    if ((i & 15) == 0) {
      if (Clock::now() >= spin_end) break;
      lock.unlock();
      sched_yield();
      lock.lock();
    } else {
      cpu_relax();
    }
  }
  RankArea& self = ranks[rank];
  auto next_liveness = Clock::now() + kLivenessPeriod;
  while (!op.done) {
    // Sleep only when a pass moved nothing (a peer that publishes after the
    // bell was read changes it, so the futex does not block).
    self.sleeping.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t bell = self.bell.load(std::memory_order_seq_cst);
    const bool moved = progress();
    if (!moved && !op.done) {
      const auto now = Clock::now();
      const auto until = std::min(op.deadline, next_liveness);
      if (until > now) {
        lock.unlock();
        futex_wait(&self.bell, bell, until - now);
        lock.lock();
      }
    }
    self.sleeping.fetch_sub(1, std::memory_order_seq_cst);
    if (!moved) progress();
    if (op.done) break;
    const auto now = Clock::now();
    const bool liveness = now >= next_liveness;
    if (liveness) next_liveness = now + kLivenessPeriod;
    try {
      hooks.check_usable(op.name());
    } catch (...) {
      finish(op, std::current_exception());
      throw;
    }
    const ShmP2PHooks::Peer state = hooks.peer_state(op.peer, liveness);
    if (state != ShmP2PHooks::Peer::kOk) {
      progress();  // take what the peer published before it went
      if (op.done) break;
      fail_peer(op, state);
    }
    if (now >= op.deadline) {
      const bool send = op.kind == P2PKind::kSend;
      const std::string message =
          op.what() + ": timed out after " + std::to_string(op.timeout.count()) + " ms on rank " +
          std::to_string(rank) + (op.matched ? " while the data was moving; rank " : ": rank ") +
          std::to_string(op.peer) +
          (op.matched ? " stopped taking part (shm)"
                      : std::string(" did not post the matching ") + (send ? "recv" : "send") +
                            " (it skipped it, is stuck, or is too slow; see "
                            "KOLO_TIMEOUT_SECONDS) (shm)");
      try {
        hooks.fail(message, {op.peer}, true);
      } catch (...) {
        finish(op, std::current_exception());
        throw;
      }
    }
  }
  rethrow();
}

void ShmP2P::State::corrupt(const std::string& message, int peer) {
  if (pumping) {
    if (deferred_fault.empty()) {
      deferred_fault = message;
      deferred_ranks = {peer};
    }
    throw DeferredFault{};
  }
  hooks.fail(message, {peer}, false);
  throw RuntimeFault(message, {peer});  // fail() always throws; keeps [[noreturn]] honest
}

void ShmP2P::State::raise_deferred() {
  if (!deferred_fault.empty()) hooks.fail(deferred_fault, deferred_ranks, false);
}

// The pump's loop: while transfers are pending and no caller waits, one pass
// whenever a peer rings this rank's bell (or every liveness period, in case a
// wake was missed); asleep on pump_cv otherwise. It never calls the hooks:
// failing the communicator (a dead peer, a deadline, corrupt data) stays with
// the caller's thread, which the pump only saves from coming back early.
void ShmP2P::State::run_pump() {
  RankArea& self = ranks[rank];
  std::unique_lock<std::mutex> lock(mutex);
  while (!pump_stop) {
    if (pending == 0 || waiters > 0 || closed || !deferred_fault.empty()) {
      pump_cv.wait(lock);
      continue;
    }
    self.sleeping.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t bell = self.bell.load(std::memory_order_seq_cst);
    bool moved = false;
    pumping = true;
    try {
      moved = progress();
    } catch (const DeferredFault&) {
    }
    pumping = false;
    if (!moved && !pump_stop) {
      lock.unlock();
      futex_wait(&self.bell, bell, kLivenessPeriod);
      lock.lock();
    }
    self.sleeping.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ShmP2P::State::stop_pump() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    pump_stop = true;
  }
  pump_cv.notify_all();
  ranks[rank].bell.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&ranks[rank].bell);
  if (pump.joinable()) pump.join();
}

void ShmP2P::State::close() {
  std::lock_guard<std::mutex> lock(mutex);
  closed = true;
  pending = 0;
  closed_reason = "the communicator was destroyed while the transfer was pending";
  for (Peer& p : peers) {
    for (auto* ops : {&p.sends, &p.recvs}) {
      for (auto& [key, op] : *ops) {
        op->done = true;
        op->error = std::make_exception_ptr(RuntimeFault(op->what() + ": " + closed_reason));
        op->state.reset();
      }
      ops->clear();
    }
    p.unannounced_sends.clear();
    p.unannounced_recvs.clear();
    p.streaming.clear();
  }
}

ShmP2P::ShmP2P(char* area, int rank, int size, std::chrono::milliseconds default_timeout,
               std::chrono::microseconds spin, ShmP2PHooks hooks)
    : state_(std::make_shared<State>(area, rank, size, default_timeout, spin, std::move(hooks))) {}

ShmP2P::~ShmP2P() {
  state_->stop_pump();
  state_->close();
}

P2PHandle ShmP2P::post(P2PKind kind, const void* data, size_t count, DType dtype, int peer,
                       const P2POptions& options) {
  State& s = *state_;
  check_p2p_args(kind, s.rank, s.size, peer, data, count, dtype, options);
  const bool send = kind == P2PKind::kSend;
  std::unique_lock<std::mutex> lock(s.mutex);
  s.raise_deferred();
  s.hooks.check_usable(p2p_what(kind, peer, options.tag));
  const P2PFrame frame = make_frame(send ? P2PFrame::kRts : P2PFrame::kRtr, options.tag,
                                    s.sequences.next(kind, peer, options.tag), count, dtype);
  auto op =
      std::make_shared<ShmP2POp>(state_, kind, peer, frame, data,
                                 options.timeout.count() > 0 ? options.timeout : s.default_timeout);
  State::Peer& p = s.peers[peer];
  (send ? p.sends : p.recvs)[op->key()] = op;
  ++s.pending;
  (send ? p.unannounced_sends : p.unannounced_recvs).push_back(op);
  auto& early = send ? p.early_rtr : p.early_rts;
  auto it = early.find(op->key());
  if (it != early.end()) {
    const P2PFrame theirs = it->second;
    early.erase(it);
    s.match(*op, theirs);
  }
  s.progress_peer(peer);
  // Started with the first transfer: communicators used for collectives only
  // never have the thread.
  if (!s.pump.joinable()) s.pump = std::thread([&s] { s.run_pump(); });
  if (!op->done && s.waiters == 0) {
    lock.unlock();
    s.pump_cv.notify_one();
  }
  return P2PHandle(op);
}

void ShmP2P::wake_all() {
  State& s = *state_;
  for (int peer = 0; peer < s.size; ++peer) {
    s.ranks[peer].bell.fetch_add(1, std::memory_order_seq_cst);
    futex_wake_all(&s.ranks[peer].bell);
  }
}

}  // namespace kolo::detail

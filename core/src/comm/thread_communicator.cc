// Ranks as threads in one process: the reference backend ("fake" in DESIGN.md).
//
// Built to be obviously correct, not fast. Every collective is two rendezvous
// of all ranks on one mutex + condition variable:
//   1. exchange: each rank posts its buffer pointers, its CallSignature and any
//      local argument error; the last to arrive publishes a snapshot of all
//      posts and releases everyone. Every rank then checks the snapshot (the
//      same checks on the same data, so a mismatch throws the same
//      ContractError on every rank and none hangs) and computes its own output
//      by reading the other ranks' input buffers directly.
//   2. barrier: nobody returns (and reuses its input buffer) until every rank
//      has finished reading. In-place forms that would overwrite data another
//      rank is still reading compute into a per-rank scratch buffer and copy it
//      out after this barrier.
// A rank that does not arrive in time makes the waiting ranks throw
// TimeoutError naming it; the world is then broken and every later call throws
// RuntimeFault, as the Communicator contract says.
//
// Point to point: posted sends and receives wait in per-(sender, receiver,
// tag) queues of the world; the post that finds its counterpart at the head
// of the other queue matches them, compares count and dtype and copies the
// data straight from the send buffer into the receive buffer (both stay valid
// until their transfer finished). A rank whose communicator is destroyed
// fails its pending transfers and the peers' transfers with it.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "comm/p2p.h"
#include "comm/signature.h"
#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "reduce.h"

namespace kolo {

namespace {

using Clock = std::chrono::steady_clock;
using detail::CallSignature;
using detail::CollectiveKind;

// What one rank hands in for one call.
struct Post {
  CallSignature signature;
  const void* in = nullptr;
  void* out = nullptr;
  std::vector<size_t> counts;       // allgatherv counts; alltoallv send_counts
  std::vector<size_t> recv_counts;  // alltoallv
  std::string error;                // local argument error, reported on every rank
};

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

class ThreadWorld;

// One posted send or receive.
class ThreadP2POp final : public detail::P2POp {
 public:
  ThreadP2POp(std::shared_ptr<ThreadWorld> world, detail::P2PKind kind, int rank, int peer,
              const void* data, const detail::P2PFrame& frame, std::chrono::milliseconds timeout)
      : world(std::move(world)),
        kind(kind),
        rank(rank),
        peer(peer),
        data(data),
        frame(frame),
        timeout(timeout),
        deadline(Clock::now() + timeout) {}
  bool test() override;
  void wait() override;

  // Immutable after construction.
  const std::shared_ptr<ThreadWorld> world;
  const detail::P2PKind kind;
  const int rank;
  const int peer;
  const void* const data;  // a recv's buffer is written through a cast (irecv took it non-const)
  const detail::P2PFrame frame;
  const std::chrono::milliseconds timeout;
  const Clock::time_point deadline;
  // Guarded by the world's mutex.
  bool done = false;
  std::exception_ptr error;
};

// State shared by the `size` communicators of one in-process world.
class ThreadWorld {
 public:
  explicit ThreadWorld(int size)
      : size_(size),
        posts_(size),
        snapshot_(size),
        arrived_flags_(size, false),
        left_(size, false) {}

  int size() const { return size_; }

  // Rendezvous 1: posts this rank's call and returns every rank's post. The
  // snapshot stays valid until this rank calls exchange() again (completing
  // the next exchange needs this rank).
  const std::vector<Post>& exchange(int rank, Post post, Clock::time_point deadline,
                                    const std::string& what) {
    sync(rank, &post, deadline, what);
    return snapshot_;
  }

  // Rendezvous 2: a plain barrier.
  void barrier(int rank, Clock::time_point deadline, const std::string& what) {
    sync(rank, nullptr, deadline, what);
  }

  // ---- point to point ----

  // Queues `op`, or matches it with the first pending counterpart.
  void p2p_post(const std::shared_ptr<ThreadP2POp>& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fault_) throw_fault(*fault_, /*earlier=*/true);
    if (left_[op->peer]) throw RuntimeFault(peer_left(*op), {op->peer});
    const bool send = op->kind == detail::P2PKind::kSend;
    const QueueKey key{send ? op->rank : op->peer, send ? op->peer : op->rank, op->frame.tag};
    Queue& theirs = (send ? recvs_ : sends_)[key];
    if (theirs.empty()) {
      (send ? sends_ : recvs_)[key].push_back(op);
      return;
    }
    std::shared_ptr<ThreadP2POp> other = theirs.front();
    theirs.pop_front();
    complete(send ? *op : *other, send ? *other : *op);
    changed_.notify_all();
  }

  bool p2p_test(const ThreadP2POp& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    return op.done || fault_ || left_[op.peer];
  }

  void p2p_wait(ThreadP2POp& op) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_until(lock, op.deadline, [&] { return op.done || fault_ || left_[op.peer]; });
    if (!op.done) {
      // Unqueue first: nobody may copy into or out of the caller's buffer
      // once this call has returned.
      unqueue(op);
      op.done = true;
      if (fault_) {
        op.error = std::make_exception_ptr(
            RuntimeFault("kolo threads communicator is unusable after an earlier fault (build a "
                         "new one): " +
                             fault_->message,
                         fault_->ranks));
      } else if (left_[op.peer]) {
        op.error = std::make_exception_ptr(RuntimeFault(peer_left(op), {op.peer}));
      } else {
        const bool send = op.kind == detail::P2PKind::kSend;
        const std::string message = "kolo " + detail::p2p_what(op.kind, op.peer, op.frame.tag) +
                                    " (threads backend): timed out after " +
                                    std::to_string(op.timeout.count()) + " ms on rank " +
                                    std::to_string(op.rank) + ": rank " + std::to_string(op.peer) +
                                    " did not post the matching " + (send ? "recv" : "send") +
                                    " (it skipped it, is stuck, or died)";
        fault_ = Fault{message, {op.peer}, true};
        changed_.notify_all();
        op.error = std::make_exception_ptr(TimeoutError(message, {op.peer}));
      }
    }
    if (op.error) std::rethrow_exception(op.error);
  }

  // Rank `rank`'s communicator is going away: its pending transfers fail, and
  // so do the peers' transfers with it.
  void leave(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    left_[rank] = true;
    for (auto* queues : {&sends_, &recvs_}) {
      for (auto& entry : *queues) {
        Queue& queue = entry.second;
        for (auto it = queue.begin(); it != queue.end();) {
          ThreadP2POp& op = **it;
          if (op.rank != rank) {
            ++it;
            continue;
          }
          op.done = true;
          op.error = std::make_exception_ptr(
              RuntimeFault("kolo " + detail::p2p_what(op.kind, op.peer, op.frame.tag) +
                           ": the communicator was destroyed while the transfer was pending"));
          it = queue.erase(it);
        }
      }
    }
    changed_.notify_all();
  }

  // The ranks `rank`'s rendezvous in progress waits for (empty: none).
  std::vector<int> waiting_for(int rank) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int> missing;
    if (fault_ || !arrived_flags_[rank]) return missing;
    for (int r = 0; r < size_; ++r) {
      if (!arrived_flags_[r]) missing.push_back(r);
    }
    return missing;
  }

  // Breaks the world: every rendezvous in progress and later fails.
  void abort(const std::string& reason, const std::vector<int>& ranks) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (fault_) return;
      fault_ = Fault{reason, ranks, false};
    }
    changed_.notify_all();
  }

 private:
  struct Fault {
    std::string message;
    std::vector<int> ranks;
    bool timeout;
  };

  [[noreturn]] static void throw_fault(const Fault& fault, bool earlier) {
    const std::string message =
        earlier ? "kolo threads communicator is unusable after an earlier fault (build a new "
                  "one): " +
                      fault.message
                : fault.message;
    if (fault.timeout && !earlier) throw TimeoutError(message, fault.ranks);
    throw RuntimeFault(message, fault.ranks);
  }

  void sync(int rank, Post* post, Clock::time_point deadline, const std::string& what) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (fault_) throw_fault(*fault_, /*earlier=*/true);
    if (post != nullptr) posts_[rank] = std::move(*post);
    arrived_flags_[rank] = true;
    const uint64_t phase = phase_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      std::fill(arrived_flags_.begin(), arrived_flags_.end(), false);
      if (post != nullptr) snapshot_.swap(posts_);
      ++phase_;
      lock.unlock();
      changed_.notify_all();
      return;
    }
    const bool done =
        changed_.wait_until(lock, deadline, [&] { return phase_ != phase || fault_; });
    if (phase_ != phase) return;  // completed, even if a fault came right after
    if (!done) {
      // This rank is the first to give up: record who is missing for everyone.
      std::vector<int> missing, waiting;
      for (int r = 0; r < size_; ++r) (arrived_flags_[r] ? waiting : missing).push_back(r);
      fault_ = Fault{"kolo " + what + " (threads backend): timed out: rank(s) " +
                         rank_list(missing) + " did not arrive; rank(s) " + rank_list(waiting) +
                         " were waiting. A rank skipped this call, is stuck, or died.",
                     missing, true};
      lock.unlock();
      changed_.notify_all();
      throw_fault(*fault_, /*earlier=*/false);
    }
    throw_fault(*fault_, /*earlier=*/false);  // another rank timed out first
  }

  const int size_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Post> posts_;     // being filled for the current exchange
  std::vector<Post> snapshot_;  // of the last completed exchange
  std::vector<bool> arrived_flags_;
  int arrived_ = 0;
  uint64_t phase_ = 0;  // completed rendezvous
  std::optional<Fault> fault_;

  // ---- point to point ----
  using QueueKey = std::tuple<int, int, int32_t>;  // (sender, receiver, tag)
  using Queue = std::deque<std::shared_ptr<ThreadP2POp>>;

  static std::string peer_left(const ThreadP2POp& op) {
    return "kolo " + detail::p2p_what(op.kind, op.peer, op.frame.tag) + " on rank " +
           std::to_string(op.rank) + ": rank " + std::to_string(op.peer) +
           " destroyed its communicator (threads backend)";
  }

  // Pairs a send with its receive: compares, copies, finishes both.
  static void complete(ThreadP2POp& send, ThreadP2POp& recv) {
    const std::string mismatch =
        detail::p2p_mismatch(detail::P2PKind::kSend, send.rank, send.peer, send.frame, recv.frame);
    if (!mismatch.empty()) {
      send.error = std::make_exception_ptr(ContractError(mismatch));
      recv.error = std::make_exception_ptr(ContractError(detail::p2p_mismatch(
          detail::P2PKind::kRecv, recv.rank, recv.peer, recv.frame, send.frame)));
    } else {
      const size_t bytes = send.frame.count * dtype_size(static_cast<DType>(send.frame.dtype));
      if (bytes > 0) std::memcpy(const_cast<void*>(recv.data), send.data, bytes);
    }
    send.done = true;
    recv.done = true;
  }

  void unqueue(const ThreadP2POp& op) {
    auto& queues = op.kind == detail::P2PKind::kSend ? sends_ : recvs_;
    for (auto& entry : queues) {
      Queue& queue = entry.second;
      auto it = std::find_if(queue.begin(), queue.end(),
                             [&](const std::shared_ptr<ThreadP2POp>& o) { return o.get() == &op; });
      if (it != queue.end()) {
        queue.erase(it);
        return;
      }
    }
  }

  std::map<QueueKey, Queue> sends_;  // posted, not yet matched
  std::map<QueueKey, Queue> recvs_;
  std::vector<bool> left_;  // communicator destroyed
};

bool ThreadP2POp::test() { return world->p2p_test(*this); }
void ThreadP2POp::wait() { world->p2p_wait(*this); }

const uint8_t* bytes(const void* pointer) { return static_cast<const uint8_t*>(pointer); }
uint8_t* bytes(void* pointer) { return static_cast<uint8_t*>(pointer); }

void copy_bytes(void* dst, const void* src, size_t count) {
  if (count > 0 && dst != src) std::memcpy(dst, src, count);
}

size_t sum_of(const std::vector<size_t>& counts, size_t end) {
  size_t total = 0;
  for (size_t k = 0; k < end && k < counts.size(); ++k) total += counts[k];
  return total;
}

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadWorld> world, int rank,
                     std::chrono::milliseconds timeout)
      : world_(std::move(world)), rank_(rank), timeout_(timeout) {}
  ~ThreadCommunicator() override { world_->leave(rank_); }

  int rank() const override { return rank_; }
  int size() const override { return world_->size(); }
  const char* backend() const override { return "threads"; }

  std::optional<std::vector<int>> waiting_for() const override {
    return world_->waiting_for(rank_);
  }
  bool abort(const std::string& reason, const std::vector<int>& ranks) override {
    if (ranks.empty()) {
      world_->abort("rank " + std::to_string(rank_) + " aborted: " + reason, {rank_});
    } else {
      world_->abort(reason, ranks);
    }
    return true;
  }

  void allreduce(const void* in, void* out, size_t count, DType dtype,
                 const AllreduceOptions& options) override {
    Post post = make_post(CollectiveKind::kAllreduce, in, out, count, dtype);
    set_reduce(post, options);
    check_local(post, count, count, &options, 0);
    run(
        std::move(post), options.timeout,
        [&](const std::vector<Post>& all) -> const void* {
          // In place, `out` is this rank's input that others are still reading.
          void* dst = in == out ? scratch(count * dtype_size(dtype)) : out;
          std::vector<const void*> inputs;
          for (const Post& p : all) inputs.push_back(p.in);
          detail::reduce_inputs(dst, inputs.data(), size(), count, dtype, options, size());
          return dst == out ? nullptr : dst;
        },
        count* dtype_size(dtype), out);
  }

  void allgather(const void* in, void* out, size_t count, DType dtype,
                 const CollectiveOptions& options) override {
    Post post = make_post(CollectiveKind::kAllgather, in, out, count, dtype);
    check_local(post, count, count * size(), nullptr, 0);
    run(std::move(post), options.timeout, [&](const std::vector<Post>& all) -> const void* {
      // In place, this rank's block is already in position; the other blocks of
      // `out` are read by nobody, so no scratch is needed.
      const size_t block = count * dtype_size(dtype);
      for (int k = 0; k < size(); ++k) copy_bytes(bytes(out) + k * block, all[k].in, block);
      return nullptr;
    });
  }

  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                  const CollectiveOptions& options) override {
    Post post = make_post(CollectiveKind::kAllgatherv, in, out, 0, dtype);
    post.signature.count = detail::hash_counts(counts);
    post.counts = counts;
    const bool counts_ok = capture(
        [&] { detail::check_counts_arg(CollectiveKind::kAllgatherv, "counts", counts, size()); },
        post);
    if (counts_ok) check_local(post, counts[rank_], sum_of(counts, counts.size()), nullptr, 0);
    run(std::move(post), options.timeout, [&](const std::vector<Post>& all) -> const void* {
      const size_t element = dtype_size(dtype);
      size_t offset = 0;
      for (int k = 0; k < size(); ++k) {
        copy_bytes(bytes(out) + offset * element, all[k].in, counts[k] * element);
        offset += counts[k];
      }
      return nullptr;
    });
  }

  void broadcast(void* buffer, size_t count, DType dtype,
                 const BroadcastOptions& options) override {
    Post post = make_post(CollectiveKind::kBroadcast, buffer, buffer, count, dtype);
    post.signature.root = options.root;
    check_local(post, count, count, nullptr, options.root);
    run(std::move(post), options.timeout, [&](const std::vector<Post>& all) -> const void* {
      if (rank_ != options.root)
        copy_bytes(buffer, all[options.root].in, count * dtype_size(dtype));
      return nullptr;
    });
  }

  void reducescatter(const void* in, void* out, size_t count, DType dtype,
                     const AllreduceOptions& options) override {
    Post post = make_post(CollectiveKind::kReducescatter, in, out, count, dtype);
    set_reduce(post, options);
    check_local(post, count * size(), count, &options, 0);
    const size_t block = count * dtype_size(dtype);
    run(
        std::move(post), options.timeout,
        [&](const std::vector<Post>& all) -> const void* {
          void* dst = in == out ? scratch(block) : out;
          std::vector<const void*> inputs;
          for (const Post& p : all) inputs.push_back(bytes(p.in) + rank_ * block);
          detail::reduce_inputs(dst, inputs.data(), size(), count, dtype, options, size());
          return dst == out ? nullptr : dst;
        },
        block, out);
  }

  void alltoall(const void* in, void* out, size_t count, DType dtype,
                const CollectiveOptions& options) override {
    Post post = make_post(CollectiveKind::kAlltoall, in, out, count, dtype);
    check_local(post, count * size(), count * size(), nullptr, 0);
    const size_t block = count * dtype_size(dtype);
    run(
        std::move(post), options.timeout,
        [&](const std::vector<Post>& all) -> const void* {
          uint8_t* dst = in == out ? scratch(size() * block) : bytes(out);
          for (int k = 0; k < size(); ++k)
            copy_bytes(dst + k * block, bytes(all[k].in) + rank_ * block, block);
          return dst == out ? nullptr : dst;
        },
        size() * block, out);
  }

  void alltoallv(const void* in, const std::vector<size_t>& send_counts, void* out,
                 const std::vector<size_t>& recv_counts, DType dtype,
                 const CollectiveOptions& options) override {
    Post post = make_post(CollectiveKind::kAlltoallv, in, out, 0, dtype);
    post.counts = send_counts;
    post.recv_counts = recv_counts;
    const bool counts_ok = capture(
        [&] {
          detail::check_counts_arg(CollectiveKind::kAlltoallv, "send_counts", send_counts, size());
          detail::check_counts_arg(CollectiveKind::kAlltoallv, "recv_counts", recv_counts, size());
        },
        post);
    if (counts_ok) {
      const size_t sent = sum_of(send_counts, send_counts.size());
      const size_t received = sum_of(recv_counts, recv_counts.size());
      check_local(post, sent, received, nullptr, 0);
      if (post.error.empty() && in == out && (sent > 0 || received > 0)) {
        post.error =
            "kolo alltoallv: in == out, but alltoallv has no in-place form; pass "
            "separate send and receive buffers";
      }
    }
    run(std::move(post), options.timeout, [&](const std::vector<Post>& all) -> const void* {
      std::vector<std::vector<size_t>> sends, recvs;
      for (const Post& p : all) {
        sends.push_back(p.counts);
        recvs.push_back(p.recv_counts);
      }
      detail::check_alltoallv_counts(sends, recvs);
      const size_t element = dtype_size(dtype);
      size_t offset = 0;
      for (int k = 0; k < size(); ++k) {
        const size_t from = sum_of(all[k].counts, rank_);  // rank k's block for me
        copy_bytes(bytes(out) + offset * element, bytes(all[k].in) + from * element,
                   recv_counts[k] * element);
        offset += recv_counts[k];
      }
      return nullptr;
    });
  }

  P2PHandle isend(const void* data, size_t count, DType dtype, int peer,
                  const P2POptions& options) override {
    return post_p2p(detail::P2PKind::kSend, data, count, dtype, peer, options);
  }

  P2PHandle irecv(void* data, size_t count, DType dtype, int peer,
                  const P2POptions& options) override {
    return post_p2p(detail::P2PKind::kRecv, data, count, dtype, peer, options);
  }

  void barrier(const CollectiveOptions& options) override {
    Post post;
    post.signature.sequence = ++sequence_;
    post.signature.kind = CollectiveKind::kBarrier;
    const auto deadline = deadline_of(options.timeout);
    const auto& all = world_->exchange(rank_, std::move(post), deadline, "barrier");
    check_posts(all);
  }

 private:
  Post make_post(CollectiveKind kind, const void* in, void* out, size_t count, DType dtype) {
    Post post;
    post.signature.sequence = ++sequence_;
    post.signature.kind = kind;
    post.signature.count = count;
    post.signature.dtype = dtype;
    post.in = in;
    post.out = out;
    if (static_cast<int>(dtype) >= kNumDTypes) {
      post.error = std::string("kolo ") + detail::collective_name(kind) + ": dtype value " +
                   std::to_string(static_cast<int>(dtype)) + " is not a DType";
    }
    return post;
  }

  static void set_reduce(Post& post, const AllreduceOptions& options) {
    post.signature.op = options.op;
    post.signature.prescale = options.prescale;
    post.signature.postscale = options.postscale;
  }

  // Runs a local check; a ContractError is kept in the post so that every rank
  // reports it after the exchange instead of the other ranks hanging.
  template <typename Check>
  bool capture(Check check, Post& post) {
    if (!post.error.empty()) return false;
    try {
      check();
    } catch (const ContractError& e) {
      post.error = e.what();
      return false;
    }
    return true;
  }

  // Local argument checks: `in` holds in_count elements, `out` receives out_count.
  void check_local(Post& post, size_t in_count, size_t out_count, const AllreduceOptions* reduce,
                   int root) {
    capture(
        [&] {
          const CollectiveKind kind = post.signature.kind;
          const uint8_t placeholder = 0;  // `out` is checked against out_count below
          detail::check_local_args(kind, size(), post.in, &placeholder, in_count, reduce, root);
          if (out_count > 0 && post.out == nullptr) {
            throw ContractError(std::string("kolo ") + detail::collective_name(kind) +
                                ": out is null but the result has " + std::to_string(out_count) +
                                " elements; pass a buffer for the result");
          }
        },
        post);
  }

  Clock::time_point deadline_of(std::chrono::milliseconds timeout) const {
    return Clock::now() + (timeout.count() > 0 ? timeout : timeout_);
  }

  // Same checks on the same snapshot on every rank -> the same error everywhere.
  void check_posts(const std::vector<Post>& all) const {
    for (int r = 0; r < size(); ++r) {
      if (!all[r].error.empty()) {
        throw ContractError(all[r].error + " (on rank " + std::to_string(r) + ")");
      }
    }
    std::vector<CallSignature> signatures;
    for (const Post& p : all) signatures.push_back(p.signature);
    detail::check_signatures(signatures);
  }

  // exchange -> check -> compute -> barrier -> copy scratch out. `compute`
  // returns the scratch holding the result, or null when it wrote `out` itself.
  template <typename Compute>
  void run(Post post, std::chrono::milliseconds timeout, Compute compute, size_t result_bytes = 0,
           void* out = nullptr) {
    const std::string what = detail::collective_name(post.signature.kind);
    const auto deadline = deadline_of(timeout);
    const auto& all = world_->exchange(rank_, std::move(post), deadline, what);
    check_posts(all);
    const void* staged = compute(all);
    world_->barrier(rank_, deadline, what);
    if (staged != nullptr) copy_bytes(out, staged, result_bytes);
  }

  uint8_t* scratch(size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  P2PHandle post_p2p(detail::P2PKind kind, const void* data, size_t count, DType dtype, int peer,
                     const P2POptions& options) {
    detail::check_p2p_args(kind, rank_, size(), peer, data, count, dtype, options);
    const detail::P2PFrame frame = detail::make_frame(
        kind == detail::P2PKind::kSend ? detail::P2PFrame::kRts : detail::P2PFrame::kRtr,
        options.tag, p2p_sequences_.next(kind, peer, options.tag), count, dtype);
    auto op =
        std::make_shared<ThreadP2POp>(world_, kind, rank_, peer, data, frame,
                                      options.timeout.count() > 0 ? options.timeout : timeout_);
    world_->p2p_post(op);
    return P2PHandle(op);
  }

  std::shared_ptr<ThreadWorld> world_;
  const int rank_;
  const std::chrono::milliseconds timeout_;
  uint64_t sequence_ = 0;
  // Sequence numbers only label the frames here (the queues keep the order).
  detail::P2PSequences p2p_sequences_;
  std::vector<uint8_t> scratch_;  // in-place results, reused across calls
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_communicators(
    int size, std::chrono::milliseconds timeout) {
  if (size < 1) {
    throw ContractError("kolo make_thread_communicators: size must be >= 1, got " +
                        std::to_string(size));
  }
  if (timeout.count() <= 0) {
    throw ContractError("kolo make_thread_communicators: timeout must be > 0 ms, got " +
                        std::to_string(timeout.count()));
  }
  auto world = std::make_shared<ThreadWorld>(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int rank = 0; rank < size; ++rank) {
    comms.push_back(std::make_unique<ThreadCommunicator>(world, rank, timeout));
  }
  return comms;
}

}  // namespace kolo

// The hierarchical communicator (hierarchical_communicator.h).
#include "comm/hierarchical_communicator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "comm/call_scratch.h"
#include "comm/p2p.h"
#include "comm/signature.h"
#include "comm/staged_reduction.h"
#include "kolo/core/errors.h"

namespace kolo::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long a rank that blames a peer waits for that peer's own report (a
// peer that is alive and gave up first writes one before aborting).
constexpr milliseconds kReportWait{500};

// How every fault message of a communicator ends (gloo's too).
constexpr const char* kAdvice =
    "; the communicator is unusable, rebuild it from the surviving ranks";

std::string join(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

// A fault in one part, already in the communicator's numbering.
struct PartFault {
  bool timed_out;
  std::vector<int> ranks;
  std::string text;
};

// "T|F <ranks...>\n<text>", as gloo's reports.
std::string encode(const PartFault& f) {
  std::string line = f.timed_out ? "T" : "F";
  for (int r : f.ranks) line += " " + std::to_string(r);
  return line + "\n" + f.text;
}

std::optional<PartFault> decode(const std::string& value) {
  const size_t newline = value.find('\n');
  std::istringstream head(value.substr(0, newline));
  std::string kind;
  if (!(head >> kind) || (kind != "T" && kind != "F")) return std::nullopt;
  PartFault f{kind == "T", {}, newline == std::string::npos ? "" : value.substr(newline + 1)};
  for (int r; head >> r;) f.ranks.push_back(r);
  return f;
}

class HierarchicalCommunicator : public Communicator {
 public:
  explicit HierarchicalCommunicator(HierarchicalParts parts)
      : p_(std::move(parts)),
        size_(static_cast<int>(p_.layout.host_of.size())),
        hosts_(static_cast<int>(p_.layout.members_of_host.size())),
        local_size_(static_cast<int>(p_.layout.members_of_host.front().size())),
        host_(p_.layout.host_of[p_.rank]),
        local_(p_.layout.local_index[p_.rank]) {
    // Members of each part, in the part's rank order, by communicator rank.
    local_members_ = p_.layout.members_of_host[host_];
    for (int h = 0; h < hosts_; ++h) cross_members_.push_back(p_.layout.members_of_host[h][local_]);
  }

  ~HierarchicalCommunicator() override = default;

  int rank() const override { return p_.rank; }
  int size() const override { return size_; }
  const char* backend() const override { return p_.flat->backend(); }

  void allreduce(const void* in, void* out, size_t count, DType dtype,
                 const AllreduceOptions& options) override {
    check_local_args(CollectiveKind::kAllreduce, size_, in, out, count, &options, 0);
    run(reduce_signature(CollectiveKind::kAllreduce, count, dtype, options), options.timeout,
        [&](const Deadline& deadline) {
          if (count == 0) return;
          const ReductionPlan plan = plan_reduction(dtype, options);
          allreduce_pipelined(in, out, count, dtype, plan, options, deadline);
        });
  }

  void reducescatter(const void* in, void* out, size_t count, DType dtype,
                     const AllreduceOptions& options) override {
    check_local_args(CollectiveKind::kReducescatter, size_, in, out, count, &options, 0);
    run(reduce_signature(CollectiveKind::kReducescatter, count, dtype, options), options.timeout,
        [&](const Deadline& deadline) {
          if (count == 0) return;
          const ReductionPlan plan = plan_reduction(dtype, options);
          const size_t wire_bytes = dtype_size(plan.wire);
          const size_t in_bytes = dtype_size(dtype);
          // Block of member k goes to [local index][host] order, so that the
          // host's reduce-scatter hands local member l the blocks of ring l.
          uint8_t* work = work_.get(static_cast<size_t>(size_) * count * wire_bytes);
          const uint8_t* input = static_cast<const uint8_t*>(in);
          for (int k = 0; k < size_; ++k) {
            const size_t at = static_cast<size_t>(p_.layout.local_index[k]) * hosts_ +
                              static_cast<size_t>(p_.layout.host_of[k]);
            stage_in(plan, options, input + k * count * in_bytes, work + at * count * wire_bytes,
                     count);
          }
          uint8_t* chunk = slice_.get(static_cast<size_t>(hosts_) * count * wire_bytes);
          AllreduceOptions wire_op;
          wire_op.op = plan.wire_op;
          in_part(kLocal, deadline, [&](milliseconds left) {
            wire_op.timeout = left;
            p_.local->reducescatter(work, chunk, hosts_ * count, plan.wire, wire_op);
          });
          in_part(kCross, deadline, [&](milliseconds left) {
            wire_op.timeout = left;
            p_.cross->reducescatter(chunk, chunk, count, plan.wire, wire_op);
          });
          stage_out(plan, options, chunk, out, count, size_);
        });
  }

  void allgather(const void* in, void* out, size_t count, DType dtype,
                 const CollectiveOptions& options) override {
    check_local_args(CollectiveKind::kAllgather, size_, in, out, count, nullptr, 0);
    run(plain_signature(CollectiveKind::kAllgather, count, dtype), options.timeout,
        [&](const Deadline& deadline) {
          if (count == 0) return;
          const size_t bytes = count * dtype_size(dtype);
          uint8_t* by_host = slice_.get(static_cast<size_t>(hosts_) * bytes);
          uint8_t* by_local = work_.get(static_cast<size_t>(size_) * bytes);
          in_part(kCross, deadline, [&](milliseconds left) {
            CollectiveOptions o;
            o.timeout = left;
            p_.cross->allgather(in, by_host, count, dtype, o);
          });
          in_part(kLocal, deadline, [&](milliseconds left) {
            CollectiveOptions o;
            o.timeout = left;
            p_.local->allgather(by_host, by_local, hosts_ * count, dtype, o);
          });
          uint8_t* result = static_cast<uint8_t*>(out);
          for (int h = 0; h < hosts_; ++h) {
            for (int l = 0; l < local_size_; ++l) {
              const int member = p_.layout.members_of_host[h][l];
              std::memcpy(result + member * bytes, by_local + (l * hosts_ + h) * bytes, bytes);
            }
          }
        });
  }

  void broadcast(void* buffer, size_t count, DType dtype,
                 const BroadcastOptions& options) override {
    check_local_args(CollectiveKind::kBroadcast, size_, buffer, buffer, count, nullptr,
                     options.root);
    CallSignature sig = plain_signature(CollectiveKind::kBroadcast, count, dtype);
    sig.root = options.root;
    run(sig, options.timeout, [&](const Deadline& deadline) {
      if (count == 0) return;
      const int root_host = p_.layout.host_of[options.root];
      const int root_local = p_.layout.local_index[options.root];
      BroadcastOptions o;
      if (local_ == root_local) {
        in_part(kCross, deadline, [&](milliseconds left) {
          o.root = root_host;
          o.timeout = left;
          p_.cross->broadcast(buffer, count, dtype, o);
        });
      }
      in_part(kLocal, deadline, [&](milliseconds left) {
        o.root = root_local;
        o.timeout = left;
        p_.local->broadcast(buffer, count, dtype, o);
      });
    });
  }

  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                  const CollectiveOptions& options) override {
    flat_call(options.timeout, [&](milliseconds left) {
      CollectiveOptions o = options;
      o.timeout = left;
      p_.flat->allgatherv(in, out, counts, dtype, o);
    });
  }

  void alltoall(const void* in, void* out, size_t count, DType dtype,
                const CollectiveOptions& options) override {
    flat_call(options.timeout, [&](milliseconds left) {
      CollectiveOptions o = options;
      o.timeout = left;
      p_.flat->alltoall(in, out, count, dtype, o);
    });
  }

  void alltoallv(const void* in, const std::vector<size_t>& send_counts, void* out,
                 const std::vector<size_t>& recv_counts, DType dtype,
                 const CollectiveOptions& options) override {
    flat_call(options.timeout, [&](milliseconds left) {
      CollectiveOptions o = options;
      o.timeout = left;
      p_.flat->alltoallv(in, send_counts, out, recv_counts, dtype, o);
    });
  }

  void barrier(const CollectiveOptions& options) override {
    flat_call(options.timeout, [&](milliseconds left) {
      CollectiveOptions o = options;
      o.timeout = left;
      p_.flat->barrier(o);
    });
  }

  // ---- Point to point ----
  //
  // Within the host through the local part (shm), across hosts through the
  // flat part (the network backend), each with the peer's rank in that
  // part. Only the two ranks take part, so a fault in a transfer is that
  // transfer's (the parts stay as usable as they leave themselves): its
  // message names the part, whose numbering it uses, and its failed ranks
  // are mapped to this communicator's.
  P2PHandle isend(const void* data, size_t count, DType dtype, int peer,
                  const P2POptions& options) override {
    return p2p(detail::P2PKind::kSend, const_cast<void*>(data), count, dtype, peer, options);
  }

  P2PHandle irecv(void* data, size_t count, DType dtype, int peer,
                  const P2POptions& options) override {
    return p2p(detail::P2PKind::kRecv, data, count, dtype, peer, options);
  }

  // From any thread (communicator.h): the parts give up at once, so a call
  // blocked in one fails and so do the peers; the caller sees `reason`.
  bool abort(const std::string& reason, const std::vector<int>& ranks) override {
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (abort_requested_.load(std::memory_order_relaxed)) return true;
      abort_reason_ =
          ranks.empty() ? "rank " + std::to_string(p_.rank) + " aborted: " + reason : reason;
      abort_ranks_ = ranks.empty() ? std::vector<int>{p_.rank} : ranks;
      abort_requested_.store(true, std::memory_order_release);
    }
    for (auto* part : {p_.local.get(), p_.cross.get(), p_.flat.get()}) {
      part->abort("rank " + std::to_string(p_.rank) +
                      " of the hierarchical communicator gave up: " + reason,
                  {});
    }
    return true;
  }

 private:
  enum Part { kLocal, kCross, kFlat };

  // Runs one collective: the cross-rank argument check (one small allgather
  // on the flat part, when check_args), then `body`; a fault in a part
  // becomes this communicator's RuntimeFault (file comment).
  template <typename Body>
  void run(CallSignature sig, milliseconds timeout, Body&& body) {
    throw_if_broken(collective_name(sig.kind));
    sig.sequence = sequence_++;
    const Deadline deadline(timeout.count() > 0 ? timeout : p_.timeout);
    if (p_.check_args && size_ > 1) {
      std::vector<CallSignature> all(size_);
      in_part(kFlat, deadline, [&](milliseconds left) {
        CollectiveOptions o;
        o.timeout = left;
        p_.flat->allgather(&sig, all.data(), sizeof(CallSignature), DType::kU8, o);
      });
      check_signatures(all);
    }
    body(deadline);
  }

  // Allreduce in chunks, so that the link is busy while the host works: the
  // cross-host allreduce of chunk k (on a helper thread) overlaps the
  // reduce-scatter of chunk k+1 and the allgather of chunk k-1 in the host
  // (this thread). Each chunk runs the unchunked algorithm on its elements,
  // so every element is reduced exactly as without chunks. The local part
  // sees the same call sequence on every member (RS0 RS1 AG0 RS2 AG1 ...),
  // the cross part one allreduce per chunk in order. A fault in either
  // thread aborts the other part, and the fault that came first is reported
  // through in_part, as an unchunked call would.
  void allreduce_pipelined(const void* in, void* out, size_t count, DType dtype,
                           const ReductionPlan& plan, const AllreduceOptions& options,
                           const Deadline& deadline) {
    const size_t wire_bytes = dtype_size(plan.wire);
    const size_t in_bytes = dtype_size(dtype);
    // Chunks of at least pipeline_chunk_bytes (a gloo call costs about a
    // millisecond on a busy host), at most kMaxChunks of them.
    const size_t total = count * wire_bytes;
    const size_t asked = hosts_ < 2 || local_size_ < 2 || p_.pipeline_chunk_bytes == 0
                             ? 1
                             : std::clamp<size_t>(total / p_.pipeline_chunk_bytes, size_t{1},
                                                  std::min(kMaxChunks, count));
    const size_t per_chunk = (count + asked - 1) / asked;
    const size_t chunks = (count + per_chunk - 1) / per_chunk;  // none empty
    const size_t slice_max = (per_chunk + local_size_ - 1) / local_size_;
    const size_t padded = slice_max * local_size_;
    uint8_t* work = work_.get(chunks * padded * wire_bytes);
    uint8_t* mine = slice_.get(chunks * slice_max * wire_bytes);
    AllreduceOptions wire_op;
    wire_op.op = plan.wire_op;
    auto begin_of = [&](size_t k) { return std::min(count, k * per_chunk); };
    auto count_of = [&](size_t k) { return begin_of(k + 1) - begin_of(k); };
    auto slice_of = [&](size_t k) { return (count_of(k) + local_size_ - 1) / local_size_; };
    auto work_of = [&](size_t k) { return work + k * padded * wire_bytes; };
    auto mine_of = [&](size_t k) { return mine + k * slice_max * wire_bytes; };

    // Stage chunk k and reduce-scatter it in the host.
    auto scatter = [&](size_t k) {
      const size_t n = count_of(k), slice = slice_of(k);
      stage_in(plan, options, static_cast<const uint8_t*>(in) + begin_of(k) * in_bytes, work_of(k),
               n);
      std::memset(work_of(k) + n * wire_bytes, 0, (slice * local_size_ - n) * wire_bytes);
      AllreduceOptions o = wire_op;
      o.timeout = std::max(deadline.remaining(), milliseconds(1));
      p_.local->reducescatter(work_of(k), mine_of(k), slice, plan.wire, o);
    };
    // Finish this member's slice of chunk k into its place in `out` (the
    // chunk's input is already staged, so `out` may alias `in`), then gather
    // the chunk's slices in the host.
    auto gather = [&](size_t k) {
      const size_t n = count_of(k), slice = slice_of(k);
      std::vector<size_t> counts(local_size_);
      for (int l = 0; l < local_size_; ++l) {
        const size_t b = std::min(n, l * slice);
        counts[l] = std::min(n, b + slice) - b;
      }
      uint8_t* result = static_cast<uint8_t*>(out) + begin_of(k) * in_bytes;
      const size_t offset = std::min(n, local_ * slice);
      stage_out(plan, options, mine_of(k), result + offset * in_bytes, counts[local_], size_);
      CollectiveOptions o;
      o.timeout = std::max(deadline.remaining(), milliseconds(1));
      p_.local->allgatherv(result + offset * in_bytes, result, counts, dtype, o);
    };
    auto cross = [&](size_t k) {
      AllreduceOptions o = wire_op;
      o.timeout = std::max(deadline.remaining(), milliseconds(1));
      p_.cross->allreduce(mine_of(k), mine_of(k), slice_of(k), plan.wire, o);
    };

    if (chunks == 1) {
      in_part(kLocal, deadline, [&](milliseconds) { scatter(0); });
      in_part(kCross, deadline, [&](milliseconds) { cross(0); });
      in_part(kLocal, deadline, [&](milliseconds) { gather(0); });
      return;
    }

    // Hand-off between the threads: chunks scattered, chunks reduced across
    // hosts, and the first failure (its part and exception).
    std::mutex mutex;
    std::condition_variable changed;
    size_t scattered = 0, crossed = 0;
    bool failed = false;
    Part failed_part = kLocal;
    std::exception_ptr failure;
    std::optional<PartFault> settled;  // a RuntimeFault's, reported before the abort below
    auto record = [&](Part part) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (failed) return;
        failed = true;
        failed_part = part;
        failure = std::current_exception();
      }
      changed.notify_all();
      // Settle and publish this rank's report before the other part gives
      // up (settle()): its peers there would otherwise find no report from
      // this rank and blame it (a far host's leader blaming the live leader
      // here instead of the rank that died).
      if (!abort_requested_.load(std::memory_order_acquire)) {
        try {
          std::rethrow_exception(failure);
        } catch (const RuntimeFault& fault) {
          settled = settle(part_fault(part, fault));
        } catch (...) {
          // a contract error: no peer is blamed
        }
      }
      // Unblock the other thread: its part gives up at once.
      (part == kLocal ? p_.cross : p_.local)
          ->abort("rank " + std::to_string(p_.rank) +
                      " of the hierarchical communicator gave up in its other part",
                  {});
    };
    std::thread helper([&] {
      try {
        for (size_t k = 0; k < chunks; ++k) {
          {
            std::unique_lock<std::mutex> lock(mutex);
            changed.wait(lock, [&] { return failed || scattered > k; });
            if (failed) return;
          }
          cross(k);
          {
            std::lock_guard<std::mutex> lock(mutex);
            crossed = k + 1;
          }
          changed.notify_all();
        }
      } catch (...) {
        record(kCross);
      }
    });
    try {
      auto mark_scattered = [&](size_t k) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          scattered = k + 1;
        }
        changed.notify_all();
      };
      auto wait_crossed = [&](size_t k) {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return failed || crossed > k; });
        return !failed;
      };
      bool ok = true;
      for (size_t k = 0; ok && k <= chunks; ++k) {
        if (k < chunks) {
          scatter(k);
          mark_scattered(k);
        }
        if (k >= 1) {
          ok = wait_crossed(k - 1);
          if (ok) gather(k - 1);
        }
      }
    } catch (...) {
      record(kLocal);
    }
    helper.join();
    if (failed) {
      if (settled) {
        throw_if_abort_requested();
        raise(*settled);
      }
      in_part(failed_part, deadline, [&](milliseconds) { std::rethrow_exception(failure); });
    }
  }

  // Pipelined allreduce: at most this many chunks (each one more call in
  // each part; 8 leave 1/8 of the host's work exposed).
  static constexpr size_t kMaxChunks = 8;

  // A collective the flat part runs whole (it checks its own arguments).
  template <typename Call>
  void flat_call(milliseconds timeout, Call&& call) {
    throw_if_broken("collective");
    const Deadline deadline(timeout.count() > 0 ? timeout : p_.timeout);
    in_part(kFlat, deadline, call);
  }

  // Calls `call(time left)` on one part, turning its faults into ours.
  template <typename Call>
  void in_part(Part part, const Deadline& deadline, Call&& call) {
    try {
      call(std::max(deadline.remaining(), milliseconds(1)));
    } catch (const ContractError&) {
      throw;  // the part stays usable: a mismatch is every rank's error
    } catch (const RuntimeFault& fault) {
      throw_if_abort_requested();
      raise(settle(part_fault(part, fault)));
    }
  }

  // A transfer of a part, whose errors are rethrown in this communicator's
  // terms (see isend).
  class PartP2POp : public detail::P2POp {
   public:
    PartP2POp(P2PHandle inner, std::vector<int> members, std::string label)
        : inner_(std::move(inner)), members_(std::move(members)), label_(std::move(label)) {}
    bool test() override {
      try {
        return inner_.test();
      } catch (const Error& e) {
        rethrow(e);
      }
    }
    void wait() override {
      try {
        inner_.wait();
      } catch (const Error& e) {
        rethrow(e);
      }
    }
    [[noreturn]] void rethrow(const Error& e) const {
      const std::string what = label_ + ": " + e.what();
      const auto* fault = dynamic_cast<const RuntimeFault*>(&e);
      if (fault == nullptr) throw ContractError(what);
      std::vector<int> ranks;
      for (int r : fault->failed_ranks()) {
        if (r >= 0 && r < static_cast<int>(members_.size())) ranks.push_back(members_[r]);
      }
      if (dynamic_cast<const TimeoutError*>(&e) != nullptr) throw TimeoutError(what, ranks);
      throw RuntimeFault(what, ranks);
    }

   private:
    P2PHandle inner_;
    std::vector<int> members_;  // part rank -> communicator rank
    std::string label_;         // part_label()
  };

  P2PHandle p2p(detail::P2PKind kind, void* data, size_t count, DType dtype, int peer,
                const P2POptions& options) {
    detail::check_p2p_args(kind, p_.rank, size_, peer, data, count, dtype, options);
    throw_if_broken(kind == detail::P2PKind::kSend ? "isend" : "irecv");
    const bool same_host = p_.layout.host_of[peer] == host_;
    const Part part = same_host ? kLocal : kFlat;
    Communicator& through = same_host ? *p_.local : *p_.flat;
    const int part_peer = same_host ? p_.layout.local_index[peer] : peer;
    const std::vector<int>& members = same_host ? local_members_ : all_members();
    PartP2POp mapper(P2PHandle(), members, part_label(part));
    try {
      P2PHandle inner = kind == detail::P2PKind::kSend
                            ? through.isend(data, count, dtype, part_peer, options)
                            : through.irecv(data, count, dtype, part_peer, options);
      return P2PHandle(std::make_shared<PartP2POp>(std::move(inner), members, part_label(part)));
    } catch (const Error& e) {
      mapper.rethrow(e);
    }
  }

  // A part's fault in this communicator's numbering (its ranks are the part's).
  PartFault part_fault(Part part, const RuntimeFault& fault) {
    const std::vector<int>& members = part == kLocal   ? local_members_
                                      : part == kCross ? cross_members_
                                                       : all_members();
    PartFault f{dynamic_cast<const TimeoutError*>(&fault) != nullptr,
                {},
                part_label(part) + ": " + without_advice(fault.what())};
    for (int r : fault.failed_ranks()) {
      if (r >= 0 && r < static_cast<int>(members.size())) f.ranks.push_back(members[r]);
    }
    return f;
  }

  // Which part a fault's text comes from: its ranks are that part's.
  std::string part_label(Part part) const {
    if (part == kLocal) {
      return "in host " + std::to_string(host_) +
             "'s part (ranks numbered within the host: " + join(local_members_) + ")";
    }
    if (part == kCross) {
      return "in cross-host ring " + std::to_string(local_) +
             " (ranks numbered by host: " + join(cross_members_) + ")";
    }
    return "in the flat part";
  }

  // A part's message without its closing advice (this communicator gives its own).
  static std::string without_advice(std::string text) {
    const size_t at = text.find(kAdvice);
    if (at != std::string::npos) text.erase(at, std::strlen(kAdvice));
    return text;
  }

  const std::vector<int>& all_members() {
    if (all_members_.empty()) {
      for (int r = 0; r < size_; ++r) all_members_.push_back(r);
    }
    return all_members_;
  }

  // The fault this rank reports, published for its peers: the view of a
  // blamed rank that gave up first (it is alive, and what it blamed is the
  // cause) unless it blames this rank, else its own. This rank's own view
  // goes out first, before it waits up to kReportWait for the blamed ranks'
  // (a dead one never reports): a peer that is itself waiting for this
  // rank's report, or sees this rank's parts go, must find a view naming the
  // rank that died, not give up and blame this one (the two waits raced).
  // Must run before this rank aborts any part.
  PartFault settle(PartFault f) {
    if (!f.ranks.empty()) publish_report(f);
    if (auto relayed = read_report(f.ranks)) {
      f = relayed->second;
      f.text += " (reported by rank " + std::to_string(relayed->first) + ")";
    }
    publish_report(f);
    return f;
  }

  // Breaks the communicator with the settled fault `f`: every part aborts
  // and the caller gets the RuntimeFault (TimeoutError) naming f.ranks.
  [[noreturn]] void raise(const PartFault& f) {
    const std::string message =
        "kolo hierarchical (rank " + std::to_string(p_.rank) + " of " + std::to_string(size_) +
        ", host " + std::to_string(host_) + "): " +
        (f.ranks.empty() ? std::string("a peer failed") : "rank(s) " + join(f.ranks) + " failed") +
        ": " + f.text + kAdvice;
    broken_ = message;
    broken_ranks_ = f.ranks;
    // The flat part numbers ranks as this communicator does: its peers that
    // see it go learn whom this rank blamed.
    const std::string why =
        "rank " + std::to_string(p_.rank) + " of the hierarchical communicator gave up";
    p_.local->abort(why, {});
    p_.cross->abort(why, {});
    p_.flat->abort(
        f.ranks.empty() ? why : why + ": rank(s) " + join(f.ranks) + " failed: " + f.text, f.ranks);
    if (f.timed_out) throw TimeoutError(message, f.ranks);
    throw RuntimeFault(message, f.ranks);
  }

  // abort() was called (from any thread): its reason and ranks.
  void throw_if_abort_requested() {
    if (!abort_requested_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(abort_mutex_);
    throw RuntimeFault(abort_reason_, abort_ranks_);
  }

  void throw_if_broken(const char* what) {
    throw_if_abort_requested();
    if (broken_.empty()) return;
    throw RuntimeFault(std::string("kolo ") + what +
                           ": the hierarchical communicator is unusable after an earlier fault (" +
                           broken_ + "); destroy it and build a new one",
                       broken_ranks_);
  }

  std::string report_key(int rank) const {
    return p_.prefix + "/hier/fault/" + std::to_string(rank);
  }

  void publish_report(const PartFault& f) {
    if (!p_.store) return;
    try {
      p_.store->set(report_key(p_.rank), to_bytes(encode(f)));
    } catch (const std::exception&) {
      // best effort: peers then blame this rank
    }
  }

  // The first report of one of `peers` that names a rank and not this one
  // (this rank is alive), with its author, waiting up to kReportWait.
  std::optional<std::pair<int, PartFault>> read_report(const std::vector<int>& peers) {
    if (!p_.store) return std::nullopt;
    const auto until = Clock::now() + kReportWait;
    try {
      while (true) {
        for (int peer : peers) {
          if (peer == p_.rank || !p_.store->check({report_key(peer)})) continue;
          auto f = decode(to_string(p_.store->get(report_key(peer), kReportWait)));
          if (f && !f->ranks.empty() &&
              std::find(f->ranks.begin(), f->ranks.end(), p_.rank) == f->ranks.end()) {
            return std::make_pair(peer, *f);
          }
        }
        if (Clock::now() >= until) return std::nullopt;
        std::this_thread::sleep_for(milliseconds(5));
      }
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  HierarchicalParts p_;
  int size_;
  int hosts_;
  int local_size_;
  int host_;   // this member's host
  int local_;  // this member's index within its host
  std::vector<int> local_members_;
  std::vector<int> cross_members_;
  std::vector<int> all_members_;
  uint64_t sequence_ = 0;
  Scratch work_;
  Scratch slice_;
  std::string broken_;
  std::vector<int> broken_ranks_;
  std::atomic<bool> abort_requested_{false};  // abort(): set once, from any thread
  std::mutex abort_mutex_;
  std::string abort_reason_;
  std::vector<int> abort_ranks_;
};

}  // namespace

HostLayout host_layout(const std::vector<int>& rank_hosts) {
  HostLayout layout;
  std::map<int, int> renumber;
  for (size_t k = 0; k < rank_hosts.size(); ++k) {
    auto [it, added] = renumber.emplace(rank_hosts[k], static_cast<int>(renumber.size()));
    if (added) layout.members_of_host.emplace_back();
    const int host = it->second;
    layout.host_of.push_back(host);
    layout.local_index.push_back(static_cast<int>(layout.members_of_host[host].size()));
    layout.members_of_host[host].push_back(static_cast<int>(k));
  }
  layout.even = !layout.members_of_host.empty();
  for (const auto& members : layout.members_of_host) {
    layout.even = layout.even && members.size() == layout.members_of_host.front().size();
  }
  return layout;
}

bool wants_hierarchy(const CommunicatorOptions& options) {
  if (options.hierarchical == "off" || options.rank_hosts.empty() || options.size < 2) {
    return false;
  }
  if (options.hierarchical != "on" && options.hierarchical != "auto") {
    throw ContractError("kolo make_communicator: hierarchical mode '" + options.hierarchical +
                        "' is not one of auto, on, off (KOLO_HIERARCHICAL)");
  }
  if (static_cast<int>(options.rank_hosts.size()) != options.size) {
    throw ContractError("kolo make_communicator: rank_hosts has " +
                        std::to_string(options.rank_hosts.size()) + " entries for " +
                        std::to_string(options.size) + " ranks");
  }
  const HostLayout layout = host_layout(options.rank_hosts);
  const size_t hosts = layout.members_of_host.size();
  if (hosts < 2) return false;
  if (!layout.even) {
    if (options.hierarchical == "auto") return false;
    std::string counts;
    for (size_t h = 0; h < hosts; ++h) {
      counts += (counts.empty() ? "" : ", ") + std::to_string(layout.members_of_host[h].size());
    }
    throw ContractError(
        "kolo make_communicator: KOLO_HIERARCHICAL=on needs the same number of ranks on every "
        "host, but the " +
        std::to_string(hosts) + " hosts have " + counts +
        "; place ranks evenly (e.g. -H a:2,b:2) or set KOLO_HIERARCHICAL=auto or off");
  }
  return options.hierarchical == "on" || layout.members_of_host.front().size() > 1;
}

std::unique_ptr<Communicator> make_hierarchical_communicator(HierarchicalParts parts) {
  return std::make_unique<HierarchicalCommunicator>(std::move(parts));
}

std::unique_ptr<Communicator> build_hierarchical_communicator(const std::string& backend,
                                                              const CommunicatorOptions& options) {
  HierarchicalParts parts;
  parts.rank = options.rank;
  parts.layout = host_layout(options.rank_hosts);
  parts.store = options.store;
  parts.prefix = options.prefix;
  parts.timeout = options.timeout;
  parts.check_args = options.check_args;
  const int host = parts.layout.host_of[options.rank];
  const int local = parts.layout.local_index[options.rank];
  // World ranks of members, for mpi (which builds groups from them).
  auto world_ranks_of = [&](const std::vector<int>& members) {
    std::vector<int> ranks;
    for (int m : members) ranks.push_back(options.world_ranks.empty() ? m : options.world_ranks[m]);
    return ranks;
  };
  auto part_options = [&](const std::vector<int>& members, int index, const std::string& name) {
    CommunicatorOptions o = options;
    o.hierarchical = "off";
    o.rank_hosts.clear();
    o.check_args = false;  // checked once, on the flat part, by the composite
    o.rank = index;
    o.size = static_cast<int>(members.size());
    o.prefix = options.prefix + "/hier/" + name;
    o.world_ranks = world_ranks_of(members);
    return o;
  };
  std::vector<int> cross_members;
  for (const auto& members : parts.layout.members_of_host) cross_members.push_back(members[local]);
  const std::string local_backend = backend == "mpi" ? "mpi" : "shm";
  parts.local = make_communicator(
      local_backend,
      part_options(parts.layout.members_of_host[host], local, "host" + std::to_string(host)));
  parts.cross =
      make_communicator(backend, part_options(cross_members, host, "ring" + std::to_string(local)));
  std::vector<int> everyone(options.size);
  for (int r = 0; r < options.size; ++r) everyone[r] = r;
  parts.flat = make_communicator(backend, part_options(everyone, options.rank, "flat"));
  return make_hierarchical_communicator(std::move(parts));
}

}  // namespace kolo::detail

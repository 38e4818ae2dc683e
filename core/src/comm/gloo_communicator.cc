// gloo backend: collectives over TCP through Debian's libgloo (0.5).
//
// kolo uses gloo for its transport only: the TCP device, the full mesh of
// pairs built through the rendezvous store, and unbound buffers
// (point-to-point send/recv, each wait with its own timeout): the pieces kolo
// builds on them are in gloo_transport.h, its point-to-point transfers in
// gloo_p2p.h. This file holds the communicator and its algorithms, which are
// kolo's, written on top, because
//  - every wait then knows which peer it waits on, so a dead peer is named;
//  - reductions run kolo's kernels (reduce.h) with f32/f64 staging
//    (staged_reduction.h), so results agree with the other backends;
//  - the timeout is per call (gloo's algorithm classes take it from the pairs,
//    fixed when they connect).
// Algorithms: allreduce = ring reduce-scatter + ring allgather (each rank moves
// 2(n-1)/n of the data, segments pipelined so reduction overlaps the
// transfer); a staged reduction (f16/bf16 sums, scaled integers: reduce.h
// accumulates them in a wider type) reduce-scatters directly instead, every
// rank sending each block of its input in the caller's dtype to the block's
// owner, which reduces the n inputs in rank order with reduce.h's kernel:
// the same bytes as the ring in the narrow type (half of a float32 ring's
// for f16), and exactly reduce.h's result; ring reducescatter and
// allgather(v); broadcast by binomial tree
// (small) or pipelined chain (large); direct exchange for alltoall(v) and for
// the argument-check signatures; dissemination barrier.
//
// Faults: a gloo error while waiting on peer P means P died, closed its
// connections or timed out. Before giving up, a rank writes a fault report
// ("<prefix>/gloo/fault/<rank>") naming the rank it blames, then closes all
// its connections, so that every rank blocked on it fails at once instead of
// waiting for its timeout. A rank that sees P close reads P's report (P writes
// it before closing) and names the rank P blamed: every survivor names the
// rank that actually died. The communicator is unusable afterwards.
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "comm/backends.h"
#include "comm/call_scratch.h"
#include "comm/gloo_p2p.h"
#include "comm/gloo_transport.h"
#include "comm/p2p.h"
#include "comm/signature.h"
#include "comm/staged_reduction.h"
#include "kolo/core/config.h"
#include "kolo/core/errors.h"
#include "kolo/core/split.h"
#include "kolo/core/store.h"
#include "kolo/core/topology.h"
#include "reduce.h"

namespace kolo::detail {

namespace {

using namespace gloo_tcp;

// Bytes per pipelined message of the ring algorithms: small enough to overlap
// reduction with transfer, large enough to amortise gloo's per-message
// handshake (a send moves once the receiver has posted its recv). Measured on
// 2 ranks over loopback: 64 MiB allreduce at ~1.2 GB/s with 1 MiB, ~0.9 with
// 256 KiB segments. But a ring step starts with one segment's transfer
// before anything overlaps, so a phase needs several: a phase (n-1 blocks per
// rank) is cut into at least kSegmentsPerPhase segments, down to
// kMinSegmentBytes. With 1 MiB segments always, a 2-rank allreduce across a
// 1 Gbit/s link (blocks of 0.5-2 MiB) took 0.66-0.80x raw gloo's time at
// 1-4 MiB, and the hierarchical allreduce, whose cross-host calls are
// 2-rank allreduces of 2 MiB at 2 hosts, reached 77-80% of the link.
constexpr size_t kSegmentBytes = 1024 * 1024;
constexpr size_t kMinSegmentBytes = 64 * 1024;
constexpr size_t kSegmentsPerPhase = 8;
// Receive slots in flight per ring step of reduce-scatter (bounds its scratch).
constexpr size_t kRecvWindow = 4;
// Broadcasts up to this size use the binomial tree (latency), larger ones the
// pipelined chain (bandwidth).
constexpr size_t kTreeBroadcastBytes = 64 * 1024;
// Allreduces up to this size (per rank) gather every input in one exchange and
// reduce locally: one message latency instead of 2(n-1) ring steps.
constexpr size_t kDirectReduceBytes = 64 * 1024;
// Bound on sending the goodbyes when a communicator is destroyed.
constexpr milliseconds kGoodbyeTimeout{1000};
// How long a rank that saw a peer close waits for that peer's fault report.
constexpr milliseconds kReportWait{500};

size_t mod(long long value, int n) { return static_cast<size_t>(((value % n) + n) % n); }

// Element ranges (offset, length) of the n blocks a ring algorithm moves.
struct Blocks {
  std::vector<size_t> offset;
  std::vector<size_t> length;
  size_t total = 0;
};

Blocks blocks_from_counts(const std::vector<size_t>& counts) {
  Blocks blocks;
  for (size_t count : counts) {
    blocks.offset.push_back(blocks.total);
    blocks.length.push_back(count);
    blocks.total += count;
  }
  return blocks;
}

Blocks even_blocks(size_t count, int n) {
  std::vector<size_t> counts(n);
  for (int k = 0; k < n; ++k) counts[k] = static_cast<size_t>(even_split(count, n, k).count);
  return blocks_from_counts(counts);
}

struct Segment {
  size_t offset_bytes;
  size_t bytes;
  int step;  // ring step that moves it
};
using SegmentSink = std::function<void(const Segment&)>;

// A ring phase of n ranks moves n-1 blocks per rank; at least
// kSegmentsPerPhase segments in all.
size_t segments_per_block(size_t n) { return n < 2 ? 1 : (kSegmentsPerPhase + n - 2) / (n - 1); }

// The segment size of a call over `blocks` (whole elements; the same on
// every rank, since every rank has the same blocks).
size_t segment_bytes(const Blocks& blocks, size_t element_bytes) {
  size_t largest = 0;
  for (size_t length : blocks.length) largest = std::max(largest, length);
  const size_t bytes =
      std::clamp(largest * element_bytes / segments_per_block(blocks.length.size()),
                 kMinSegmentBytes, kSegmentBytes);
  return std::max<size_t>(1, bytes / element_bytes) * element_bytes;
}

void append_segments(std::vector<Segment>& out, const Blocks& blocks, size_t block,
                     size_t element_bytes, int step) {
  const size_t seg = segment_bytes(blocks, element_bytes);
  const size_t begin = blocks.offset[block] * element_bytes;
  const size_t end = begin + blocks.length[block] * element_bytes;
  for (size_t at = begin; at < end; at += seg) out.push_back({at, std::min(seg, end - at), step});
}

class GlooCommunicator : public Communicator {
 public:
  explicit GlooCommunicator(const CommunicatorOptions& options)
      : rank_(options.rank),
        size_(options.size),
        store_(options.store),
        prefix_(options.prefix + "/gloo/"),
        default_timeout_(options.timeout),
        check_args_(options.check_args),
        iface_(options.gloo_iface),
        host_name_(options.host_name) {
    if (size_ > 1) {
      SigpipeGuard guard;
      connect();
    }
  }

  ~GlooCommunicator() override {
    try {
      close_p2p();
      if (monitor_ && fault_.empty()) say_goodbye();
      monitor_.reset();
      context_.reset();
      device_.reset();
    } catch (...) {
      // A destructor must not throw; the sockets are closed either way.
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "gloo"; }

  // The peers of the waits in progress (each wait names one peer, see Channel).
  std::optional<std::vector<int>> waiting_for() const override {
    if (!monitor_) return std::vector<int>{};
    return monitor_->waiting_peers();
  }

  // From any thread (communicator.h). A report with no blamed rank makes
  // peers blame this one (read_report).
  bool abort(const std::string& reason, const std::vector<int>& ranks) override {
    if (!monitor_) return false;  // a world of one never waits
    FaultReport report;
    report.aborted = true;
    report.text = ranks.empty() ? "rank " + std::to_string(rank_) + " aborted: " + reason : reason;
    report.ranks = ranks;
    // A wait in progress ends; its thread tells the peers (handle_fault).
    if (monitor_->abort(report.text, report.ranks)) return true;
    // No call in progress: tell them now.
    publish_report(report);
    try {
      SigpipeGuard guard;
      context_->closeConnections();
    } catch (const std::exception&) {
      // Pairs already closed.
    }
    return true;
  }

  void allreduce(const void* in, void* out, size_t count, DType dtype,
                 const AllreduceOptions& options) override {
    check_local_args(CollectiveKind::kAllreduce, size_, in, out, count, &options, 0);
    CallSignature sig = reduce_signature(CollectiveKind::kAllreduce, count, dtype, options);
    run(sig, options.timeout, [&](uint64_t seq, const Deadline& deadline) {
      if (count == 0) return;
      const size_t out_bytes = dtype_size(dtype);
      if (size_ == 1 || count * out_bytes <= kDirectReduceBytes) {
        direct_allreduce(in, out, count, dtype, options, slot(seq, 1), deadline);
        return;
      }
      const ReductionPlan plan = plan_reduction(dtype, options);
      uint8_t* result = static_cast<uint8_t*>(out);
      const Blocks blocks = even_blocks(count, size_);
      if (plan.staged) {
        // The narrow dtype on the wire, reduced once by each block's owner.
        direct_reduce_scatter(static_cast<const uint8_t*>(in), blocks, dtype, options,
                              result + blocks.offset[rank_] * out_bytes, slot(seq, 1), deadline);
        ring_allgather(result, blocks, out_bytes, slot(seq, 2), deadline);
        return;
      }
      // Not staged: the wire dtype is the caller's, so the reduction runs in
      // place in the output.
      stage_in(plan, options, in, result, count);
      if (size_ == 2) {  // see ring_allreduce
        ring_allreduce(result, blocks, plan, options, slot(seq, 1), slot(seq, 2), deadline);
        return;
      }
      ring_reduce_scatter(result, blocks, plan.wire, plan.wire_op, slot(seq, 1), deadline);
      const size_t mine = blocks.offset[rank_] * out_bytes;
      stage_out(plan, options, result + mine, result + mine, blocks.length[rank_], size_);
      ring_allgather(result, blocks, out_bytes, slot(seq, 2), deadline);
    });
  }

  void allgather(const void* in, void* out, size_t count, DType dtype,
                 const CollectiveOptions& options) override {
    check_local_args(CollectiveKind::kAllgather, size_, in, out, count, nullptr, 0);
    CallSignature sig = plain_signature(CollectiveKind::kAllgather, count, dtype);
    run(sig, options.timeout, [&](uint64_t seq, const Deadline& deadline) {
      if (count == 0) return;
      const size_t element_bytes = dtype_size(dtype);
      uint8_t* result = static_cast<uint8_t*>(out);
      uint8_t* mine = result + rank_ * count * element_bytes;
      if (in != mine) std::memcpy(mine, in, count * element_bytes);
      const Blocks blocks = blocks_from_counts(std::vector<size_t>(size_, count));
      gather_blocks(result, blocks, element_bytes, slot(seq, 1), deadline);
    });
  }

  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                  const CollectiveOptions& options) override {
    check_counts_arg(CollectiveKind::kAllgatherv, "counts", counts, size_);
    size_t total = 0;
    for (size_t c : counts) total += c;
    check_local_args(CollectiveKind::kAllgatherv, size_, counts[rank_] > 0 ? in : out, out, total,
                     nullptr, 0);
    CallSignature sig = plain_signature(CollectiveKind::kAllgatherv, hash_counts(counts), dtype);
    run(sig, options.timeout, [&](uint64_t seq, const Deadline& deadline) {
      if (total == 0) return;
      const size_t element_bytes = dtype_size(dtype);
      const Blocks blocks = blocks_from_counts(counts);
      uint8_t* result = static_cast<uint8_t*>(out);
      uint8_t* mine = result + blocks.offset[rank_] * element_bytes;
      if (counts[rank_] > 0 && in != mine) std::memcpy(mine, in, counts[rank_] * element_bytes);
      gather_blocks(result, blocks, element_bytes, slot(seq, 1), deadline);
    });
  }

  void broadcast(void* buffer, size_t count, DType dtype,
                 const BroadcastOptions& options) override {
    check_local_args(CollectiveKind::kBroadcast, size_, buffer, buffer, count, nullptr,
                     options.root);
    CallSignature sig = plain_signature(CollectiveKind::kBroadcast, count, dtype);
    sig.root = options.root;
    run(sig, options.timeout, [&](uint64_t seq, const Deadline& deadline) {
      const size_t bytes = count * dtype_size(dtype);
      if (bytes == 0 || size_ == 1) return;
      if (bytes <= kTreeBroadcastBytes || size_ == 2) {
        tree_broadcast(static_cast<uint8_t*>(buffer), bytes, options.root, slot(seq, 1), deadline);
      } else {
        chain_broadcast(static_cast<uint8_t*>(buffer), bytes, options.root, slot(seq, 1), deadline);
      }
    });
  }

  void reducescatter(const void* in, void* out, size_t count, DType dtype,
                     const AllreduceOptions& options) override {
    check_local_args(CollectiveKind::kReducescatter, size_, in, out, count, &options, 0);
    CallSignature sig = reduce_signature(CollectiveKind::kReducescatter, count, dtype, options);
    run(sig, options.timeout, [&](uint64_t seq, const Deadline& deadline) {
      if (count == 0) return;
      const ReductionPlan plan = plan_reduction(dtype, options);
      const size_t wire_bytes = dtype_size(plan.wire);
      const size_t total = count * size_;
      const Blocks blocks = blocks_from_counts(std::vector<size_t>(size_, count));
      if (plan.staged && size_ > 1) {
        direct_reduce_scatter(static_cast<const uint8_t*>(in), blocks, dtype, options,
                              static_cast<uint8_t*>(out), slot(seq, 1), deadline);
        return;
      }
      // `in` is const (and in place only the first block may be overwritten),
      // so the reduction always runs in scratch.
      uint8_t* work = work_.get(total * wire_bytes);
      stage_in(plan, options, in, work, total);
      ring_reduce_scatter(work, blocks, plan.wire, plan.wire_op, slot(seq, 1), deadline);
      stage_out(plan, options, work + rank_ * count * wire_bytes, out, count, size_);
    });
  }

  void alltoall(const void* in, void* out, size_t count, DType dtype,
                const CollectiveOptions& options) override {
    check_local_args(CollectiveKind::kAlltoall, size_, in, out, count, nullptr, 0);
    CallSignature sig = plain_signature(CollectiveKind::kAlltoall, count, dtype);
    run(sig, options.timeout, [&](uint64_t seq, const Deadline& deadline) {
      if (count == 0) return;
      const std::vector<size_t> counts(size_, count);
      exchange(in, counts, out, counts, dtype_size(dtype), slot(seq, 1), deadline);
    });
  }

  void alltoallv(const void* in, const std::vector<size_t>& send_counts, void* out,
                 const std::vector<size_t>& recv_counts, DType dtype,
                 const CollectiveOptions& options) override {
    check_alltoallv_args(size_, in, send_counts, out, recv_counts);
    CallSignature sig = plain_signature(CollectiveKind::kAlltoallv, 0, dtype);
    run(sig, options.timeout, [&](uint64_t seq, const Deadline& deadline) {
      if (check_args_ && size_ > 1) check_alltoallv(send_counts, recv_counts, seq, deadline);
      exchange(in, send_counts, out, recv_counts, dtype_size(dtype), slot(seq, 3), deadline);
    });
  }

  P2PHandle isend(const void* data, size_t count, DType dtype, int peer,
                  const P2POptions& options) override {
    return post_p2p(P2PKind::kSend, const_cast<void*>(data), count, dtype, peer, options);
  }

  P2PHandle irecv(void* data, size_t count, DType dtype, int peer,
                  const P2POptions& options) override {
    return post_p2p(P2PKind::kRecv, data, count, dtype, peer, options);
  }

  void barrier(const CollectiveOptions& options) override {
    CallSignature sig;
    sig.kind = CollectiveKind::kBarrier;
    run(sig, options.timeout, [&](uint64_t seq, const Deadline& deadline) {
      // Dissemination: after round k every rank has heard (indirectly) from
      // 2^(k+1) ranks; ceil(log2 n) rounds.
      uint8_t token_out = 1;
      uint8_t token_in = 0;
      int round = 0;
      for (int distance = 1; distance < size_; distance <<= 1, ++round) {
        Channel to(link(), static_cast<int>(mod(rank_ + distance, size_)), &token_out, 1,
                   slot(seq, 4 + round));
        Channel from(link(), static_cast<int>(mod(rank_ - distance, size_)), &token_in, 1,
                     slot(seq, 4 + round));
        from.post_recv(0, 1);
        to.post_send(0, 1);
        from.drain(deadline);
        to.drain(deadline);
      }
    });
  }

 private:
  // ---- Setup -----------------------------------------------------------------

  void connect() {
    if (!store_) {
      throw ContractError(
          "kolo make_communicator(gloo): options.store is null; the gloo backend "
          "of a " +
          std::to_string(size_) +
          "-rank world needs a rendezvous "
          "store (kolorun serves one; tests use make_memory_store or "
          "make_file_store)");
    }
    const std::string& iface = iface_;
    const std::string host = host_name_.empty() ? system_host_name() : host_name_;

    // Every rank publishes its host name: all on one host -> loopback. This
    // also waits until every rank has arrived, with a message naming the late.
    store_->set(prefix_ + "host/" + std::to_string(rank_), to_bytes(host));
    std::vector<std::string> host_keys;
    for (int r = 0; r < size_; ++r) host_keys.push_back(prefix_ + "host/" + std::to_string(r));
    try {
      store_->wait(host_keys, default_timeout_);
    } catch (const TimeoutError&) {
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) {
        if (!store_->check({host_keys[r]})) missing.push_back(r);
      }
      throw TimeoutError("kolo make_communicator(gloo): rank(s) " + join_ranks(missing) +
                             " did not arrive at rendezvous '" + prefix_ + "' within " +
                             std::to_string(default_timeout_.count()) + " ms",
                         missing);
    }
    bool all_local = true;
    std::vector<std::string> peer_hosts;
    for (int r = 0; r < size_; ++r) {
      peer_hosts.push_back(to_string(store_->get(host_keys[r], default_timeout_)));
      if (peer_hosts.back() != host) all_local = false;
    }

    gloo::transport::tcp::attr attr;
    std::string where;
    if (!iface.empty()) {
      attr.iface = iface;
      where = "interface " + iface + " (KOLO_GLOO_IFACE)";
    } else {
      attr.hostname = all_local ? "127.0.0.1" : reachable_address(system_host_name(), peer_hosts);
      where = "address " + attr.hostname;
    }
    try {
      device_ = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& error) {
      throw ContractError("kolo make_communicator(gloo): cannot open a TCP device on " + where +
                          ": " + error.what() +
                          (iface.empty() ? "; set KOLO_GLOO_IFACE to a network interface"
                                         : "; check the interface name (ip link)"));
    }

    context_ = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context_->setTimeout(default_timeout_);
    StoreAdapter adapter(store_, prefix_ + "mesh/", default_timeout_);
    try {
      context_->connectFullMesh(adapter, device_);
    } catch (const TimeoutError& error) {
      throw TimeoutError(std::string("kolo make_communicator(gloo): connecting the full mesh "
                                     "timed out: ") +
                         error.what());
    } catch (const Error&) {
      throw;
    } catch (const std::exception& error) {
      throw RuntimeFault(std::string("kolo make_communicator(gloo): connecting rank ") +
                         std::to_string(rank_) + " to its peers on " + where +
                         " failed: " + error.what());
    }
    start_monitor();
  }

  // Publishes this rank's end of every pair, as gloo prints it in errors seen
  // by the peer, and starts the monitor with the peers' ends.
  void start_monitor() {
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      store_->set(address_key(rank_, peer), to_bytes(context_->getPair(peer)->address().str()));
    }
    std::vector<std::pair<std::string, int>> addresses;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      addresses.emplace_back(to_string(store_->get(address_key(peer, rank_), default_timeout_)),
                             peer);
    }
    monitor_ = std::make_unique<PeerMonitor>(*context_, std::move(addresses));
  }

  std::string address_key(int owner, int peer) const {
    return prefix_ + "addr/" + std::to_string(owner) + "/" + std::to_string(peer);
  }

  Link link() { return Link{*context_, *monitor_}; }

  // Tells every peer this rank leaves in order (see PeerMonitor). Bounded:
  // a peer that is gone or stuck must not hold up the destructor.
  void say_goodbye() {
    SigpipeGuard guard;
    uint8_t byte = 0;
    auto buffer = context_->createUnboundBuffer(&byte, 1);
    int posted = 0;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      try {
        buffer->send(peer, PeerMonitor::kSentinelSlot, 0, 1);
        ++posted;
      } catch (const std::exception&) {
        // Connection already gone.
      }
    }
    const Deadline deadline(std::min(default_timeout_, kGoodbyeTimeout));
    try {
      for (int i = 0; i < posted; ++i) {
        const milliseconds left = deadline.remaining();
        if (left.count() <= 0 || !buffer->waitSend(nullptr, left)) break;
      }
    } catch (const std::exception&) {
      // Closing anyway.
    }
  }

  // ---- Calls -------------------------------------------------------------------

  // Slots keep the messages of different calls and phases apart.
  static uint64_t slot(uint64_t sequence, int phase) { return (sequence << 8) | phase; }

  // Runs one collective: argument check across ranks, then `body`, turning
  // transport failures into RuntimeFault / TimeoutError.
  template <typename Body>
  void run(CallSignature sig, milliseconds timeout, Body&& body) {
    const char* op = collective_name(sig.kind);
    if (!fault_.empty()) {
      throw RuntimeFault(std::string("kolo gloo ") + op +
                             ": the communicator is unusable after "
                             "an earlier fault (" +
                             fault_ + "); destroy it and build a new one",
                         fault_ranks_);
    }
    const uint64_t sequence = sequence_++;
    sig.sequence = sequence;
    const Deadline deadline(timeout.count() > 0 ? timeout : default_timeout_);
    SigpipeGuard guard;
    try {
      if (check_args_ && size_ > 1) {
        std::vector<CallSignature> all(size_);
        direct_allgather(&sig, all.data(), sizeof(CallSignature), slot(sequence, 0), deadline);
        check_signatures(all);
      }
      body(sequence, deadline);
    } catch (const PeerError& error) {
      handle_fault(op, error, deadline);
    }
  }

  [[noreturn]] void handle_fault(const char* op, const PeerError& error, const Deadline& deadline) {
    std::string message = std::string("kolo gloo ") + op + " (rank " + std::to_string(rank_) +
                          " of " + std::to_string(size_) + "): ";
    FaultReport aborted;
    aborted.aborted = true;
    if (monitor_->aborted(&aborted.text, &aborted.ranks)) {
      // Communicator::abort: this rank gives up on the ranks it names. The
      // report lets peers that see the connections close name them too.
      publish_report(aborted);
      try {
        context_->closeConnections();
      } catch (const std::exception&) {
      }
      fault_ = message + aborted.text;
      fault_ranks_ = aborted.ranks;
      throw RuntimeFault(fault_, fault_ranks_);
    }
    // Who broke: the peer the monitor saw fail, else the one gloo's own
    // message names (the calling thread's wait can fail on a broken pair
    // before the monitor's thread has seen it), else the waited-on peer,
    // unless the message names another host than that peer's: then every
    // peer on that host (ranks 0 and 1 blaming each other while rank 3 on
    // the other host had died was seen across test hosts).
    std::vector<int> suspects{error.peer};
    if (!error.timed_out) {
      const int broken = monitor_->broken_peer();
      const std::vector<int> named =
          broken >= 0 ? std::vector<int>{broken}
                      : monitor_->peers_named_in(monitor_->detail().empty() ? error.detail
                                                                            : monitor_->detail());
      if (named.size() == 1 || std::find(named.begin(), named.end(), error.peer) == named.end()) {
        if (!named.empty()) suspects = named;
      }
    }
    FaultReport cause;
    cause.timed_out = error.timed_out;
    cause.ranks = suspects;
    if (error.timed_out) {
      cause.text = "rank " + std::to_string(rank_) + " timed out after " +
                   std::to_string(deadline.timeout().count()) + " ms waiting for rank " +
                   std::to_string(error.peer);
      if (monitor_->has_departed(error.peer)) {
        cause.text += ", which had destroyed its communicator (it did not make this call)";
      }
    } else {
      const std::string monitored = monitor_->detail();
      const std::string detail = without_location(monitored.empty() ? error.detail : monitored);
      cause.text = "lost rank " + join_ranks(suspects) + " (" + detail + ")";
      // This rank's own view goes out before it waits for the suspects': gloo
      // can break this rank's other connections as soon as one fails, and a
      // survivor that sees that must find this view, not blame this rank
      // (both waiting kReportWait for each other's report raced). A view
      // that cannot tell which of several peers broke is not published: it
      // would name live ranks.
      if (suspects.size() == 1) publish_report(cause);
      if (auto relayed = read_report(suspects)) {
        // A suspect gave up first (it is alive); blame what it blamed.
        const int reporter = relayed->first;
        cause = relayed->second;
        if (cause.ranks.empty()) cause.ranks = {reporter};
        cause.text += " (reported by rank " + std::to_string(reporter) + ")";
      }
    }
    message += cause.text;
    message += "; the communicator is unusable, rebuild it from the surviving ranks";

    // Report first, then close: a peer that sees the close finds the report.
    publish_report(cause);
    try {
      context_->closeConnections();
    } catch (const std::exception&) {
      // Pairs already closed by the error.
    }
    fault_ = message;
    fault_ranks_ = cause.ranks;
    if (cause.timed_out) throw TimeoutError(message, cause.ranks);
    throw RuntimeFault(message, cause.ranks);
  }

  // Best effort: without the report peers blame this rank instead.
  void publish_report(const FaultReport& report) {
    try {
      store_->set(prefix_ + "fault/" + std::to_string(rank_), to_bytes(report.encode()));
    } catch (const std::exception&) {
    }
  }

  // The first report of one of `peers` that does not blame this rank (this
  // rank is alive: the peer saw its connections go), or that blames it by
  // the peer's own decision (an abort: a stall check gave up waiting for
  // this rank, whose reason is the true one), with its author, waiting up to
  // kReportWait for one.
  std::optional<std::pair<int, FaultReport>> read_report(const std::vector<int>& peers) {
    const auto until = Clock::now() + kReportWait;
    try {
      while (true) {
        for (int peer : peers) {
          if (peer < 0 || peer == rank_) continue;
          const std::string key = prefix_ + "fault/" + std::to_string(peer);
          if (!store_->check({key})) continue;
          auto report = FaultReport::decode(to_string(store_->get(key, kReportWait)));
          if (report && (report->aborted || std::find(report->ranks.begin(), report->ranks.end(),
                                                      rank_) == report->ranks.end())) {
            return std::make_pair(peer, *report);
          }
        }
        if (Clock::now() >= until) return std::nullopt;
        std::this_thread::sleep_for(milliseconds(5));
      }
    } catch (const std::exception&) {
      return std::nullopt;  // store gone too: blame the suspects themselves
    }
  }

  // ---- Point to point (see "Point to point" above) ---------------------------

  void check_usable(const std::string& what) const {
    if (!fault_.empty()) {
      throw RuntimeFault(what + " (gloo): the communicator is unusable after an earlier fault (" +
                             fault_ + "); destroy it and build a new one",
                         fault_ranks_);
    }
  }

  // `data` is only read for a send (gloo's buffer type is not const).
  P2PHandle post_p2p(P2PKind kind, void* data, size_t count, DType dtype, int peer,
                     const P2POptions& options) {
    check_p2p_args(kind, rank_, size_, peer, data, count, dtype, options);
    const std::string name = p2p_what(kind, peer, options.tag);
    check_usable("kolo " + name);
    if (!p2p_) {
      p2p_ = std::make_shared<GlooP2PState>(link(), rank_, size_, default_timeout_);
      p2p_->on_fault = [this](const char* op, const PeerError& error, const Deadline& deadline) {
        handle_fault(op, error, deadline);
      };
      p2p_->check_usable = [this](const std::string& what) { check_usable(what); };
    }
    const bool send = kind == P2PKind::kSend;
    const uint64_t sequence = p2p_->sequences.next(kind, peer, options.tag);
    const P2PFrame frame =
        make_frame(send ? P2PFrame::kRts : P2PFrame::kRtr, options.tag, sequence, count, dtype);
    auto op = std::make_shared<GlooP2POp>(
        p2p_, kind, peer, frame, data,
        options.timeout.count() > 0 ? options.timeout : default_timeout_);
    const int tag = options.tag;
    SigpipeGuard guard;
    try {
      op->frame_in.emplace(link(), peer, &op->theirs, sizeof(P2PFrame),
                           p2p_slot(send ? P2PSlot::kRtr : P2PSlot::kRts, tag, sequence));
      op->frame_in->post_recv(0, sizeof(P2PFrame));
      op->frame_out.emplace(link(), peer, const_cast<P2PFrame*>(&op->mine), sizeof(P2PFrame),
                            p2p_slot(send ? P2PSlot::kRts : P2PSlot::kRtr, tag, sequence));
      op->frame_out->post_send(0, sizeof(P2PFrame));
      const uint64_t data_slot = p2p_slot(P2PSlot::kData, tag, sequence);
      if (send) {
        op->payload.emplace(link(), peer, data, op->bytes, data_slot);
        for (size_t at = 0; at < op->bytes; at += kP2PChunkBytes) {
          op->payload->post_send(at, std::min(kP2PChunkBytes, op->bytes - at));
        }
      } else {
        op->whole_chunks = op->bytes / kP2PChunkBytes;
        op->payload.emplace(link(), peer, data, op->whole_chunks * kP2PChunkBytes, data_slot);
        for (size_t k = 0; k < op->whole_chunks; ++k) {
          op->payload->post_recv(k * kP2PChunkBytes, kP2PChunkBytes);
        }
        if (op->bytes % kP2PChunkBytes != 0) {
          op->bounce.resize(kP2PChunkBytes);
          op->tail.emplace(link(), peer, op->bounce.data(), kP2PChunkBytes, data_slot);
          op->tail->post_recv(0, kP2PChunkBytes);
        }
      }
    } catch (const PeerError& error) {
      op->frame_in.reset();
      op->frame_out.reset();
      op->payload.reset();
      op->tail.reset();
      handle_fault(name.c_str(), error, op->deadline);
    }
    std::lock_guard<std::mutex> lock(p2p_->mutex);
    auto& pending = p2p_->pending;
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const std::weak_ptr<GlooP2POp>& w) { return w.expired(); }),
                  pending.end());
    pending.push_back(op);
    return P2PHandle(op);
  }

  // The communicator goes away: transfers still pending fail, and gloo must
  // not touch their buffers afterwards.
  void close_p2p() {
    if (!p2p_) return;
    std::unique_lock<std::mutex> lock(p2p_->mutex);
    p2p_->closed = true;
    std::vector<std::shared_ptr<GlooP2POp>> live;
    for (auto& weak : p2p_->pending) {
      if (auto op = weak.lock()) live.push_back(op);
    }
    for (auto& op : live) {
      for (auto* channel : {&op->frame_in, &op->frame_out, &op->payload, &op->tail}) {
        if (*channel) (*channel)->abort();
      }
    }
    p2p_->changed.notify_all();
    p2p_->changed.wait(lock, [&] { return p2p_->helpers == 0; });
    for (auto& op : live) {
      op->frame_in.reset();
      op->frame_out.reset();
      op->payload.reset();
      op->tail.reset();
      if (!op->done) {
        op->done = true;
        op->error = std::make_exception_ptr(RuntimeFault(
            op->what() + ": the communicator was destroyed while the transfer was pending"));
      }
    }
    p2p_->pending.clear();
  }

  // ---- Algorithms ------------------------------------------------------------

  // Every rank contributes `bytes` at `mine`; `all` receives size() * bytes in
  // rank order. One message to and from every peer: latency of one hop.
  void direct_allgather(const void* mine, void* all, size_t bytes, uint64_t slot,
                        const Deadline& deadline) {
    uint8_t* result = static_cast<uint8_t*>(all);
    if (mine != result + rank_ * bytes) std::memcpy(result + rank_ * bytes, mine, bytes);
    std::vector<Channel> channels;
    channels.reserve(2 * size_);
    for (int step = 1; step < size_; ++step) {
      const int from = static_cast<int>(mod(rank_ - step, size_));
      channels.emplace_back(link(), from, result + from * bytes, bytes, slot);
      channels.back().post_recv(0, bytes);
    }
    for (int step = 1; step < size_; ++step) {
      const int to = static_cast<int>(mod(rank_ + step, size_));
      channels.emplace_back(link(), to, result + rank_ * bytes, bytes, slot);
      channels.back().post_send(0, bytes);
    }
    for (auto& channel : channels) channel.drain(deadline);
  }

  // Allgather(v) of `blocks` in place in `result`: small ones directly (every
  // block straight from its owner: one hop, and a wait always names the rank
  // whose data is missing, which the engine's stall check reports), large
  // ones by the ring.
  void gather_blocks(uint8_t* result, const Blocks& blocks, size_t element_bytes, uint64_t slot,
                     const Deadline& deadline) {
    if (blocks.total * element_bytes > kDirectReduceBytes) {
      ring_allgather(result, blocks, element_bytes, slot, deadline);
      return;
    }
    std::vector<Channel> channels;
    channels.reserve(2 * size_);
    for (int step = 1; step < size_; ++step) {
      const int from = static_cast<int>(mod(rank_ - step, size_));
      const size_t bytes = blocks.length[from] * element_bytes;
      channels.emplace_back(link(), from, result + blocks.offset[from] * element_bytes, bytes,
                            slot);
      channels.back().post_recv(0, bytes);
    }
    const size_t mine = blocks.length[rank_] * element_bytes;
    for (int step = 1; step < size_; ++step) {
      const int to = static_cast<int>(mod(rank_ + step, size_));
      channels.emplace_back(link(), to, result + blocks.offset[rank_] * element_bytes, mine, slot);
      channels.back().post_send(0, mine);
    }
    for (auto& channel : channels) channel.drain(deadline);
  }

  // Small allreduce: every rank gathers all inputs and reduces them in rank
  // order with reduce_inputs, exactly as the shm and threads backends do.
  void direct_allreduce(const void* in, void* out, size_t count, DType dtype,
                        const AllreduceOptions& options, uint64_t slot, const Deadline& deadline) {
    const size_t bytes = count * dtype_size(dtype);
    uint8_t* gathered = work_.get(size_ * bytes);
    if (size_ > 1) {
      direct_allgather(in, gathered, bytes, slot, deadline);
    } else {
      std::memcpy(gathered, in, bytes);
    }
    std::vector<const void*> inputs(size_);
    for (int k = 0; k < size_; ++k) inputs[k] = gathered + k * bytes;
    reduce_inputs(out, inputs.data(), size_, count, dtype, options, size_);
  }

  // alltoallv counts agree across ranks: send_counts[k] on r == recv_counts[r] on k.
  void check_alltoallv(const std::vector<size_t>& send_counts,
                       const std::vector<size_t>& recv_counts, uint64_t sequence,
                       const Deadline& deadline) {
    std::vector<uint64_t> mine(2 * size_);
    for (int k = 0; k < size_; ++k) {
      mine[k] = send_counts[k];
      mine[size_ + k] = recv_counts[k];
    }
    std::vector<uint64_t> all(2 * size_ * size_);
    direct_allgather(mine.data(), all.data(), mine.size() * sizeof(uint64_t), slot(sequence, 2),
                     deadline);
    std::vector<std::vector<size_t>> sends(size_), recvs(size_);
    for (int r = 0; r < size_; ++r) {
      const uint64_t* row = all.data() + r * 2 * size_;
      sends[r].assign(row, row + size_);
      recvs[r].assign(row + size_, row + 2 * size_);
    }
    check_alltoallv_counts(sends, recvs);
  }

  // Reduce-scatter of a staged reduction (plan_reduction: f16/bf16 sums,
  // scaled integers), in the caller's dtype on the wire: rank r sends block
  // k of `in` to rank k, receives block r of every other rank into scratch,
  // and reduces the n inputs in rank order with reduce_inputs (reduce.h's
  // kernel: f32 or double accumulation, prescale, average, postscale, one
  // rounding) into `out` (blocks.length[rank_] elements; it may alias any
  // part of `in`: the in-place reducescatter's is block 0, which may still be
  // on its way to rank 0). A ring would carry partial sums, which must stay
  // in the wide type to keep that one rounding: twice the bytes for f16.
  // The block is reduced in segments, each once every peer's part of it has
  // arrived, so reduction overlaps the rest of the transfer.
  void direct_reduce_scatter(const uint8_t* in, const Blocks& blocks, DType dtype,
                             const AllreduceOptions& options, uint8_t* out, uint64_t slot,
                             const Deadline& deadline) {
    const size_t element_bytes = dtype_size(dtype);
    const size_t mine = blocks.length[rank_];
    const size_t mine_bytes = mine * element_bytes;
    // Slot k: rank k's block rank_ (this rank's own is read from `in`).
    uint8_t* gathered = work_.get(static_cast<size_t>(size_) * mine_bytes);
    const size_t seg = segment_bytes(blocks, element_bytes);
    std::vector<Channel> from;
    from.reserve(size_);
    for (int step = 1; step < size_; ++step) {
      const int peer = static_cast<int>(mod(rank_ - step, size_));
      from.emplace_back(link(), peer, gathered + peer * mine_bytes, mine_bytes, slot);
      for (size_t at = 0; at < mine_bytes; at += seg) {
        from.back().post_recv(at, std::min(seg, mine_bytes - at));
      }
    }
    std::vector<Channel> to;
    to.reserve(size_);
    for (int step = 1; step < size_; ++step) {
      const int peer = static_cast<int>(mod(rank_ + step, size_));
      const size_t bytes = blocks.length[peer] * element_bytes;
      // gloo's buffer is not written through a send; the cast only fits its API.
      to.emplace_back(link(), peer, const_cast<uint8_t*>(in + blocks.offset[peer] * element_bytes),
                      bytes, slot);
      for (size_t at = 0; at < bytes; at += seg) to.back().post_send(at, std::min(seg, bytes - at));
    }
    // Reduced in place only when `out` is this rank's own block or outside
    // `in`: another block of `in` is being sent while we reduce.
    const uint8_t* own = in + blocks.offset[rank_] * element_bytes;
    const bool overlaps_sends =
        out != own && out < in + blocks.total * element_bytes && out + mine_bytes > in;
    uint8_t* target = overlaps_sends ? reduced_.get(mine_bytes) : out;
    std::vector<const void*> inputs(size_);
    for (size_t at = 0; at < mine_bytes; at += seg) {
      for (Channel& channel : from) channel.wait_recv(deadline);
      const size_t bytes = std::min(seg, mine_bytes - at);
      for (int k = 0; k < size_; ++k) {
        inputs[k] = k == rank_ ? own + at : gathered + k * mine_bytes + at;
      }
      // Our own block's segment is an input of its own reduction only, so
      // `target` being it is fine (reduce_inputs allows out == an input).
      reduce_inputs(target + at, inputs.data(), size_, bytes / element_bytes, dtype, options,
                    size_);
    }
    for (Channel& channel : to) channel.drain(deadline);
    if (target != out) std::memcpy(out, target, mine_bytes);
  }

  // Ring reduce-scatter in place on `work` (blocks.total elements of `wire`):
  // at step s rank r sends block r-s-1 to r+1 and reduces block r-s-2 received
  // from r-1, so after n-1 steps block r holds the reduction of every rank's
  // block r. Each received segment is reduced and forwarded at once; a
  // segment of block r, once reduced for the last time, goes to `finished`
  // (when given) at once.
  void ring_reduce_scatter(uint8_t* work, const Blocks& blocks, DType wire, ReduceOp op,
                           uint64_t slot, const Deadline& deadline,
                           const SegmentSink& finished = nullptr) {
    if (size_ == 1) return;
    const size_t element_bytes = dtype_size(wire);
    const int right = static_cast<int>(mod(rank_ + 1, size_));
    const int left = static_cast<int>(mod(rank_ - 1, size_));
    std::vector<Segment> first_sends;
    append_segments(first_sends, blocks, mod(rank_ - 1, size_), element_bytes, 0);
    std::vector<Segment> recvs;
    for (int step = 0; step < size_ - 1; ++step) {
      append_segments(recvs, blocks, mod(rank_ - step - 2, size_), element_bytes, step);
    }
    const size_t seg = segment_bytes(blocks, element_bytes);
    uint8_t* inbox = inbox_.get(kRecvWindow * seg);

    Channel to_right(link(), right, work, blocks.total * element_bytes, slot);
    Channel from_left(link(), left, inbox, kRecvWindow * seg, slot);
    for (const Segment& s : first_sends) to_right.post_send(s.offset_bytes, s.bytes);
    for (size_t i = 0; i < std::min(kRecvWindow, recvs.size()); ++i) {
      from_left.post_recv(i * seg, recvs[i].bytes);
    }
    for (size_t i = 0; i < recvs.size(); ++i) {
      const Segment& s = recvs[i];
      from_left.wait_recv(deadline);
      reduce_pair(work + s.offset_bytes, inbox + (i % kRecvWindow) * seg, s.bytes / element_bytes,
                  wire, op);
      // The block reduced at step s is the one sent at step s+1.
      if (s.step < size_ - 2) {
        to_right.post_send(s.offset_bytes, s.bytes);
      } else if (finished) {
        finished(s);
      }
      if (i + kRecvWindow < recvs.size()) {
        from_left.post_recv((i % kRecvWindow) * seg, recvs[i + kRecvWindow].bytes);
      }
    }
    to_right.drain(deadline);
  }

  // Ring allreduce in place on `work` (an unstaged plan: the wire dtype is the
  // caller's): ring_reduce_scatter's steps and then ring_allgather's, joined
  // segment by segment. The moment a segment of this rank's own block has its
  // last reduction it is finished (stage_out) and sent as the allgather's
  // first step, and every allgather receive is posted up front, so the link
  // does not idle between the phases. Run one after the other, each phase
  // began with a segment's transfer and ended with a drain, which cost a
  // 2-rank allreduce across a 1 Gbit/s link about a fifth of its time (0.79x
  // raw gloo at 16 MiB). Posting the allgather's receives early is safe: a
  // segment of block b arrives in the allgather only after b's owner reduced
  // it, which needed what this rank sent from the same bytes in the
  // reduce-scatter (after its own reduction into them), so nothing lands on
  // bytes this rank still has to reduce into or send.
  // Used for 2 ranks, whose phases are one step each. With more, the
  // allgather's forwards below wait for the end of the reduce-scatter, and a
  // flat 2x2 ring at 64 MiB across 1 Gbit/s reached 82-83% of the link in
  // about half the runs against 95-97% with the phases apart (correct for any
  // n: the collective matrix passed at 2 to 8 ranks with it used for all).
  void ring_allreduce(uint8_t* work, const Blocks& blocks, const ReductionPlan& plan,
                      const AllreduceOptions& options, uint64_t reduce_slot, uint64_t gather_slot,
                      const Deadline& deadline) {
    const size_t element_bytes = dtype_size(plan.wire);
    ring_allgather(
        work, blocks, element_bytes, gather_slot, deadline, [&](const SegmentSink& send) {
          ring_reduce_scatter(work, blocks, plan.wire, plan.wire_op, reduce_slot, deadline,
                              [&](const Segment& s) {
                                stage_out(plan, options, work + s.offset_bytes,
                                          work + s.offset_bytes, s.bytes / element_bytes, size_);
                                send(s);
                              });
        });
  }

  // Ring allgather in place on `buffer`: block r is present on rank r; at step
  // s rank r forwards block r-s to r+1 and receives block r-s-1 from r-1.
  // Receives go straight to their final place, so all are posted up front and
  // each arriving segment is forwarded at once. With `produce`, block r is not
  // there yet: once the receives are posted, produce(send) makes it and sends
  // each of its segments through `send` as it is ready (ring_allreduce).
  void ring_allgather(uint8_t* buffer, const Blocks& blocks, size_t element_bytes, uint64_t slot,
                      const Deadline& deadline,
                      const std::function<void(const SegmentSink& send)>& produce = nullptr) {
    if (size_ == 1) return;
    const int right = static_cast<int>(mod(rank_ + 1, size_));
    const int left = static_cast<int>(mod(rank_ - 1, size_));
    std::vector<Segment> first_sends;
    append_segments(first_sends, blocks, rank_, element_bytes, 0);
    std::vector<Segment> recvs;
    for (int step = 0; step < size_ - 1; ++step) {
      append_segments(recvs, blocks, mod(rank_ - step - 1, size_), element_bytes, step);
    }
    const size_t total_bytes = blocks.total * element_bytes;
    Channel to_right(link(), right, buffer, total_bytes, slot);
    Channel from_left(link(), left, buffer, total_bytes, slot);
    for (const Segment& s : recvs) from_left.post_recv(s.offset_bytes, s.bytes);
    if (produce) {
      produce([&](const Segment& s) { to_right.post_send(s.offset_bytes, s.bytes); });
    } else {
      for (const Segment& s : first_sends) to_right.post_send(s.offset_bytes, s.bytes);
    }
    for (const Segment& s : recvs) {
      from_left.wait_recv(deadline);
      if (s.step < size_ - 2) to_right.post_send(s.offset_bytes, s.bytes);
    }
    to_right.drain(deadline);
  }

  // Binomial tree from `root`: ceil(log2 n) message latencies.
  void tree_broadcast(uint8_t* buffer, size_t bytes, int root, uint64_t slot,
                      const Deadline& deadline) {
    const size_t vrank = mod(rank_ - root, size_);
    size_t mask = 1;
    while (mask < static_cast<size_t>(size_)) {
      if ((vrank & mask) != 0) {
        Channel parent(link(), static_cast<int>(mod(vrank - mask + root, size_)), buffer, bytes,
                       slot);
        parent.post_recv(0, bytes);
        parent.drain(deadline);
        break;
      }
      mask <<= 1;
    }
    std::vector<Channel> children;
    for (mask >>= 1; mask > 0; mask >>= 1) {
      if (vrank + mask < static_cast<size_t>(size_)) {
        children.emplace_back(link(), static_cast<int>(mod(vrank + mask + root, size_)), buffer,
                              bytes, slot);
        children.back().post_send(0, bytes);
      }
    }
    for (auto& child : children) child.drain(deadline);
  }

  // Pipelined chain root -> root+1 -> ...: each segment is forwarded as soon as
  // it arrives, so large buffers take about one buffer time plus n hops.
  void chain_broadcast(uint8_t* buffer, size_t bytes, int root, uint64_t slot,
                       const Deadline& deadline) {
    const size_t vrank = mod(rank_ - root, size_);
    const bool has_next = vrank + 1 < static_cast<size_t>(size_);
    std::optional<Channel> from_prev;
    std::optional<Channel> to_next;
    if (vrank > 0)
      from_prev.emplace(link(), static_cast<int>(mod(rank_ - 1, size_)), buffer, bytes, slot);
    if (has_next)
      to_next.emplace(link(), static_cast<int>(mod(rank_ + 1, size_)), buffer, bytes, slot);
    const size_t seg = kSegmentBytes;
    for (size_t at = 0; at < bytes; at += seg) {
      const size_t length = std::min(seg, bytes - at);
      if (from_prev) {
        from_prev->post_recv(at, length);
      } else {
        to_next->post_send(at, length);
      }
    }
    if (from_prev) {
      for (size_t at = 0; at < bytes; at += seg) {
        from_prev->wait_recv(deadline);
        if (to_next) to_next->post_send(at, std::min(seg, bytes - at));
      }
    }
    if (to_next) to_next->drain(deadline);
  }

  // Direct exchange: send_counts[k] elements (consecutive in `in`) go to rank
  // k, recv_counts[k] arrive from rank k (consecutive in `out`). Handles
  // in == out (alltoall in place) through a copy of the input.
  void exchange(const void* in, const std::vector<size_t>& send_counts, void* out,
                const std::vector<size_t>& recv_counts, size_t element_bytes, uint64_t slot,
                const Deadline& deadline) {
    const Blocks sends = blocks_from_counts(send_counts);
    const Blocks recvs = blocks_from_counts(recv_counts);
    const uint8_t* source = static_cast<const uint8_t*>(in);
    uint8_t* result = static_cast<uint8_t*>(out);
    if (source == result && sends.total > 0) {
      uint8_t* copy = exchange_copy_.get(sends.total * element_bytes);
      std::memcpy(copy, source, sends.total * element_bytes);
      source = copy;
    }
    if (recv_counts[rank_] > 0) {
      std::memcpy(result + recvs.offset[rank_] * element_bytes,
                  source + sends.offset[rank_] * element_bytes, recv_counts[rank_] * element_bytes);
    }
    std::vector<Channel> channels;
    channels.reserve(2 * size_);
    for (int step = 1; step < size_; ++step) {
      const int from = static_cast<int>(mod(rank_ - step, size_));
      channels.emplace_back(link(), from, result + recvs.offset[from] * element_bytes,
                            recv_counts[from] * element_bytes, slot);
      channels.back().post_recv(0, recv_counts[from] * element_bytes);
    }
    for (int step = 1; step < size_; ++step) {
      const int to = static_cast<int>(mod(rank_ + step, size_));
      // gloo's buffer is not written through a send; the cast only fits its API.
      channels.emplace_back(link(), to,
                            const_cast<uint8_t*>(source + sends.offset[to] * element_bytes),
                            send_counts[to] * element_bytes, slot);
      channels.back().post_send(0, send_counts[to] * element_bytes);
    }
    for (auto& channel : channels) channel.drain(deadline);
  }

  const int rank_;
  const int size_;
  std::shared_ptr<Store> store_;
  const std::string prefix_;  // "<options.prefix>/gloo/"
  const milliseconds default_timeout_;
  const bool check_args_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::unique_ptr<PeerMonitor> monitor_;
  std::shared_ptr<GlooP2PState> p2p_;  // created by the first point-to-point call
  uint64_t sequence_ = 0;
  Scratch work_;           // staged reductions, reducescatter input copy
  Scratch inbox_;          // reduce-scatter receive window
  Scratch exchange_copy_;  // in-place alltoall
  Scratch reduced_;        // direct reduce-scatter's result when `out` overlaps `in`
  std::string iface_;      // KOLO_GLOO_IFACE ("" = choose)
  std::string host_name_;  // KOLO_HOSTNAME ("" = gethostname())
  std::string fault_;      // set once a fault broke the communicator
  std::vector<int> fault_ranks_;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const CommunicatorOptions& options) {
  return std::make_unique<GlooCommunicator>(options);
}

}  // namespace kolo::detail

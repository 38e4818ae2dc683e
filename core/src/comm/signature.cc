// Cross-rank and local argument checks of collective calls (signature.h).
#include "comm/signature.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "kolo/core/errors.h"

namespace kolo::detail {

namespace {

std::string format_double(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

std::string format_hash(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%016llx", static_cast<unsigned long long>(value));
  return text;
}

// Safe for values read from another process: never throws on a bad enum.
std::string kind_text(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce:
    case CollectiveKind::kAllgather:
    case CollectiveKind::kAllgatherv:
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReducescatter:
    case CollectiveKind::kAlltoall:
    case CollectiveKind::kAlltoallv:
    case CollectiveKind::kBarrier:
      return collective_name(kind);
  }
  return "collective #" + std::to_string(static_cast<int>(kind));
}

std::string dtype_text(DType dtype) {
  if (static_cast<int>(dtype) >= kNumDTypes) {
    return "invalid dtype " + std::to_string(static_cast<int>(dtype));
  }
  return dtype_name(dtype);
}

std::string op_text(ReduceOp op) {
  if (static_cast<int>(op) >= kNumReduceOps) {
    return "invalid op " + std::to_string(static_cast<int>(op));
  }
  return reduce_op_name(op);
}

bool uses_reduce_op(CollectiveKind kind) {
  return kind == CollectiveKind::kAllreduce || kind == CollectiveKind::kReducescatter;
}

// One field of CallSignature: how to read it, print it and name it.
struct Field {
  const char* name;  // "count", "dtype", ...
  bool (*applies)(CollectiveKind kind);
  std::string (*text)(const CallSignature& s);
  bool (*equal)(const CallSignature& a, const CallSignature& b);
};

const Field kFields[] = {
    {"count",
     [](CollectiveKind kind) {
       return kind != CollectiveKind::kBarrier && kind != CollectiveKind::kAllgatherv &&
              kind != CollectiveKind::kAlltoallv;
     },
     [](const CallSignature& s) { return std::to_string(s.count); },
     [](const CallSignature& a, const CallSignature& b) { return a.count == b.count; }},
    {"counts vector", [](CollectiveKind kind) { return kind == CollectiveKind::kAllgatherv; },
     [](const CallSignature& s) { return "counts hashing to " + format_hash(s.count); },
     [](const CallSignature& a, const CallSignature& b) { return a.count == b.count; }},
    {"dtype", [](CollectiveKind kind) { return kind != CollectiveKind::kBarrier; },
     [](const CallSignature& s) { return dtype_text(s.dtype); },
     [](const CallSignature& a, const CallSignature& b) { return a.dtype == b.dtype; }},
    {"op", uses_reduce_op, [](const CallSignature& s) { return op_text(s.op); },
     [](const CallSignature& a, const CallSignature& b) { return a.op == b.op; }},
    {"root", [](CollectiveKind kind) { return kind == CollectiveKind::kBroadcast; },
     [](const CallSignature& s) { return std::to_string(s.root); },
     [](const CallSignature& a, const CallSignature& b) { return a.root == b.root; }},
    {"prescale", uses_reduce_op, [](const CallSignature& s) { return format_double(s.prescale); },
     [](const CallSignature& a, const CallSignature& b) { return a.prescale == b.prescale; }},
    {"postscale", uses_reduce_op, [](const CallSignature& s) { return format_double(s.postscale); },
     [](const CallSignature& a, const CallSignature& b) { return a.postscale == b.postscale; }},
};

std::string prefix(CollectiveKind kind) { return "kolo " + kind_text(kind) + ": "; }

}  // namespace

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce:
      return "allreduce";
    case CollectiveKind::kAllgather:
      return "allgather";
    case CollectiveKind::kAllgatherv:
      return "allgatherv";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kReducescatter:
      return "reducescatter";
    case CollectiveKind::kAlltoall:
      return "alltoall";
    case CollectiveKind::kAlltoallv:
      return "alltoallv";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  throw ContractError("kolo: invalid CollectiveKind value " +
                      std::to_string(static_cast<int>(kind)));
}

uint64_t hash_counts(const std::vector<size_t>& counts) {
  // FNV-1a over the length and each count as 8 little-endian bytes: the same on
  // every rank and every platform kolo runs on.
  uint64_t hash = 0xcbf29ce484222325ull;
  auto mix = [&hash](uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (value >> (8 * byte)) & 0xff;
      hash *= 0x100000001b3ull;
    }
  };
  mix(counts.size());
  for (size_t count : counts) mix(count);
  return hash;
}

void check_signatures(const std::vector<CallSignature>& signatures) {
  if (signatures.size() < 2) return;
  const CallSignature& first = signatures[0];
  const int size = static_cast<int>(signatures.size());

  // A different call number or collective means the ranks are out of step;
  // comparing arguments would only confuse.
  std::string out_of_step;
  for (int r = 1; r < size; ++r) {
    const CallSignature& other = signatures[r];
    if (other.sequence != first.sequence || other.kind != first.kind) {
      out_of_step += ", rank " + std::to_string(r) + " called " + kind_text(other.kind) +
                     " as its call #" + std::to_string(other.sequence);
    }
  }
  if (!out_of_step.empty()) {
    throw ContractError(prefix(first.kind) + "ranks are calling different collectives: rank 0 " +
                        "called " + kind_text(first.kind) + " as its call #" +
                        std::to_string(first.sequence) + out_of_step +
                        ". Every rank must call the same collectives in the same order.");
  }

  for (const Field& field : kFields) {
    if (!field.applies(first.kind)) continue;
    std::string differing;
    for (int r = 1; r < size; ++r) {
      if (!field.equal(first, signatures[r])) {
        differing += ", rank " + std::to_string(r) + " passed " + field.text(signatures[r]);
      }
    }
    if (differing.empty()) continue;
    throw ContractError(prefix(first.kind) + field.name + " differs across ranks: rank 0 passed " +
                        field.text(first) + differing + ". Every rank must call " +
                        kind_text(first.kind) + " with the same " + field.name + ".");
  }
}

CallSignature plain_signature(CollectiveKind kind, uint64_t count, DType dtype) {
  CallSignature sig;
  sig.kind = kind;
  sig.count = count;
  sig.dtype = dtype;
  return sig;
}

CallSignature reduce_signature(CollectiveKind kind, uint64_t count, DType dtype,
                               const AllreduceOptions& options) {
  CallSignature sig = plain_signature(kind, count, dtype);
  sig.op = options.op;
  sig.prescale = options.prescale;
  sig.postscale = options.postscale;
  return sig;
}

void check_alltoallv_args(int size, const void* in, const std::vector<size_t>& send_counts,
                          const void* out, const std::vector<size_t>& recv_counts) {
  check_counts_arg(CollectiveKind::kAlltoallv, "send_counts", send_counts, size);
  check_counts_arg(CollectiveKind::kAlltoallv, "recv_counts", recv_counts, size);
  size_t send_total = 0;
  size_t recv_total = 0;
  for (int k = 0; k < size; ++k) {
    send_total += send_counts[k];
    recv_total += recv_counts[k];
  }
  if (send_total > 0 && in == nullptr) {
    throw ContractError("kolo alltoallv: in is null but send_counts add up to " +
                        std::to_string(send_total) + " elements");
  }
  if (recv_total > 0 && out == nullptr) {
    throw ContractError("kolo alltoallv: out is null but recv_counts add up to " +
                        std::to_string(recv_total) + " elements");
  }
  if (send_total > 0 && recv_total > 0 && in == out) {
    throw ContractError(
        "kolo alltoallv: in == out, but alltoallv has no in-place variant; pass separate "
        "buffers");
  }
}

void check_local_args(CollectiveKind kind, int size, const void* in, const void* out, size_t count,
                      const AllreduceOptions* reduce_options, int root) {
  // The message prefix is built only for an error: this runs on every call.
  auto where = [kind] { return prefix(kind); };
  if (size < 1) {
    throw ContractError(where() + "communicator size must be >= 1, got " + std::to_string(size));
  }
  if (kind == CollectiveKind::kBarrier) return;
  // Largest count whose buffers (size() blocks of 8-byte elements) fit in size_t.
  const size_t max_count = std::numeric_limits<size_t>::max() / 8 / static_cast<size_t>(size);
  if (count > max_count) {
    throw ContractError(where() + "count " + std::to_string(count) +
                        " is too large (the buffers would exceed the address space); counts "
                        "are in elements, not bytes");
  }
  if (count > 0 && in == nullptr) {
    throw ContractError(where() + (kind == CollectiveKind::kBroadcast ? "buffer" : "in") +
                        " is null but count is " + std::to_string(count) +
                        "; pass a buffer of count elements (or count 0)");
  }
  if (count > 0 && out == nullptr) {
    throw ContractError(where() + "out is null but count is " + std::to_string(count) +
                        "; pass a buffer for the result (or out == in for the in-place form)");
  }
  if (kind == CollectiveKind::kBroadcast && (root < 0 || root >= size)) {
    throw ContractError(where() + "root " + std::to_string(root) + " is not a rank of this " +
                        std::to_string(size) + "-rank communicator; use 0 <= root < " +
                        std::to_string(size));
  }
  if (reduce_options != nullptr) {
    if (static_cast<int>(reduce_options->op) >= kNumReduceOps) {
      throw ContractError(where() + "op " + op_text(reduce_options->op) +
                          " is not a ReduceOp; use sum, average, min, max or product");
    }
    if (!std::isfinite(reduce_options->prescale)) {
      throw ContractError(where() + "prescale " + format_double(reduce_options->prescale) +
                          " is not finite; pass a finite factor (1.0 for none)");
    }
    if (!std::isfinite(reduce_options->postscale)) {
      throw ContractError(where() + "postscale " + format_double(reduce_options->postscale) +
                          " is not finite; pass a finite factor (1.0 for none)");
    }
  }
}

void check_counts_arg(CollectiveKind kind, const char* argument, const std::vector<size_t>& counts,
                      int size) {
  if (static_cast<int64_t>(counts.size()) != size) {
    throw ContractError(prefix(kind) + argument + " has " + std::to_string(counts.size()) +
                        " entries but the communicator has " + std::to_string(size) +
                        " ranks; pass one count per rank");
  }
}

void check_alltoallv_counts(const std::vector<std::vector<size_t>>& send_counts,
                            const std::vector<std::vector<size_t>>& recv_counts) {
  const size_t size = send_counts.size();
  const std::string where = prefix(CollectiveKind::kAlltoallv);
  for (size_t r = 0; r < size; ++r) {
    for (size_t k = 0; k < size; ++k) {
      const size_t sent = send_counts[r].at(k);
      const size_t received = recv_counts.at(k).at(r);
      if (sent != received) {
        throw ContractError(where + "rank " + std::to_string(r) + " sends " + std::to_string(sent) +
                            " elements to rank " + std::to_string(k) + " (send_counts[" +
                            std::to_string(k) + "]) but rank " + std::to_string(k) + " expects " +
                            std::to_string(received) + " from it (recv_counts[" +
                            std::to_string(r) +
                            "]). send_counts[k] on rank r must equal recv_counts[r] on rank k.");
      }
    }
  }
}

}  // namespace kolo::detail

// Point-to-point correctness checks (p2p_check.h).
#include "p2p_check.h"

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "kolo/core/dtype.h"

namespace kolo::testing {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t base_of(int from, int to, int tag, int message) {
  return mix(mix(mix(static_cast<uint64_t>(from) << 32 | static_cast<uint32_t>(to)) ^
                 static_cast<uint64_t>(tag)) ^
             static_cast<uint64_t>(message));
}

// Byte i of a payload: cheap, and different for every (message, position).
uint8_t byte_at(uint64_t base, size_t i) {
  const uint64_t x = base + (i >> 3) * 0x9e3779b97f4a7c15ull;
  return static_cast<uint8_t>((x ^ (x >> 29)) >> (8 * (i & 7)));
}

std::string name_of(DType dtype) { return dtype_name(dtype); }

// Collects failures of one pattern.
class Report {
 public:
  explicit Report(std::vector<std::string>& lines) : lines_(lines) {}
  void check(const std::string& what, int rank, int from, const void* data, size_t count,
             DType dtype, int tag, int message) {
    const std::string problem = check_payload(data, count, dtype, from, rank, tag, message);
    if (!problem.empty()) {
      lines_.push_back(what + ": rank " + std::to_string(rank) + " from " + std::to_string(from) +
                       " " + problem);
    }
  }

 private:
  std::vector<std::string>& lines_;
};

struct Buffer {
  std::vector<uint8_t> bytes;
  Buffer(size_t count, DType dtype) : bytes(count * dtype_size(dtype) + 1) {}
  void* data() { return bytes.data(); }
};

P2POptions tagged(int tag) {
  P2POptions options;
  options.tag = tag;
  return options;
}

}  // namespace

void fill_payload(void* data, size_t count, DType dtype, int from, int to, int tag, int message) {
  const uint64_t base = base_of(from, to, tag, message);
  uint8_t* bytes = static_cast<uint8_t*>(data);
  const size_t n = count * dtype_size(dtype);
  for (size_t i = 0; i < n; ++i) bytes[i] = byte_at(base, i);
}

std::string check_payload(const void* data, size_t count, DType dtype, int from, int to, int tag,
                          int message) {
  const uint64_t base = base_of(from, to, tag, message);
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  const size_t n = count * dtype_size(dtype);
  for (size_t i = 0; i < n; ++i) {
    if (bytes[i] != byte_at(base, i)) {
      char text[160];
      std::snprintf(text, sizeof(text), "%s count=%zu: byte %zu of %zu: got 0x%02x expected 0x%02x",
                    name_of(dtype).c_str(), count, i, n, bytes[i], byte_at(base, i));
      return text;
    }
  }
  return "";
}

std::vector<std::string> check_point_to_point(Communicator& comm, const P2PCheck& check) {
  std::vector<std::string> lines;
  Report report(lines);
  const int n = comm.size();
  const int rank = comm.rank();
  if (n < 2) return lines;
  const int next = (rank + 1) % n;
  const int prev = (rank + n - 1) % n;

  // 1. Ring: send to next, receive from prev; receives posted first, then
  //    sends first, then blocking calls ordered so that nobody deadlocks.
  int message = 0;
  for (DType dtype : check.dtypes) {
    for (size_t count : check.counts) {
      for (int order = 0; order < 3; ++order, ++message) {
        const int tag = order;
        Buffer out(count, dtype), in(count, dtype);
        fill_payload(out.data(), count, dtype, rank, next, tag, message);
        if (order == 0) {
          P2PHandle r = comm.irecv(in.data(), count, dtype, prev, tagged(tag));
          P2PHandle s = comm.isend(out.data(), count, dtype, next, tagged(tag));
          s.wait();  // the send first: it must not need our receive to be waited for
          r.wait();
        } else if (order == 1) {
          P2PHandle s = comm.isend(out.data(), count, dtype, next, tagged(tag));
          P2PHandle r = comm.irecv(in.data(), count, dtype, prev, tagged(tag));
          r.wait();
          s.wait();
        } else if (rank % 2 == 0) {
          // Blocking: even ranks send first. With an odd ring, ranks n-1 and
          // 0 both send first; rank 0's receive still comes once its own
          // send is taken by rank 1, which receives first.
          comm.send(out.data(), count, dtype, next, tagged(tag));
          comm.recv(in.data(), count, dtype, prev, tagged(tag));
        } else {
          comm.recv(in.data(), count, dtype, prev, tagged(tag));
          comm.send(out.data(), count, dtype, next, tagged(tag));
        }
        report.check("ring order " + std::to_string(order), rank, prev, in.data(), count, dtype,
                     tag, message);
      }
    }
  }

  // 2. Many messages with one tag arrive in order.
  {
    constexpr int kMessages = 50;
    const int tag = 7;
    std::vector<Buffer> outs, ins;
    std::vector<P2PHandle> handles;
    for (int m = 0; m < kMessages; ++m) {
      outs.emplace_back(3 + m, DType::kI32);
      ins.emplace_back(3 + m, DType::kI32);
    }
    for (int m = 0; m < kMessages; ++m) {
      fill_payload(outs[m].data(), 3 + m, DType::kI32, rank, next, tag, 1000 + m);
      handles.push_back(comm.isend(outs[m].data(), 3 + m, DType::kI32, next, tagged(tag)));
    }
    for (int m = 0; m < kMessages; ++m) {
      comm.recv(ins[m].data(), 3 + m, DType::kI32, prev, tagged(tag));
      report.check("in order", rank, prev, ins[m].data(), 3 + m, DType::kI32, tag, 1000 + m);
    }
    for (auto& h : handles) h.wait();
  }

  // 3. Two large messages, received in the opposite order of their posting:
  //    the first must not hold up the second (more than the shared buffers).
  {
    const size_t count = (size_t{3} << 20) + 5;  // 12 MB of f32
    Buffer a_out(count, DType::kF32), b_out(count, DType::kF32);
    Buffer a_in(count, DType::kF32), b_in(count, DType::kF32);
    fill_payload(a_out.data(), count, DType::kF32, rank, next, 11, 2000);
    fill_payload(b_out.data(), count, DType::kF32, rank, next, 12, 2001);
    P2PHandle a = comm.isend(a_out.data(), count, DType::kF32, next, tagged(11));
    P2PHandle b = comm.isend(b_out.data(), count, DType::kF32, next, tagged(12));
    comm.recv(b_in.data(), count, DType::kF32, prev, tagged(12));
    comm.recv(a_in.data(), count, DType::kF32, prev, tagged(11));
    a.wait();
    b.wait();
    report.check("reversed tags", rank, prev, a_in.data(), count, DType::kF32, 11, 2000);
    report.check("reversed tags", rank, prev, b_in.data(), count, DType::kF32, 12, 2001);
  }

  // 4. Every rank with every other rank at once.
  {
    const size_t count = 70000;
    std::vector<Buffer> outs, ins;
    std::vector<P2PHandle> handles;
    for (int peer = 0; peer < n; ++peer) {
      outs.emplace_back(count, DType::kF64);
      ins.emplace_back(count, DType::kF64);
    }
    for (int peer = 0; peer < n; ++peer) {
      if (peer == rank) continue;
      fill_payload(outs[peer].data(), count, DType::kF64, rank, peer, 3, 3000);
      handles.push_back(comm.isend(outs[peer].data(), count, DType::kF64, peer, tagged(3)));
      handles.push_back(comm.irecv(ins[peer].data(), count, DType::kF64, peer, tagged(3)));
    }
    for (auto& h : handles) h.wait();
    for (int peer = 0; peer < n; ++peer) {
      if (peer != rank) {
        report.check("all pairs", rank, peer, ins[peer].data(), count, DType::kF64, 3, 3000);
      }
    }
  }

  // 5. test() until done moves a transfer along on its own.
  {
    const size_t count = 300000;
    Buffer out(count, DType::kU8), in(count, DType::kU8);
    fill_payload(out.data(), count, DType::kU8, rank, next, 9, 4000);
    P2PHandle r = comm.irecv(in.data(), count, DType::kU8, prev, tagged(9));
    P2PHandle s = comm.isend(out.data(), count, DType::kU8, next, tagged(9));
    bool r_done = false, s_done = false;
    while (!(r_done && s_done)) {
      r_done = r.test();
      s_done = s.test();
    }
    r.wait();
    s.wait();
    report.check("test loop", rank, prev, in.data(), count, DType::kU8, 9, 4000);
  }
  return lines;
}

}  // namespace kolo::testing

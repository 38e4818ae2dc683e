// Point-to-point correctness checks, shared by every test tier: ranks as
// threads (tests/collectives), forked processes (tests/multiproc) and workers
// started by kolorun or mpirun (tests/workers).
//
// Payloads are a deterministic function of (sender, receiver, tag, message,
// index), so each receiver checks what arrived bit for bit with no extra
// communication.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kolo/core/communicator.h"

namespace kolo::testing {

struct P2PCheck {
  // Element counts of the ring exchange (one message per count and dtype).
  std::vector<size_t> counts = {0, 1, 7, 1000, (size_t{1} << 20) + 3};
  std::vector<DType> dtypes = {DType::kU8, DType::kI32, DType::kF16, DType::kF32, DType::kF64};
};

// Runs every pattern on `comm` (every rank calls it): ring exchanges with
// isend/irecv in both orders and with blocking calls, messages of one tag
// kept in order, two large messages received in the opposite order of their
// tags (they must not block each other), every rank with every other rank,
// and sends waited for before the receives they depend on. Returns one line
// per wrong element or pattern ("ring f32 count=7: rank 1 from 0 index 3:
// got ... expected ..."), empty when all passed. Transfer errors propagate.
std::vector<std::string> check_point_to_point(Communicator& comm, const P2PCheck& check = {});

// Fills `count` elements of `dtype` at `data` with the payload of message
// `message` with `tag` from `from` to `to`; `check_payload` compares.
void fill_payload(void* data, size_t count, DType dtype, int from, int to, int tag, int message);
// Returns "" or the first wrong element ("index 3: got 0x.. expected 0x..").
std::string check_payload(const void* data, size_t count, DType dtype, int from, int to, int tag,
                          int message);

}  // namespace kolo::testing

// Point-to-point transfers of torch::Tensor, ranks as threads over the
// threads backend: every dtype, shapes from 0-dim to 13-dim, the allocating
// and the in-place receive, non-contiguous sends, the nonblocking forms, and
// the errors (count or shape mismatch, bad tensors).
#include "kolo/torch/p2p.h"

#include <gtest/gtest.h>

#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "torch_harness.h"

namespace kolo {
namespace {

using testing::kTorchTimeout;
using testing::run_ranks;

P2PTensorOptions via(Communicator& comm, int tag = 0) {
  P2PTensorOptions o;
  o.communicator = &comm;
  o.tag = tag;
  o.timeout = kTorchTimeout;
  return o;
}

// A tensor whose values depend on (seed, index), in `dtype`.
torch::Tensor sample(std::vector<int64_t> shape, torch::Dtype dtype, int seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  torch::Tensor t = (torch::arange(n, torch::kDouble) * 7 + seed).remainder(100) - 50;
  if (dtype == torch::kByte) t = t.abs();
  return t.to(dtype).reshape(shape);
}

TEST(TorchP2P, EveryDtypeAndShapeArrivesExactly) {
  auto comms = make_thread_communicators(2, kTorchTimeout);
  const std::vector<torch::Dtype> dtypes = {torch::kByte,  torch::kChar,  torch::kInt,
                                            torch::kLong,  torch::kHalf,  torch::kBFloat16,
                                            torch::kFloat, torch::kDouble};
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {1}, {5, 3}, {2, 0, 4}, {64, 1024}, std::vector<int64_t>(13, 1)};
  run_ranks(2, [&](int rank) {
    Communicator& comm = *comms[rank];
    int seed = 0;
    for (auto dtype : dtypes) {
      for (const auto& shape : shapes) {
        const torch::Tensor expected = sample(shape, dtype, ++seed);
        if (rank == 0) {
          send(expected, 1, via(comm, 3));
          send(expected, 1, via(comm, 3));
        } else {
          const torch::Tensor got = recv(0, via(comm, 3));
          EXPECT_EQ(got.scalar_type(), dtype);
          EXPECT_EQ(got.sizes(), expected.sizes());
          EXPECT_TRUE(torch::equal(got, expected));
          torch::Tensor into = torch::zeros(shape, torch::TensorOptions().dtype(dtype));
          recv_(into, 0, via(comm, 3));
          EXPECT_TRUE(torch::equal(into, expected));
        }
      }
    }
  });
}

TEST(TorchP2P, NonContiguousSendAndNonblockingForms) {
  auto comms = make_thread_communicators(2, kTorchTimeout);
  run_ranks(2, [&](int rank) {
    Communicator& comm = *comms[rank];
    const torch::Tensor base = sample({6, 4}, torch::kFloat, 1);
    const torch::Tensor transposed = base.t();  // (4, 6), not contiguous
    const int peer = 1 - rank;
    torch::Tensor into = torch::empty({4, 6});
    TensorP2PHandle r = irecv_(into, peer, via(comm));
    TensorP2PHandle s = isend(transposed, peer, via(comm));
    while (!r.test()) {
    }
    EXPECT_TRUE(torch::equal(r.wait(), transposed.contiguous()));
    s.wait();
  });
}

TEST(TorchP2P, MismatchesAreContractErrors) {
  auto comms = make_thread_communicators(2, kTorchTimeout);
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int rank) {
    Communicator& comm = *comms[rank];
    // Different number of elements: both sides.
    try {
      if (rank == 0) send(torch::ones({10}), 1, via(comm));
      if (rank == 1) recv_(torch::empty({11}), 0, via(comm));
    } catch (const ContractError& e) {
      errors[rank] = e.what();
    }
    // Same count, other shape: the receiver only, after the data arrived.
    if (rank == 0) {
      send(torch::ones({2, 3}), 1, via(comm));
    } else {
      try {
        recv_(torch::empty({3, 2}), 0, via(comm));
        ADD_FAILURE() << "no error for a shape mismatch";
      } catch (const ContractError& e) {
        EXPECT_NE(std::string(e.what()).find("shape [2, 3]"), std::string::npos) << e.what();
      }
    }
    // Bad tensors are refused before anything is sent.
    EXPECT_THROW(send(torch::Tensor(), 1 - rank, via(comm)), ContractError);
    EXPECT_THROW(send(torch::ones({2}, torch::kBool), 1 - rank, via(comm)), ContractError);
    EXPECT_THROW(recv_(torch::ones({4, 4}).t(), 1 - rank, via(comm)), ContractError);
  });
  EXPECT_NE(errors[0].find("rank 0 sends 10 f32 elements, rank 1 receives 11 f32"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("rank 0 sends 10 f32 elements, rank 1 receives 11 f32"),
            std::string::npos)
      << errors[1];
}

}  // namespace
}  // namespace kolo

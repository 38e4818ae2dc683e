// Cross-rank signature checks and local argument checks: messages name the
// operation, the argument, the ranks and both values.
#include "comm/signature.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo::detail {
namespace {

CallSignature allreduce_signature() {
  CallSignature s;
  s.sequence = 5;
  s.kind = CollectiveKind::kAllreduce;
  s.count = 1000;
  s.dtype = DType::kF32;
  s.op = ReduceOp::kSum;
  return s;
}

// Runs check_signatures and returns the ContractError message ("" if none).
std::string error_of(const std::vector<CallSignature>& signatures) {
  try {
    check_signatures(signatures);
  } catch (const ContractError& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& text, const std::vector<std::string>& parts) {
  for (const auto& part : parts) {
    EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
  }
}

TEST(Signature, NamesEveryCollective) {
  EXPECT_STREQ(collective_name(CollectiveKind::kAllreduce), "allreduce");
  EXPECT_STREQ(collective_name(CollectiveKind::kAllgather), "allgather");
  EXPECT_STREQ(collective_name(CollectiveKind::kAllgatherv), "allgatherv");
  EXPECT_STREQ(collective_name(CollectiveKind::kBroadcast), "broadcast");
  EXPECT_STREQ(collective_name(CollectiveKind::kReducescatter), "reducescatter");
  EXPECT_STREQ(collective_name(CollectiveKind::kAlltoall), "alltoall");
  EXPECT_STREQ(collective_name(CollectiveKind::kAlltoallv), "alltoallv");
  EXPECT_STREQ(collective_name(CollectiveKind::kBarrier), "barrier");
}

TEST(Signature, HashCountsIsStableAndOrderSensitive) {
  EXPECT_EQ(hash_counts({1, 2, 3}), hash_counts({1, 2, 3}));
  EXPECT_NE(hash_counts({1, 2, 3}), hash_counts({3, 2, 1}));
  EXPECT_NE(hash_counts({0}), hash_counts({0, 0}));
  EXPECT_NE(hash_counts({}), hash_counts({0}));
}

TEST(Signature, EqualSignaturesPass) {
  EXPECT_EQ(error_of({}), "");
  EXPECT_EQ(error_of({allreduce_signature()}), "");
  EXPECT_EQ(error_of(std::vector<CallSignature>(8, allreduce_signature())), "");
}

TEST(Signature, CountMismatchNamesRanksAndValues) {
  std::vector<CallSignature> s(4, allreduce_signature());
  s[2].count = 999;
  s[3].count = 7;
  expect_contains(error_of(s),
                  {"kolo allreduce", "count differs across ranks", "rank 0 passed 1000",
                   "rank 2 passed 999", "rank 3 passed 7", "same count"});
}

TEST(Signature, DtypeOpRootAndScaleMismatches) {
  std::vector<CallSignature> s(3, allreduce_signature());
  s[1].dtype = DType::kF64;
  expect_contains(error_of(s), {"dtype", "rank 0 passed f32", "rank 1 passed f64"});

  s = std::vector<CallSignature>(3, allreduce_signature());
  s[2].op = ReduceOp::kMax;
  expect_contains(error_of(s), {"op differs", "rank 0 passed sum", "rank 2 passed max"});

  s = std::vector<CallSignature>(3, allreduce_signature());
  s[1].postscale = 0.5;
  expect_contains(error_of(s), {"postscale", "rank 0 passed 1", "rank 1 passed 0.5"});

  CallSignature b;
  b.kind = CollectiveKind::kBroadcast;
  b.count = 10;
  b.dtype = DType::kU8;
  s = std::vector<CallSignature>(2, b);
  s[1].root = 1;
  expect_contains(error_of(s),
                  {"kolo broadcast", "root differs", "rank 0 passed 0", "rank 1 passed 1"});
}

TEST(Signature, FieldsThatDoNotApplyAreIgnored) {
  CallSignature g;
  g.kind = CollectiveKind::kAllgather;
  g.count = 3;
  std::vector<CallSignature> s(2, g);
  s[1].op = ReduceOp::kMax;  // allgather has no op
  s[1].root = 1;             // nor a root
  EXPECT_EQ(error_of(s), "");
}

TEST(Signature, DifferentCollectivesOrSkippedCalls) {
  std::vector<CallSignature> s(3, allreduce_signature());
  s[1].kind = CollectiveKind::kBroadcast;
  expect_contains(error_of(s), {"different collectives", "rank 0 called allreduce",
                                "rank 1 called broadcast", "same order"});
  s = std::vector<CallSignature>(3, allreduce_signature());
  s[2].sequence = 4;
  expect_contains(error_of(s), {"call #5", "rank 2 called allreduce as its call #4"});
}

TEST(Signature, AllgathervCountsVector) {
  CallSignature v;
  v.kind = CollectiveKind::kAllgatherv;
  v.count = hash_counts({1, 2});
  std::vector<CallSignature> s(2, v);
  s[1].count = hash_counts({2, 1});
  expect_contains(error_of(s), {"kolo allgatherv", "counts vector differs"});
}

TEST(Signature, LocalArgs) {
  int data = 0;
  const AllreduceOptions ok;
  EXPECT_NO_THROW(check_local_args(CollectiveKind::kAllreduce, 4, &data, &data, 1, &ok, 0));
  EXPECT_NO_THROW(check_local_args(CollectiveKind::kAllreduce, 4, nullptr, nullptr, 0, &ok, 0));
  EXPECT_NO_THROW(check_local_args(CollectiveKind::kBarrier, 4, nullptr, nullptr, 0, nullptr, 0));

  auto message = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const ContractError& e) {
      return e.what();
    }
    return "";
  };
  expect_contains(message([&] {
                    check_local_args(CollectiveKind::kAllgather, 4, nullptr, &data, 3, nullptr, 0);
                  }),
                  {"kolo allgather", "in is null", "count is 3"});
  expect_contains(message([&] {
                    check_local_args(CollectiveKind::kAlltoall, 4, &data, nullptr, 3, nullptr, 0);
                  }),
                  {"kolo alltoall", "out is null"});
  expect_contains(message([&] {
                    check_local_args(CollectiveKind::kBroadcast, 4, &data, &data, 1, nullptr, 4);
                  }),
                  {"kolo broadcast", "root 4", "0 <= root < 4"});
  expect_contains(message([&] {
                    check_local_args(CollectiveKind::kBroadcast, 4, &data, &data, 1, nullptr, -1);
                  }),
                  {"root -1"});
  AllreduceOptions bad;
  bad.prescale = std::nan("");
  expect_contains(message([&] {
                    check_local_args(CollectiveKind::kReducescatter, 2, &data, &data, 1, &bad, 0);
                  }),
                  {"kolo reducescatter", "prescale", "not finite"});
  bad = AllreduceOptions{};
  bad.op = static_cast<ReduceOp>(17);
  expect_contains(
      message([&] { check_local_args(CollectiveKind::kAllreduce, 2, &data, &data, 1, &bad, 0); }),
      {"invalid op 17"});
  expect_contains(message([&] {
                    check_local_args(CollectiveKind::kAllgather, 2, &data, &data, ~size_t{0} / 4,
                                     nullptr, 0);
                  }),
                  {"too large"});
}

TEST(Signature, CountsArgAndAlltoallvConsistency) {
  EXPECT_NO_THROW(check_counts_arg(CollectiveKind::kAllgatherv, "counts", {1, 2, 3}, 3));
  try {
    check_counts_arg(CollectiveKind::kAlltoallv, "send_counts", {1, 2}, 3);
    FAIL() << "expected ContractError";
  } catch (const ContractError& e) {
    expect_contains(e.what(), {"kolo alltoallv", "send_counts has 2 entries", "3 ranks"});
  }

  // send[r][k] == recv[k][r]
  std::vector<std::vector<size_t>> send = {{0, 1, 2}, {3, 4, 5}, {6, 7, 8}};
  std::vector<std::vector<size_t>> recv = {{0, 3, 6}, {1, 4, 7}, {2, 5, 8}};
  EXPECT_NO_THROW(check_alltoallv_counts(send, recv));
  recv[2][1] = 9;  // rank 2 expects 9 from rank 1, which sends 5
  try {
    check_alltoallv_counts(send, recv);
    FAIL() << "expected ContractError";
  } catch (const ContractError& e) {
    expect_contains(e.what(), {"rank 1 sends 5 elements to rank 2", "rank 2 expects 9"});
  }
}

}  // namespace
}  // namespace kolo::detail

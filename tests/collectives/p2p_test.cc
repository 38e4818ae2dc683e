// Ranks as threads: point-to-point transfers on every backend that runs inside
// one process (threads, shm, gloo), world sizes 2-5: the shared pattern check,
// count and dtype mismatches (a ContractError on both sides, and the
// communicator stays usable), transfers that complete while the sender is
// away from the communicator, a peer that never posts (TimeoutError naming
// it), a peer that destroys its communicator (RuntimeFault naming it), and the
// local argument checks.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine_harness.h"
#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "p2p_check.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

using std::chrono::milliseconds;
using testing::EngineWorld;
using testing::run_ranks;

P2POptions tagged(int tag, milliseconds timeout = milliseconds(0)) {
  P2POptions o;
  o.tag = tag;
  o.timeout = timeout;
  return o;
}

// ---- the pattern check ---------------------------------------------------------

class P2PMatrix : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(P2PMatrix, EveryPattern) {
  const auto& [backend, size] = GetParam();
  EngineWorld world(backend, size, milliseconds(90000));
  std::vector<std::vector<std::string>> failures(size);
  run_ranks(size, [&](int rank) {
    auto comm = world.communicator(rank);
    failures[rank] = testing::check_point_to_point(*comm);
    comm->barrier({});  // nobody leaves while a peer still drains its rings
  });
  std::string report;
  size_t total = 0;
  for (const auto& lines : failures) {
    for (const auto& line : lines) {
      if (total++ < 20) report += line + "\n";
    }
  }
  EXPECT_EQ(total, 0u) << report;
}

INSTANTIATE_TEST_SUITE_P(Backends, P2PMatrix,
                         ::testing::Combine(::testing::ValuesIn(testing::engine_backends()),
                                            ::testing::Values(2, 3, 5)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---- errors --------------------------------------------------------------------

class P2PErrors : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr milliseconds kTimeout{20000};
};

// Rank 0 sends 1000 f32 to rank 1, which receives `recv_count` of `recv_dtype`:
// both get a ContractError naming both sides' values; then a correct transfer
// on the same communicator works.
void mismatch_case(const std::string& backend, size_t recv_count, DType recv_dtype,
                   const std::vector<std::string>& words) {
  EngineWorld world(backend, 2, milliseconds(20000));
  std::vector<std::string> errors(2);
  std::vector<float> after(2, 0.0f);
  run_ranks(2, [&](int rank) {
    auto comm = world.communicator(rank);
    std::vector<double> buffer(1000, 1.0);
    try {
      if (rank == 0) {
        comm->send(buffer.data(), 1000, DType::kF32, 1, tagged(5));
      } else {
        comm->recv(buffer.data(), recv_count, recv_dtype, 0, tagged(5));
      }
    } catch (const ContractError& e) {
      errors[rank] = e.what();
    }
    float x = rank == 0 ? 42.0f : 0.0f;
    if (rank == 0) comm->send(&x, 1, DType::kF32, 1, tagged(5));
    if (rank == 1) comm->recv(&x, 1, DType::kF32, 0, tagged(5));
    after[rank] = x;
    comm->barrier({});
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_FALSE(errors[rank].empty()) << "rank " << rank << " got no ContractError";
    for (const auto& word : words) {
      EXPECT_NE(errors[rank].find(word), std::string::npos)
          << "rank " << rank << ": '" << word << "' not in: " << errors[rank];
    }
  }
  EXPECT_NE(errors[0].find("send to rank 1 (tag 5)"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("recv from rank 0 (tag 5)"), std::string::npos) << errors[1];
  EXPECT_EQ(after[1], 42.0f) << "the communicator is not usable after the mismatch";
}

TEST_P(P2PErrors, CountMismatchOnBothSides) {
  mismatch_case(GetParam(), 999, DType::kF32,
                {"rank 0 sends 1000 f32", "rank 1 receives 999 f32", "nothing was transferred"});
}

TEST_P(P2PErrors, LargerReceiveIsAlsoAMismatch) {
  mismatch_case(GetParam(), 1001, DType::kF32, {"rank 0 sends 1000 f32", "receives 1001 f32"});
}

TEST_P(P2PErrors, DtypeMismatchOnBothSides) {
  mismatch_case(GetParam(), 500, DType::kF64, {"rank 0 sends 1000 f32", "receives 500 f64"});
}

TEST_P(P2PErrors, PeerThatNeverPostsTimesOutNamingIt) {
  EngineWorld world(GetParam(), 3, kTimeout);
  std::vector<std::string> messages(3);
  std::vector<std::vector<int>> failed(3);
  std::atomic<int> finished{0};
  run_ranks(3, [&](int rank) {
    auto comm = world.communicator(rank);
    if (rank == 2) {
      // Never posts; keeps its communicator until the others are done.
      while (finished.load() < 2) std::this_thread::sleep_for(milliseconds(10));
      return;
    }
    struct Done {
      std::atomic<int>& count;
      ~Done() { ++count; }
    } done{finished};
    std::vector<float> data(10);
    try {
      if (rank == 0) {
        comm->recv(data.data(), 10, DType::kF32, 2, tagged(1, milliseconds(300)));
      } else {
        comm->send(data.data(), 10, DType::kF32, 2, tagged(1, milliseconds(300)));
      }
    } catch (const TimeoutError& e) {
      messages[rank] = e.what();
      failed[rank] = e.failed_ranks();
    } catch (const RuntimeFault& e) {
      // Another rank's timeout may have broken the communicator first.
      messages[rank] = std::string("fault: ") + e.what();
      failed[rank] = e.failed_ranks();
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_NE(messages[rank].find("rank 2"), std::string::npos) << messages[rank];
    EXPECT_EQ(failed[rank], std::vector<int>{2}) << messages[rank];
  }
  EXPECT_NE(messages[0].find("timed out"), std::string::npos) << messages[0];
}

TEST_P(P2PErrors, PeerThatDestroysItsCommunicatorIsNamed) {
  EngineWorld world(GetParam(), 2, kTimeout);
  std::string message;
  std::vector<int> failed;
  run_ranks(2, [&](int rank) {
    auto comm = world.communicator(rank);
    comm->barrier({});
    if (rank == 1) {
      std::this_thread::sleep_for(milliseconds(200));
      comm.reset();  // rank 0 waits for a message rank 1 never sends
      return;
    }
    std::vector<float> data(10);
    try {
      comm->recv(data.data(), 10, DType::kF32, 1, tagged(0));
    } catch (const RuntimeFault& e) {
      message = e.what();
      failed = e.failed_ranks();
    }
  });
  EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
  EXPECT_EQ(failed, std::vector<int>{1}) << message;
}

// Progress without the sender: rank 0 posts two isends (a small header, then
// a payload larger than shm's rings) and stays away from the communicator,
// as a pipeline stage computing its next micro-batch does; rank 1 receives
// the header, and only then posts the payload's receive (as kolo::recv on
// tensors does). Both receives must complete while rank 0 is away: a
// transfer that moved only on its owner's next call would hold the receiver
// for the sender's whole computation. Rank 0 gives up waiting after a
// generous bound, so a failure is an assertion, not a hang.
TEST_P(P2PErrors, SendsMoveWhileTheSenderIsAway) {
  EngineWorld world(GetParam(), 2, kTimeout);
  constexpr size_t kPayload = (size_t{3} << 20) / 4 + 5;  // f32 elements, ~3 MiB
  std::mutex mutex;
  std::condition_variable arrived_cv;
  bool arrived = false, sender_back = false;
  bool arrived_while_away = false;
  std::vector<std::string> wrong;
  run_ranks(2, [&](int rank) {
    auto comm = world.communicator(rank);
    comm->barrier({});
    if (rank == 0) {
      std::vector<int64_t> header = {static_cast<int64_t>(kPayload)};
      std::vector<float> payload(kPayload);
      testing::fill_payload(payload.data(), kPayload, DType::kF32, 0, 1, 3, 0);
      P2PHandle h = comm->isend(header.data(), 1, DType::kI64, 1, tagged(3));
      P2PHandle d = comm->isend(payload.data(), kPayload, DType::kF32, 1, tagged(3));
      {
        std::unique_lock<std::mutex> lock(mutex);
        arrived_cv.wait_for(lock, std::chrono::seconds(60), [&] { return arrived; });
        sender_back = true;
      }
      h.wait();
      d.wait();
    } else {
      int64_t count = 0;
      comm->recv(&count, 1, DType::kI64, 0, tagged(3));
      std::vector<float> payload(static_cast<size_t>(count));
      comm->recv(payload.data(), payload.size(), DType::kF32, 0, tagged(3));
      const std::string problem =
          testing::check_payload(payload.data(), payload.size(), DType::kF32, 0, 1, 3, 0);
      std::lock_guard<std::mutex> lock(mutex);
      if (!problem.empty()) wrong.push_back(problem);
      arrived = true;
      arrived_while_away = !sender_back;
      arrived_cv.notify_all();
    }
    comm->barrier({});
  });
  EXPECT_TRUE(wrong.empty()) << wrong.front();
  EXPECT_TRUE(arrived_while_away)
      << "the payload arrived only after the sender called into the communicator again";
}

TEST_P(P2PErrors, LocalArgumentErrors) {
  EngineWorld world(GetParam(), 2, kTimeout);
  run_ranks(2, [&](int rank) {
    auto comm = world.communicator(rank);
    float x = 0;
    auto error_of = [](const std::function<void()>& call) {
      try {
        call();
      } catch (const ContractError& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    EXPECT_NE(
        error_of([&] { comm->isend(&x, 1, DType::kF32, 2, {}); }).find("peer 2 is not a rank"),
        std::string::npos);
    EXPECT_NE(error_of([&] { comm->irecv(&x, 1, DType::kF32, rank, {}); }).find("itself"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                comm->isend(&x, 1, DType::kF32, 1 - rank, tagged(-1));
              }).find("tag -1 is not in"),
              std::string::npos);
    EXPECT_NE(
        error_of([&] { comm->isend(nullptr, 3, DType::kF32, 1 - rank, {}); }).find("data is null"),
        std::string::npos);
    EXPECT_NE(error_of([&] { P2PHandle().wait(); }).find("empty"), std::string::npos);
    // The checks consumed nothing: a real transfer still pairs up.
    x = static_cast<float>(rank + 1);
    float y = 0;
    P2PHandle r = comm->irecv(&y, 1, DType::kF32, 1 - rank, {});
    comm->send(&x, 1, DType::kF32, 1 - rank, {});
    r.wait();
    EXPECT_EQ(y, static_cast<float>(2 - rank));
    comm->barrier({});
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, P2PErrors, ::testing::ValuesIn(testing::engine_backends()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kolo

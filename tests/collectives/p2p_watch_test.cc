// The stall check of point-to-point transfers (P2PWatch around the
// Runtime's communicators), ranks as threads on shm and gloo: two ranks that
// each wait for the other (pipeline stages running different plans) are
// warned about after KOLO_STALL_WARNING_SECONDS, each naming its own wait by
// peer and tag, and fail with RuntimeFault after KOLO_STALL_SHUTDOWN_SECONDS
// instead of waiting silently for KOLO_TIMEOUT_SECONDS; transfers that match
// go through the watched communicator as through any; on groups the ranks
// are named with their world ranks, and a transfer's own longer timeout wins.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/core/store.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

class P2PWatchTest : public ::testing::TestWithParam<std::string> {};

// Rank `rank` of `n` on the backend under test, meeting at `store`: a stall
// warning after 0.2 s, the stall watch's abort after `shutdown_seconds`, and
// a transfer timeout (60 s) well beyond both.
InitOptions watched_rank(int rank, int n, const TcpStoreServer& store, const std::string& backend,
                         const std::string& shutdown_seconds) {
  InitOptions options;
  options.env = map_env({{"KOLO_RANK", std::to_string(rank)},
                         {"KOLO_SIZE", std::to_string(n)},
                         {"KOLO_STORE_ADDR", "127.0.0.1"},
                         {"KOLO_STORE_PORT", std::to_string(store.port())},
                         {"KOLO_BACKEND", backend},
                         {"KOLO_TIMEOUT_SECONDS", "60"},
                         {"KOLO_STALL_WARNING_SECONDS", "0.2"},
                         {"KOLO_STALL_SHUTDOWN_SECONDS", shutdown_seconds}});
  return options;
}

TEST_P(P2PWatchTest, ADeadlockIsWarnedAboutThenFailsNamingPeerAndTag) {
  constexpr int n = 2;
  TcpStoreServer server({});
  std::string errors[n];
  double seconds[n] = {0, 0};
  ::testing::internal::CaptureStderr();
  testing::run_ranks(n, [&](int rank) {
    Runtime runtime(watched_rank(rank, n, server, GetParam(), "2"));
    Communicator& world = runtime.world();
    const int peer = 1 - rank;
    // A matching pair first: the watch is invisible to it.
    int value = rank == 0 ? 42 : 0;
    P2POptions first;
    first.tag = 7;
    if (rank == 0) {
      world.send(&value, 1, DType::kI32, peer, first);
    } else {
      world.recv(&value, 1, DType::kI32, peer, first);
      EXPECT_EQ(value, 42);
    }
    // Then each rank receives what the other never sends.
    P2POptions stuck;
    stuck.tag = 101 + rank;
    const auto start = std::chrono::steady_clock::now();
    try {
      world.recv(&value, 1, DType::kI32, peer, stuck);
    } catch (const RuntimeFault& e) {
      errors[rank] = e.what();
    }
    seconds[rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  for (int rank = 0; rank < n; ++rank) {
    const std::string wait =
        "recv from rank " + std::to_string(1 - rank) + " (tag " + std::to_string(101 + rank) + ")";
    EXPECT_NE(log.find("stall: rank " + std::to_string(rank) + " has waited"), std::string::npos)
        << log;
    EXPECT_NE(
        log.find(wait + ": rank " + std::to_string(1 - rank) + " has not posted the matching send"),
        std::string::npos)
        << log;
    // Each rank fails at about the shutdown time: by its own watch, or by
    // the peer's giving up first (whose reason it then carries).
    EXPECT_NE(errors[rank].find("KOLO_STALL_SHUTDOWN_SECONDS"), std::string::npos)
        << "rank " << rank << ": '" << errors[rank] << "'";
    EXPECT_NE(errors[rank].find("(tag 10"), std::string::npos) << errors[rank];
    EXPECT_GE(seconds[rank], 1.0) << "rank " << rank;
    EXPECT_LT(seconds[rank], 20.0) << "rank " << rank << " waited for the transfer's timeout";
  }
}

// On a group communicator (what pipelines and parameter-server links run
// on) the watch names each rank with its world rank beside its group rank;
// a transfer given its own timeout longer than KOLO_STALL_SHUTDOWN_SECONDS
// (a parameter server's PsOptions::idle_timeout) is left to that timeout:
// no stall warning, no abort, its own TimeoutError at its end.
TEST_P(P2PWatchTest, GroupsNameWorldRanksAndALongerOwnTimeoutIsHonoured) {
  constexpr int n = 3;
  TcpStoreServer server({});
  std::string stalled[n], patient[n];
  double patient_seconds[n] = {0, 0, 0};
  ::testing::internal::CaptureStderr();
  testing::run_ranks(n, [&](int rank) {
    Runtime runtime(watched_rank(rank, n, server, GetParam(), "1.5"));
    if (rank == 0) return;      // not in the group
    const int peer = 2 - rank;  // group ranks 0 and 1 are world ranks 1 and 2
    int value = 0;
    {
      // A transfer whose own timeout (3 s) is longer than the watch's 1.5 s.
      auto group = runtime.group_communicator({1, 2}, "patient");
      P2POptions own;
      own.tag = 55;
      own.timeout = std::chrono::milliseconds(3000);
      const auto start = std::chrono::steady_clock::now();
      try {
        group->recv(&value, 1, DType::kI32, peer, own);
      } catch (const RuntimeFault& e) {
        patient[rank] = e.what();
      }
      patient_seconds[rank] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    auto group = runtime.group_communicator({1, 2}, "stages");
    P2POptions stuck;
    stuck.tag = 101 + rank;
    try {
      group->recv(&value, 1, DType::kI32, peer, stuck);
    } catch (const RuntimeFault& e) {
      stalled[rank] = e.what();
    }
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  for (int rank = 1; rank < n; ++rank) {
    const int group_rank = rank - 1;
    const std::string me =
        "rank " + std::to_string(group_rank) + " (world rank " + std::to_string(rank) + ")";
    const std::string them =
        "rank " + std::to_string(1 - group_rank) + " (world rank " + std::to_string(3 - rank) + ")";
    EXPECT_NE(log.find("stall: " + me + " has waited"), std::string::npos) << log;
    EXPECT_NE(log.find("in recv from " + them + " (tag " + std::to_string(101 + rank) +
                       "): " + them + " has not posted the matching send"),
              std::string::npos)
        << log;
    EXPECT_NE(stalled[rank].find("KOLO_STALL_SHUTDOWN_SECONDS"), std::string::npos)
        << stalled[rank];
    EXPECT_NE(patient[rank].find("timed out"), std::string::npos) << patient[rank];
    EXPECT_EQ(patient[rank].find("KOLO_STALL_SHUTDOWN_SECONDS"), std::string::npos)
        << patient[rank];
    EXPECT_GE(patient_seconds[rank], 2.8) << "rank " << rank << ": " << patient[rank];
  }
  EXPECT_EQ(log.find("(tag 55)"), std::string::npos) << "a wait within its own timeout: " << log;
}

INSTANTIATE_TEST_SUITE_P(Backends, P2PWatchTest, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kolo

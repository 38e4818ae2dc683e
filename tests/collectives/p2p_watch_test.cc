// The stall check of point-to-point transfers (P2PWatch around the
// Runtime's communicators), ranks as threads on shm and gloo: two ranks that
// each wait for the other (pipeline stages running different plans) are
// warned about after KOLO_STALL_WARNING_SECONDS, each naming its own wait by
// peer and tag, and fail with RuntimeFault after KOLO_STALL_SHUTDOWN_SECONDS
// instead of waiting silently for KOLO_TIMEOUT_SECONDS; transfers that match
// go through the watched communicator as through any.
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

TEST_P(P2PWatchTest, ADeadlockIsWarnedAboutThenFailsNamingPeerAndTag) {
  constexpr int n = 2;
  TcpStoreServer server({});
  std::string errors[n];
  double seconds[n] = {0, 0};
  ::testing::internal::CaptureStderr();
  testing::run_ranks(n, [&](int rank) {
    InitOptions options;
    options.env = map_env({{"KOLO_RANK", std::to_string(rank)},
                           {"KOLO_SIZE", std::to_string(n)},
                           {"KOLO_STORE_ADDR", "127.0.0.1"},
                           {"KOLO_STORE_PORT", std::to_string(server.port())},
                           {"KOLO_BACKEND", GetParam()},
                           {"KOLO_TIMEOUT_SECONDS", "60"},
                           {"KOLO_STALL_WARNING_SECONDS", "0.2"},
                           {"KOLO_STALL_SHUTDOWN_SECONDS", "2"}});
    Runtime runtime(options);
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

INSTANTIATE_TEST_SUITE_P(Backends, P2PWatchTest, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kolo

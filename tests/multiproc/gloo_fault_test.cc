// gloo backend across forked processes: a peer SIGKILLed in the middle of a
// series of allreduces, a peer that stops calling (timeout), and peers calling
// with different arguments. Ranks rendezvous through a file store in a fresh
// temporary directory. The parent is a watchdog: it kills every child that is
// still running at its deadline, so no test can hang.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "forked_ranks.h"
#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"
#include "temp_dir.h"

#if KOLO_HAVE_GLOO

namespace kolo {
namespace {

using Clock = std::chrono::steady_clock;
using kolo::testing::TempDir;
using std::chrono::milliseconds;

using kolo::testing::run_forked_ranks;
using kolo::testing::SharedState;

std::unique_ptr<Communicator> connect(const std::string& dir, int rank, int size,
                                      milliseconds timeout) {
  CommunicatorOptions options;
  options.rank = rank;
  options.size = size;
  options.store = make_file_store(dir);
  options.prefix = "fault_test";
  options.timeout = timeout;
  return make_communicator("gloo", options);
}

bool names_rank(const RuntimeFault& fault, int rank) {
  for (int r : fault.failed_ranks()) {
    if (r == rank) return true;
  }
  return false;
}

TEST(GlooFaultTest, SurvivorsOfAKilledPeerGetRuntimeFaultNamingIt) {
  TempDir dir("kolo-gloo-fault");
  constexpr int kSize = 3;
  constexpr int kVictim = 2;
  constexpr milliseconds kTimeout{10000};
  bool killed = false;
  auto outcomes = run_forked_ranks(
      kSize,
      [&](int rank, SharedState& state) -> std::string {
        auto comm = connect(dir.path(), rank, kSize, kTimeout);
        std::vector<float> data(1 << 18, 1.0f);  // 1 MiB: takes the ring path
        try {
          for (int i = 0; i < 100000; ++i) {
            comm->allreduce(data.data(), data.data(), data.size(), DType::kF32,
                            {ReduceOp::kAverage});
            state.progress[rank]++;
          }
        } catch (const RuntimeFault& fault) {
          std::fprintf(stderr, "[rank %d] %s\n", rank, fault.what());
          if (!names_rank(fault, kVictim)) {
            return "RuntimeFault does not name rank 2: " + std::string(fault.what());
          }
          if (std::string(fault.what()).find("rank 2") == std::string::npos) {
            return "message does not name rank 2: " + std::string(fault.what());
          }
          if (dynamic_cast<const TimeoutError*>(&fault) != nullptr) {
            return "a dead peer was reported as a timeout: " + std::string(fault.what());
          }
          // The communicator stays failed: the next call fails at once.
          try {
            comm->barrier({});
            return "barrier after the fault succeeded";
          } catch (const RuntimeFault&) {
          }
          return "";
        }
        return "allreduce loop ended without a fault";
      },
      [&](const std::vector<pid_t>& pids, SharedState& state) {
        // Kill the victim once every rank is well into the series.
        if (killed) return;
        for (int r = 0; r < kSize; ++r) {
          if (state.progress[r] < 5) return;
        }
        kill(pids[kVictim], SIGKILL);
        killed = true;
      },
      milliseconds(60000));
  ASSERT_TRUE(killed) << "the ranks never made progress: " << outcomes[0].result;
  EXPECT_EQ(outcomes[kVictim].signal, SIGKILL);
  for (int rank = 0; rank < kSize; ++rank) {
    if (rank == kVictim) continue;
    EXPECT_EQ(outcomes[rank].exit_code, 0) << "rank " << rank << ": " << outcomes[rank].result;
  }
}

// A rank that stops calling: the others time out (TimeoutError naming it) and
// the late rank, when it finally calls, finds the communicator failed.
TEST(GlooFaultTest, PeerThatStopsCallingCausesTimeoutError) {
  TempDir dir("kolo-gloo-fault");
  constexpr int kSize = 3;
  constexpr int kLate = 1;
  constexpr milliseconds kTimeout{1500};
  auto outcomes = run_forked_ranks(
      kSize,
      [&](int rank, SharedState& state) -> std::string {
        auto comm = connect(dir.path(), rank, kSize, milliseconds(10000));
        std::vector<int32_t> data(1000, rank);
        comm->allreduce(data.data(), data.data(), data.size(), DType::kI32, {});
        if (rank == kLate) {
          std::this_thread::sleep_for(milliseconds(3000));
          try {
            comm->allreduce(data.data(), data.data(), data.size(), DType::kI32, {});
            return "late rank's allreduce succeeded";
          } catch (const RuntimeFault&) {
            return "";
          }
        }
        AllreduceOptions options;
        options.timeout = kTimeout;
        const auto start = Clock::now();
        try {
          comm->allreduce(data.data(), data.data(), data.size(), DType::kI32, options);
          return "allreduce without rank 1 succeeded";
        } catch (const TimeoutError& error) {
          const auto elapsed = Clock::now() - start;
          if (elapsed < kTimeout / 2) return "timed out too early: " + std::string(error.what());
          if (!names_rank(error, kLate)) {
            return "TimeoutError does not name rank 1: " + std::string(error.what());
          }
          return "";
        } catch (const RuntimeFault& fault) {
          return "RuntimeFault instead of TimeoutError: " + std::string(fault.what());
        }
      },
      nullptr, milliseconds(30000));
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_EQ(outcomes[rank].exit_code, 0) << "rank " << rank << ": " << outcomes[rank].result;
  }
}

// Different count, then different dtype on one rank: every rank gets the same
// ContractError, and the communicator stays usable afterwards.
TEST(GlooFaultTest, MismatchedArgumentsGiveContractErrorOnEveryRank) {
  TempDir dir("kolo-gloo-fault");
  constexpr int kSize = 3;
  auto outcomes = run_forked_ranks(
      kSize,
      [&](int rank, SharedState& state) -> std::string {
        auto comm = connect(dir.path(), rank, kSize, milliseconds(10000));
        std::vector<float> data(1000, 1.0f);
        try {
          comm->allreduce(data.data(), data.data(), rank == 1 ? 999 : 1000, DType::kF32, {});
          return "count mismatch not detected";
        } catch (const ContractError& error) {
          const std::string text = error.what();
          if (text.find("count differs") == std::string::npos ||
              text.find("rank 1 passed 999") == std::string::npos) {
            return "unexpected count message: " + text;
          }
        }
        try {
          comm->allgather(data.data(), data.data(), 10, rank == 2 ? DType::kI32 : DType::kF32, {});
          return "dtype mismatch not detected";
        } catch (const ContractError& error) {
          const std::string text = error.what();
          if (text.find("dtype differs") == std::string::npos ||
              text.find("rank 2 passed i32") == std::string::npos) {
            return "unexpected dtype message: " + text;
          }
        }
        comm->allreduce(data.data(), data.data(), 1000, DType::kF32, {});
        for (float v : data) {
          if (v != 3.0f) return "allreduce after the errors gave " + std::to_string(v);
        }
        return "";
      },
      nullptr, milliseconds(30000));
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_EQ(outcomes[rank].exit_code, 0) << "rank " << rank << ": " << outcomes[rank].result;
  }
}

}  // namespace
}  // namespace kolo

#endif  // KOLO_HAVE_GLOO

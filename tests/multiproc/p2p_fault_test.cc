// Point-to-point transfers across forked processes on shm and gloo: a peer
// SIGKILLed in the middle of a stream of large transfers (the receiver, then
// the sender) must give the survivors a RuntimeFault naming it, never a hang
// or a timeout; a third rank waiting for a message from a survivor learns of
// the fault too. The parent is the watchdog (forked_ranks.h).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "forked_ranks.h"
#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"
#include "temp_dir.h"

namespace kolo {
namespace {

using std::chrono::milliseconds;
using testing::run_forked_ranks;
using testing::SharedState;
using testing::TempDir;

constexpr int kSize = 3;
constexpr size_t kMessageFloats = size_t{4} << 20;  // 16 MB: many chunks per transfer
constexpr milliseconds kTimeout{20000};             // far beyond how long the fault takes

std::vector<std::string> backends() {
  std::vector<std::string> names = {"shm"};
#if KOLO_HAVE_GLOO
  names.push_back("gloo");
#endif
  return names;
}

std::unique_ptr<Communicator> connect(const std::string& backend, const std::string& dir,
                                      int rank) {
  CommunicatorOptions options;
  options.rank = rank;
  options.size = kSize;
  options.store = make_file_store(dir);
  options.prefix = "p2p_fault";
  options.timeout = kTimeout;
  return make_communicator(backend, options);
}

// "" when `fault` is a RuntimeFault (not a timeout) naming `victim`.
std::string check_fault(const RuntimeFault& fault, int victim) {
  const std::string text = fault.what();
  if (dynamic_cast<const TimeoutError*>(&fault) != nullptr) {
    return "a dead peer was reported as a timeout: " + text;
  }
  bool named = false;
  for (int r : fault.failed_ranks()) named |= r == victim;
  if (!named) return "failed_ranks() does not name rank " + std::to_string(victim) + ": " + text;
  if (text.find("rank " + std::to_string(victim)) == std::string::npos) {
    return "the message does not name rank " + std::to_string(victim) + ": " + text;
  }
  return "";
}

// Rank 0 streams to rank 1; rank 2 waits for a message rank 0 sends only
// after the stream. `victim` (0 or 1) is killed once the stream is under way.
void kill_during_stream(const std::string& backend, int victim) {
  TempDir dir("kolo-p2p-fault");
  bool killed = false;
  auto outcomes = run_forked_ranks(
      kSize,
      [&](int rank, SharedState& state) -> std::string {
        auto comm = connect(backend, dir.path(), rank);
        std::vector<float> data(kMessageFloats, static_cast<float>(rank));
        try {
          for (int i = 0; i < 100000; ++i) {
            if (rank == 0) {
              comm->send(data.data(), data.size(), DType::kF32, 1, {});
            } else if (rank == 1) {
              comm->recv(data.data(), data.size(), DType::kF32, 0, {});
            } else {
              P2POptions late;
              late.tag = 1;
              comm->recv(data.data(), 1, DType::kF32, 0, late);
            }
            state.progress[rank]++;
          }
        } catch (const RuntimeFault& fault) {
          std::fprintf(stderr, "[%s rank %d] %s\n", backend.c_str(), rank, fault.what());
          const std::string problem = check_fault(fault, victim);
          if (!problem.empty()) return problem;
          // The communicator stays failed.
          try {
            float x = 0;
            comm->send(&x, 1, DType::kF32, rank == 2 ? 0 : 2, {});
            return "a send after the fault succeeded";
          } catch (const RuntimeFault&) {
          }
          return "";
        }
        return "the loop ended without a fault";
      },
      [&](const std::vector<pid_t>& pids, SharedState& state) {
        if (killed || state.progress[1] < 3) return;
        kill(pids[victim], SIGKILL);
        killed = true;
      },
      milliseconds(90000));
  ASSERT_TRUE(killed) << "the stream never got going: " << outcomes[0].result << " / "
                      << outcomes[1].result;
  EXPECT_EQ(outcomes[victim].signal, SIGKILL);
  for (int rank = 0; rank < kSize; ++rank) {
    if (rank == victim) continue;
    EXPECT_EQ(outcomes[rank].exit_code, 0)
        << backend << " rank " << rank << ": " << outcomes[rank].result;
  }
}

class P2PFault : public ::testing::TestWithParam<std::string> {};

TEST_P(P2PFault, ReceiverKilledMidTransferIsNamedBySurvivors) { kill_during_stream(GetParam(), 1); }

TEST_P(P2PFault, SenderKilledMidTransferIsNamedBySurvivors) { kill_during_stream(GetParam(), 0); }

INSTANTIATE_TEST_SUITE_P(Backends, P2PFault, ::testing::ValuesIn(backends()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kolo

// The hierarchical composition (shm within each host, gloo across hosts)
// with ranks as forked processes on two pretend hosts (rank_hosts, or the
// launcher's placement variables for the Runtime): a rank SIGKILLed on either
// host is a RuntimeFault naming it on every survivor, whichever part each
// survivor was waiting in; the whole Runtime (world, engine, process sets)
// composes by itself from the launcher's placement and matches the reference.
// Ranks (forked_ranks.h) rendezvous through a file store in a fresh
// temporary directory.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "collective_check.h"
#include "forked_ranks.h"
#include "kolo/core/communicator.h"
#include "kolo/core/config.h"
#include "kolo/core/engine.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/core/store.h"
#include "temp_dir.h"

#if KOLO_HAVE_GLOO

namespace kolo {
namespace {

using kolo::testing::allreduce_until_fault;
using kolo::testing::kill_once_running;
using kolo::testing::run_forked_ranks;
using kolo::testing::SharedState;
using kolo::testing::TempDir;
using std::chrono::milliseconds;

// 2 hosts x 2 ranks (ranks 0, 1 on host 0; 2, 3 on host 1), a series of 1 MiB
// allreduces, and one rank SIGKILLed once every rank is well into it. Rank 0 is the
// observer: victim 1 is on its host, victims 2 and 3 on the far host.
class HierarchicalKill : public ::testing::TestWithParam<int> {};

TEST_P(HierarchicalKill, IsARuntimeFaultNamingTheDeadRankOnEverySurvivor) {
  TempDir dir("kolo-hier-fault");
  constexpr int kSize = 4;
  const int victim = GetParam();
  bool killed = false;
  auto outcomes = run_forked_ranks(
      kSize,
      [&](int rank, SharedState& state) -> std::string {
        CommunicatorOptions options;
        options.rank = rank;
        options.size = kSize;
        options.store = make_file_store(dir.path());
        options.prefix = "hier_fault";
        options.timeout = milliseconds(20000);
        options.hierarchical = "on";
        options.rank_hosts = {0, 0, 1, 1};
        options.host_name = rank < 2 ? "pretend-a" : "pretend-b";
        auto comm = make_communicator("gloo", options);
        // 1 MiB: every part busy (shm reduce-scatter, gloo ring, shm allgather)
        return allreduce_until_fault(*comm, victim, 1 << 18, state.progress[rank],
                                     "kolo hierarchical (rank " + std::to_string(rank));
      },
      kill_once_running(victim, kSize, &killed), milliseconds(90000));
  ASSERT_TRUE(killed) << "the ranks never made progress: " << outcomes[0].result;
  EXPECT_EQ(outcomes[victim].signal, SIGKILL);
  for (int rank = 0; rank < kSize; ++rank) {
    if (rank == victim) continue;
    EXPECT_EQ(outcomes[rank].exit_code, 0) << "rank " << rank << ": " << outcomes[rank].result;
  }
}

INSTANTIATE_TEST_SUITE_P(Victim, HierarchicalKill, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Rank" + std::to_string(info.param);
                         });

// What kolorun -H a:2,b:2 gives each rank (the placement variables), with
// the store and the backend; `extra` adds or overrides.
InitOptions launched_as(int rank, const std::vector<int>& hosts_of, const std::string& dir,
                        std::map<std::string, std::string> extra) {
  const int size = static_cast<int>(hosts_of.size());
  int local_rank = 0;
  int local_size = 0;
  int cross_size = 0;
  for (int r = 0; r < size; ++r) {
    cross_size = std::max(cross_size, hosts_of[r] + 1);
    if (hosts_of[r] != hosts_of[rank]) continue;
    if (r < rank) ++local_rank;
    ++local_size;
  }
  std::map<std::string, std::string> env = {{"KOLO_RANK", std::to_string(rank)},
                                            {"KOLO_SIZE", std::to_string(size)},
                                            {"KOLO_LOCAL_RANK", std::to_string(local_rank)},
                                            {"KOLO_LOCAL_SIZE", std::to_string(local_size)},
                                            {"KOLO_CROSS_RANK", std::to_string(hosts_of[rank])},
                                            {"KOLO_CROSS_SIZE", std::to_string(cross_size)},
                                            {"KOLO_BACKEND", "gloo"},
                                            {"KOLO_TIMEOUT_SECONDS", "60"},
                                            {"KOLO_CYCLE_TIME_MS", "0.5"}};
  for (auto& [key, value] : extra) env[key] = value;
  InitOptions options;
  options.env = map_env(env);
  options.store = make_file_store(dir);
  options.store_prefix = "hier_runtime";
  return options;
}

// The whole Runtime on 2 pretend hosts x 2: the world communicator, the
// engine's and a process set's (2 x 1, so flat) all match the reference.
TEST(HierarchicalRuntime, WorldEngineAndProcessSetsOnTwoHostsOfTwo) {
  TempDir dir("kolo-hier-runtime");
  constexpr int kSize = 4;
  auto outcomes = run_forked_ranks(
      kSize,
      [&](int rank, SharedState&) -> std::string {
        Runtime runtime(launched_as(rank, {0, 0, 1, 1}, dir.path(), {}));
        if (runtime.topology().cross_size != 2 || runtime.topology().local_size != 2) {
          return "placement not taken from the launcher's variables";
        }
        testing::CheckMatrix matrix;
        matrix.counts = {0, 7, 1000, (size_t{1} << 18) + 1};
        matrix.ops = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax};
        const auto failures = testing::check_collectives(runtime.world(), matrix);
        if (!failures.empty()) return "world: " + failures.front();

        Engine& engine = runtime.engine();
        std::vector<float> x(100000, float(rank + 1));
        TensorView view{x.data(), DType::kF32, {static_cast<int64_t>(x.size())}};
        engine.allreduce("x", view, view, {ReduceOp::kSum});
        for (float v : x) {
          if (v != 10.0f) return "engine allreduce gave " + std::to_string(v) + ", expected 10";
        }
        const int set = engine.add_process_set({1, 3}).id();
        if (rank == 1 || rank == 3) {
          std::vector<float> y(1000, float(rank));
          TensorView yv{y.data(), DType::kF32, {static_cast<int64_t>(y.size())}};
          RequestOptions o;
          o.op = ReduceOp::kSum;
          o.process_set = set;
          engine.allreduce("y", yv, yv, o);
          if (y[999] != 4.0f) return "process set allreduce gave " + std::to_string(y[999]);
        }
        // The engine's shutdown is collective: every rank finishes its work first.
        std::vector<float> done(1);
        TensorView dv{done.data(), DType::kF32, {1}};
        engine.allreduce("done", dv, dv);
        return "";
      },
      nullptr, milliseconds(240000));
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_EQ(outcomes[rank].exit_code, 0) << "rank " << rank << ": " << outcomes[rank].result;
  }
}

// KOLO_HIERARCHICAL reaches the world communicator: "on" with uneven hosts
// (2 + 1) is every rank's error naming the counts.
TEST(HierarchicalRuntime, OnWithUnevenHostsIsEveryRanksError) {
  TempDir dir("kolo-hier-runtime");
  auto outcomes = run_forked_ranks(
      3,
      [&](int rank, SharedState&) -> std::string {
        try {
          Runtime runtime(launched_as(rank, {0, 0, 1}, dir.path(), {{"KOLO_HIERARCHICAL", "on"}}));
          return "init with KOLO_HIERARCHICAL=on and uneven hosts succeeded";
        } catch (const ContractError& error) {
          const std::string text = error.what();
          if (text.find("the 2 hosts have 2, 1") == std::string::npos) {
            return "unexpected message: " + text;
          }
        }
        return "";
      },
      nullptr, milliseconds(120000));
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(outcomes[rank].exit_code, 0) << "rank " << rank << ": " << outcomes[rank].result;
  }
}

}  // namespace
}  // namespace kolo

#endif  // KOLO_HAVE_GLOO

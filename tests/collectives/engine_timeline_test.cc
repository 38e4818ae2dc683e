// Engine with KOLO_TIMELINE: a known sequence of requests leaves a
// Chrome-trace file that parses and holds each tensor's phases in order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine_harness.h"
#include "kolo/core/engine.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

using testing::EngineWorld;
using testing::kEngineTimeout;
using testing::run_ranks;
using testing::Tensor;

nlohmann::json parse_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

// Row name -> the names of its begin events, in order.
std::map<std::string, std::vector<std::string>> phases_by_row(const nlohmann::json& trace) {
  const nlohmann::json& events = trace.is_array() ? trace : trace.at("traceEvents");
  std::map<int, std::string> row_names;
  for (const auto& e : events) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name") {
      row_names[e.at("tid").get<int>()] = e.at("args").at("name").get<std::string>();
    }
  }
  std::map<std::string, std::vector<std::string>> phases;
  for (const auto& e : events) {
    if (e.value("ph", "") != "B") continue;
    phases[row_names[e.at("tid").get<int>()]].push_back(e.at("name").get<std::string>());
  }
  return phases;
}

size_t count_marks(const nlohmann::json& trace, const std::string& label) {
  const nlohmann::json& events = trace.is_array() ? trace : trace.at("traceEvents");
  size_t count = 0;
  for (const auto& e : events) {
    if (e.value("ph", "") == "i" && e.value("name", "") == label) ++count;
  }
  return count;
}

class EngineTimeline : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kolo_engine_timeline_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!getenv("KEEP")) std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
};

// Rank 0 submits "late" before rank 1 does (it waits for the other ranks),
// then both submit two small allreduces (fused), an allgather and a
// broadcast, each rank writing its own file.
TEST_F(EngineTimeline, PhasesOfAKnownSequence) {
  constexpr int n = 2;
  EngineWorld world("threads", n);
  EngineOptions options = testing::test_engine_options();
  options.timeline_path = (dir_ / "trace.json").string();
  options.timeline_all_ranks = true;
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank, options);
    Tensor late({4}, 1);
    Handle late_handle;
    if (rank == 0) late_handle = engine->allreduce_async("late", late.view(), late.view());
    Tensor sync({1});
    engine->allreduce("sync", sync.view(), sync.view());  // rank 0's "late" waits meanwhile
    if (rank == 1) late_handle = engine->allreduce_async("late", late.view(), late.view());
    late_handle.wait(kEngineTimeout);

    Tensor a({8}, 1), b({8}, 2), rows({2, 2}, 3), gathered, c({3}, 4);
    std::vector<Handle> handles = {
        engine->allreduce_async("grad/a", a.view(), a.view()),
        engine->allreduce_async("grad/b", b.view(), b.view()),
        engine->allgather_async("rows", rows.view(), testing::allocate_into(gathered)),
    };
    for (auto& h : handles) h.wait(kEngineTimeout);
    engine->broadcast("bcast", c.view());
  });

  for (int rank = 0; rank < n; ++rank) {
    const std::string path = (dir_ / ("trace.rank" + std::to_string(rank) + ".json")).string();
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    const nlohmann::json trace = parse_file(path);
    const auto phases = phases_by_row(trace);
    EXPECT_GE(count_marks(trace, "CYCLE_START"), 3u);
    using V = std::vector<std::string>;
    // grad/a and grad/b were submitted together: fused unless a cycle
    // started between the two submits, in which case each runs alone.
    for (const char* name : {"grad/a", "grad/b"}) {
      const V& p = phases.at(name);
      ASSERT_GE(p.size(), 3u) << name;
      EXPECT_EQ(p.front(), "NEGOTIATE") << name;
      EXPECT_NE(std::find(p.begin(), p.end(), "QUEUE"), p.end()) << name;
      EXPECT_NE(std::find(p.begin(), p.end(), "ALLREDUCE"), p.end()) << name;
      const bool fused = std::find(p.begin(), p.end(), "MEMCPY_IN_FUSION_BUFFER") != p.end();
      if (fused) {
        EXPECT_EQ(p.back(), "MEMCPY_OUT_FUSION_BUFFER") << name;
      } else {
        EXPECT_EQ(p.back(), "ALLREDUCE") << name;
      }
    }
    EXPECT_EQ(phases.at("bcast").back(), "BROADCAST");
    EXPECT_EQ(phases.at("rows").back(), "ALLGATHER");
    if (rank == 0) {
      // Rank 0 waited for rank 1 to submit "late".
      EXPECT_EQ(phases.at("late"), (V{"NEGOTIATE", "WAIT_FOR_OTHER_RANKS", "QUEUE", "ALLREDUCE"}));
    }
  }
}

TEST_F(EngineTimeline, OnlyRankZeroWritesByDefault) {
  constexpr int n = 2;
  EngineWorld world("threads", n);
  EngineOptions options = testing::test_engine_options();
  options.timeline_path = (dir_ / "rank0.json").string();
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank, options);
    Tensor x({2}, 1);
    engine->allreduce("x", x.view(), x.view());
  });
  const auto phases = phases_by_row(parse_file(options.timeline_path));
  EXPECT_EQ(phases.at("x").front(), "NEGOTIATE");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_),
                          std::filesystem::directory_iterator{}),
            1);
}

}  // namespace
}  // namespace kolo

// Timeline: the Chrome-trace file parses and holds the recorded phases, rows
// and markers, after flush() alone (a process that dies without running
// destructors) and after destruction.
#include "engine/timeline.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo::detail {
namespace {

using Phase = TimelinePhase;

class TimelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kolo_timeline_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "trace.json").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  nlohmann::json parse() const {
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    return nlohmann::json::parse(text.str());  // throws (fails the test) if invalid
  }

  std::filesystem::path dir_;
  std::string path_;
};

// The engine's sequence for one fused allreduce of two tensors.
void record_step(Timeline& timeline) {
  timeline.mark("CYCLE_START", R"({"cycle":1})");
  for (const char* name : {"grad/a", "grad/b"}) timeline.begin(name, Phase::kNegotiate);
  timeline.begin("grad/a", Phase::kWaitForOtherRanks);
  timeline.end("grad/a", Phase::kWaitForOtherRanks);
  for (const char* name : {"grad/a", "grad/b"}) {
    timeline.end(name, Phase::kNegotiate);
    timeline.begin(name, Phase::kQueue);
  }
  for (const char* name : {"grad/a", "grad/b"}) {
    timeline.end(name, Phase::kQueue);
    timeline.begin(name, Phase::kMemcpyInFusionBuffer);
    timeline.end(name, Phase::kMemcpyInFusionBuffer);
  }
  for (const char* name : {"grad/a", "grad/b"})
    timeline.begin(name, Phase::kCollective, "ALLREDUCE");
  for (const char* name : {"grad/a", "grad/b"}) timeline.end(name, Phase::kCollective);
  for (const char* name : {"grad/a", "grad/b"}) {
    timeline.begin(name, Phase::kMemcpyOutFusionBuffer);
    timeline.end(name, Phase::kMemcpyOutFusionBuffer);
  }
}

// tid -> row name, from the thread_name metadata events.
std::map<int, std::string> row_names(const nlohmann::json& trace) {
  std::map<int, std::string> names;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name")
      names[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
  return names;
}

// "B:NAME" / "E:NAME" for the B/E events of one row, in file order.
std::vector<std::string> row_sequence(const nlohmann::json& trace, int tid) {
  std::vector<std::string> seq;
  for (const auto& e : trace["traceEvents"]) {
    if (!e.contains("tid") || e["tid"] != tid) continue;
    const std::string ph = e["ph"];
    if (ph == "B" || ph == "E") seq.push_back(ph + ":" + e["name"].get<std::string>());
  }
  return seq;
}

int tid_of(const std::map<int, std::string>& names, const std::string& name) {
  for (const auto& [tid, n] : names)
    if (n == name) return tid;
  return -1;
}

void expect_step_rows(const nlohmann::json& trace) {
  const auto names = row_names(trace);
  const int a = tid_of(names, "grad/a"), b = tid_of(names, "grad/b");
  ASSERT_GE(a, 1);
  ASSERT_GE(b, 1);
  EXPECT_NE(a, b);
  EXPECT_EQ(names.at(0), "engine");
  const std::vector<std::string> a_expected = {"B:NEGOTIATE",
                                               "B:WAIT_FOR_OTHER_RANKS",
                                               "E:WAIT_FOR_OTHER_RANKS",
                                               "E:NEGOTIATE",
                                               "B:QUEUE",
                                               "E:QUEUE",
                                               "B:MEMCPY_IN_FUSION_BUFFER",
                                               "E:MEMCPY_IN_FUSION_BUFFER",
                                               "B:ALLREDUCE",
                                               "E:ALLREDUCE",
                                               "B:MEMCPY_OUT_FUSION_BUFFER",
                                               "E:MEMCPY_OUT_FUSION_BUFFER"};
  EXPECT_EQ(row_sequence(trace, a), a_expected);
  std::vector<std::string> b_expected = a_expected;
  b_expected.erase(b_expected.begin() + 1, b_expected.begin() + 3);  // b never waited
  EXPECT_EQ(row_sequence(trace, b), b_expected);

  // Every event is on the rank's pid; timestamps are non-decreasing in file order.
  double last_ts = -1;
  int marks = 0;
  for (const auto& e : trace["traceEvents"]) {
    EXPECT_EQ(e["pid"], 3);
    if (!e.contains("ts")) continue;
    EXPECT_GE(e["ts"].get<double>(), last_ts);
    last_ts = e["ts"].get<double>();
    if (e["ph"] == "i") {
      ++marks;
      EXPECT_EQ(e["name"], "CYCLE_START");
      EXPECT_EQ(e["tid"], 0);
      EXPECT_EQ(e["args"]["cycle"], 1);
    }
  }
  EXPECT_EQ(marks, 1);
}

TEST_F(TimelineTest, KnownSequenceParsesAfterDestruction) {
  {
    Timeline timeline(path_, 3);
    record_step(timeline);
  }
  expect_step_rows(parse());
}

TEST_F(TimelineTest, ValidAfterFlushWithoutDestruction) {
  // The object is leaked on purpose, as if the process died after the flush:
  // what is on disk must already be a complete trace.
  auto* timeline = new Timeline(path_, 3);
  EXPECT_TRUE(parse()["traceEvents"].is_array());  // valid before any event
  record_step(*timeline);
  timeline->flush();
  expect_step_rows(parse());
  // More events and another flush: still valid, and the earlier events remain.
  timeline->mark("CYCLE_START", R"({"cycle":2})");
  timeline->flush();
  auto count_marks = [this] {
    const nlohmann::json trace = parse();
    int marks = 0;
    for (const auto& e : trace["traceEvents"]) marks += e["ph"] == "i";
    return marks;
  };
  EXPECT_EQ(count_marks(), 2);
  delete timeline;
  EXPECT_EQ(count_marks(), 2);
}

TEST_F(TimelineTest, ValidAfterTheProcessDiesWithoutDestructors) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(20);  // never outlive the test
    try {
      auto* timeline = new Timeline(path_, 3);
      record_step(*timeline);
      timeline->flush();
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(7);  // no destructors, no atexit handlers
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 7);
  expect_step_rows(parse());
}

TEST_F(TimelineTest, OutOfOrderEndsStayNestedAndStrayEndsAreDropped) {
  {
    Timeline timeline(path_, 3);
    timeline.end("t", Phase::kQueue);  // never begun: dropped
    timeline.begin("t", Phase::kNegotiate);
    timeline.begin("t", Phase::kWaitForOtherRanks);
    timeline.end("t", Phase::kNegotiate);          // closes WAIT first
    timeline.end("t", Phase::kWaitForOtherRanks);  // already closed: dropped
  }
  const auto trace = parse();
  const int t = tid_of(row_names(trace), "t");
  EXPECT_EQ(row_sequence(trace, t),
            (std::vector<std::string>{"B:NEGOTIATE", "B:WAIT_FOR_OTHER_RANKS",
                                      "E:WAIT_FOR_OTHER_RANKS", "E:NEGOTIATE"}));
}

TEST_F(TimelineTest, NamesNeedingEscapesAndBadArgsStayValid) {
  const std::string odd = "layer\"1\"\\weight\n\ttab";
  {
    Timeline timeline(path_, 3);
    timeline.begin(odd, Phase::kCollective, "BROADCAST");
    timeline.end(odd, Phase::kCollective);
    timeline.mark("CYCLE_START", "not json {");
  }
  const auto trace = parse();
  const int t = tid_of(row_names(trace), odd);
  ASSERT_GE(t, 1);
  EXPECT_EQ(row_sequence(trace, t), (std::vector<std::string>{"B:BROADCAST", "E:BROADCAST"}));
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "i") {
      EXPECT_EQ(e["args"]["text"], "not json {");
    }
  }
}

TEST_F(TimelineTest, ManyEventsFromSeveralThreads) {
  constexpr int kThreads = 4, kTensors = 50, kSteps = 40;
  {
    Timeline timeline(path_, 3);
    std::vector<std::thread> threads;
    for (int th = 0; th < kThreads; ++th) {
      threads.emplace_back([&timeline, th] {
        for (int step = 0; step < kSteps; ++step) {
          for (int i = 0; i < kTensors; ++i) {
            const std::string name = "t" + std::to_string(th) + "/" + std::to_string(i);
            timeline.begin(name, Phase::kCollective, "ALLGATHER");
            timeline.end(name, Phase::kCollective);
          }
          if (th == 0) timeline.mark("CYCLE_START");
        }
      });
    }
    for (auto& thread : threads) thread.join();
  }
  const auto trace = parse();
  EXPECT_EQ(row_names(trace).size(), 1u + kThreads * kTensors);
  int begins = 0, ends = 0;
  for (const auto& e : trace["traceEvents"]) {
    begins += e["ph"] == "B";
    ends += e["ph"] == "E";
  }
  EXPECT_EQ(begins, kThreads * kTensors * kSteps);
  EXPECT_EQ(ends, begins);
}

TEST_F(TimelineTest, UnwritablePathIsAContractErrorNamingIt) {
  const std::string bad = (dir_ / "no_such_dir" / "trace.json").string();
  try {
    Timeline timeline(bad, 0);
    FAIL() << "expected ContractError";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("KOLO_TIMELINE"), std::string::npos) << e.what();
  }
}

TEST(TimelinePhaseName, NamesEveryPhase) {
  EXPECT_STREQ(timeline_phase_name(Phase::kNegotiate), "NEGOTIATE");
  EXPECT_STREQ(timeline_phase_name(Phase::kWaitForOtherRanks), "WAIT_FOR_OTHER_RANKS");
  EXPECT_STREQ(timeline_phase_name(Phase::kQueue), "QUEUE");
  EXPECT_STREQ(timeline_phase_name(Phase::kMemcpyInFusionBuffer), "MEMCPY_IN_FUSION_BUFFER");
  EXPECT_STREQ(timeline_phase_name(Phase::kMemcpyOutFusionBuffer), "MEMCPY_OUT_FUSION_BUFFER");
}

}  // namespace
}  // namespace kolo::detail

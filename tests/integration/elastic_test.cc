// Elastic mode through kolorun (docs/elastic.md), with the core-only
// elastic_worker: a killed worker, a member lost between a round's publication
// and its init, a worker added by host discovery, too few
// survivors (horovod#3494), --max-restarts, a failing host set aside, and a
// connection without the job's secret. Every run is bounded by the harness's
// watchdog; hosts are local aliases (127.0.0.x) from discovery scripts.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "kolorun_harness.h"
#include "temp_dir.h"

namespace kolo::kolorun_test {
namespace {

using kolo::testing::TempDir;
using std::chrono::seconds;

constexpr int kEpochs = 4;
constexpr int kSamples = 96;
constexpr int kBatch = 12;
constexpr int kCommitEvery = 3;
constexpr int kStepsPerEpoch = kSamples / kBatch;

// A discovery script printing the contents of `hosts_file`.
std::string discovery_script(const std::string& dir, const std::string& hosts_file) {
  const std::string path = dir + "/discover.sh";
  std::ofstream(path) << "#!/bin/sh\ncat " << hosts_file << "\n";
  chmod(path.c_str(), 0755);
  return path;
}

std::vector<std::string> worker_args(const std::string& journal, int step_ms = 25) {
  return {worker_path("elastic_worker"),
          "--epochs",
          std::to_string(kEpochs),
          "--samples",
          std::to_string(kSamples),
          "--batch",
          std::to_string(kBatch),
          "--commit-every",
          std::to_string(kCommitEvery),
          "--step-ms",
          std::to_string(step_ms),
          "--journal",
          journal};
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<double> final_w(const std::string& out) {
  const size_t at = out.find("final_w=");
  if (at == std::string::npos) return {};
  std::istringstream in(out.substr(at + 8, out.find('\n', at) - at - 8));
  std::vector<double> w;
  for (std::string item; std::getline(in, item, ',');) w.push_back(std::stod(item));
  return w;
}

struct Step {
  int64_t epoch, batch, round, size, rank;
  std::vector<int> samples;
};
struct Journal {
  std::vector<int> pids;
  std::vector<Step> steps;
  std::vector<Step> starts;  // samples empty
  bool done = false;
};

std::map<int, Journal> read_journals(const std::string& dir) {
  std::map<int, Journal> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename();
    if (name.rfind("worker", 0) != 0) continue;
    const int id = std::stoi(name.substr(6));
    Journal& j = out[id];
    std::ifstream file(entry.path());
    for (std::string line; std::getline(file, line);) {
      std::istringstream in(line);
      std::string kind;
      in >> kind;
      if (kind == "pid") {
        int pid = 0;
        in >> pid;
        j.pids.push_back(pid);
      } else if (kind == "step" || kind == "start") {
        Step s{};
        in >> s.epoch >> s.batch >> s.round >> s.size >> s.rank;
        std::string list;
        in >> list;
        std::istringstream items(list);
        for (std::string item; std::getline(items, item, ',');)
          s.samples.push_back(std::stoi(item));
        (kind == "step" ? j.steps : j.starts).push_back(s);
      } else if (kind == "done") {
        j.done = true;
      }
    }
  }
  return out;
}

// The reference model: a fault-free run of 2 workers without elastic mode
// (the worker's data path does not depend on the world size).
const std::vector<double>& reference_w() {
  static const std::vector<double> w = [] {
    const TempDir temp("kolo-elastic");
    const std::string& dir = temp.path();
    RunResult r = run_kolorun(concat({"-np", "2"}, worker_args(dir, 0)), seconds(60));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return final_w(r.out);
  }();
  return w;
}

void expect_matches_reference(const RunResult& r) {
  const std::vector<double> w = final_w(r.out);
  const std::vector<double>& ref = reference_w();
  ASSERT_EQ(w.size(), ref.size()) << r.out << r.err;
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], ref[i], 1e-9) << "w[" << i << "]";
}

// Every sample of every epoch was processed; within one execution of a step
// (a round in which every rank logged it) no sample twice; and steps done
// again after a re-formation are at most --commit-every per re-formation (the
// steps since the last commit, including the one in flight).
void expect_sample_accounting(const std::map<int, Journal>& journals, int reformations) {
  std::map<int64_t, std::set<int>> per_epoch;
  // (epoch, batch) -> round -> (ranks that logged it, samples)
  std::map<std::pair<int64_t, int64_t>, std::map<int64_t, std::pair<int, std::vector<int>>>> runs;
  std::map<std::pair<int64_t, int64_t>, int64_t> size_of;
  for (const auto& [id, j] : journals) {
    for (const auto& s : j.steps) {
      per_epoch[s.epoch].insert(s.samples.begin(), s.samples.end());
      auto& run = runs[{s.epoch, s.batch}][s.round];
      run.first += 1;
      run.second.insert(run.second.end(), s.samples.begin(), s.samples.end());
      size_of[{s.epoch, s.batch}] = s.size;
    }
  }
  ASSERT_EQ(per_epoch.size(), static_cast<size_t>(kEpochs));
  for (const auto& [epoch, samples] : per_epoch) {
    EXPECT_EQ(samples.size(), static_cast<size_t>(kSamples)) << "epoch " << epoch;
  }
  EXPECT_EQ(runs.size(), static_cast<size_t>(kEpochs * kStepsPerEpoch));
  int repeated = 0;
  for (const auto& [step, rounds] : runs) {
    repeated += static_cast<int>(rounds.size()) - 1;
    for (const auto& [round, run] : rounds) {
      std::set<int> distinct(run.second.begin(), run.second.end());
      EXPECT_EQ(distinct.size(), run.second.size())
          << "a sample twice in step " << step.first << "/" << step.second << " of round " << round;
    }
  }
  EXPECT_LE(repeated, kCommitEvery * reformations);
}

void expect_all_gone(const std::map<int, Journal>& journals) {
  for (const auto& [id, j] : journals) {
    for (int pid : j.pids) {
      EXPECT_TRUE(wait_gone(pid, seconds(5)))
          << "worker " << id << " (pid " << pid << ") outlived kolorun";
    }
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Elastic, KillOneOfThreeWorkersTrainingCompletes) {
  const TempDir temp("kolo-elastic");
  const std::string& dir = temp.path();
  // Worker 2 SIGKILLs itself before global step 10 (epoch 1, mid-epoch); the
  // long cooldown keeps its slot empty, so the world goes on with 2.
  RunResult r = run_kolorun(concat({"-np", "3", "--min-np", "2", "--cooldown", "60"},
                                   concat(worker_args(dir), {"--kill", "2@10"})),
                            seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "round 1: 3 workers")) << r.err;
  EXPECT_TRUE(contains(r.err, "worker 2 (pid ")) << r.err;
  EXPECT_TRUE(contains(r.err, "killed by signal 9")) << r.err;
  EXPECT_TRUE(contains(r.err, "round 2: 2 workers (ids 0,1)")) << r.err;
  expect_matches_reference(r);
  auto journals = read_journals(dir);
  ASSERT_EQ(journals.size(), 3u);
  EXPECT_FALSE(journals[2].done);
  EXPECT_TRUE(journals[0].done && journals[1].done);
  // The survivors restarted from a commit and finished in a world of 2.
  ASSERT_GE(journals[0].starts.size(), 2u);
  EXPECT_EQ(journals[0].starts.back().size, 2);
  EXPECT_EQ(journals[0].steps.back().size, 2);
  expect_sample_accounting(journals, 1);
  expect_all_gone(journals);
}

// The same with kolo::elastic::init() before run() (Horovod's hvd.init() at
// the top of an elastic script): run() trains in the round init() joined, and
// the survivors re-form as before.
TEST(Elastic, KillOneOfThreeAfterInitBeforeRunTrainingCompletes) {
  const TempDir temp("kolo-elastic");
  const std::string& dir = temp.path();
  RunResult r =
      run_kolorun(concat({"-np", "3", "--min-np", "2", "--cooldown", "60"},
                         concat(worker_args(dir), {"--kill", "2@10", "--init-first", "1"})),
                  seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "round 2: 2 workers (ids 0,1)")) << r.err;
  expect_matches_reference(r);
  auto journals = read_journals(dir);
  ASSERT_EQ(journals.size(), 3u);
  // Round 1 was joined once, by init(): every survivor started training in it.
  EXPECT_EQ(journals[0].starts.front().round, 1);
  EXPECT_EQ(journals[0].starts.back().size, 2);
  expect_sample_accounting(journals, 1);
  expect_all_gone(journals);
}

// A member that dies after kolorun published a round and before it built the
// round's communicators (docs/elastic.md, "A member lost between rounds"):
// kolorun marks the round failed, and the members waiting for the dead one in
// the store give up at once instead of after --timeout (600 s here, far
// beyond --job-timeout); the next round finishes the training.
TEST(Elastic, AMemberLostBeforeItsInitDoesNotStallTheOthers) {
  const TempDir temp("kolo-elastic");
  const std::string& dir = temp.path();
  // Worker 1 dies at step 5: round 2 is ids 0,2,3; worker 2 dies on joining it.
  RunResult r =
      run_kolorun(concat({"-np", "4", "--min-np", "2", "--cooldown", "60", "--timeout", "600",
                          "--job-timeout", "45"},
                         concat(worker_args(dir), {"--kill", "1@5", "--die-on-join", "2@2"})),
                  seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "round 2: 3 workers (ids 0,2,3)")) << r.err;
  EXPECT_TRUE(contains(r.err, "round 3: 2 workers (ids 0,3)")) << r.err;
  expect_matches_reference(r);
  auto journals = read_journals(dir);
  ASSERT_EQ(journals.size(), 4u);
  EXPECT_TRUE(journals[0].done && journals[3].done);
  // Nobody trained in round 2.
  for (const auto& [id, j] : journals) {
    for (const auto& s : j.starts) EXPECT_NE(s.round, 2) << "worker " << id;
  }
  expect_sample_accounting(journals, 1);
  expect_all_gone(journals);
}

TEST(Elastic, AWorkerOfferedByDiscoveryJoinsAtACommit) {
  const TempDir temp("kolo-elastic");
  const std::string& dir = temp.path();
  const std::string hosts = dir + "/hosts";
  std::ofstream(hosts) << "localhost:2\n";
  // Rank 0 offers a third slot before global step 6.
  RunResult r =
      run_kolorun(concat({"--host-discovery-script", discovery_script(dir, hosts),
                          "--discovery-interval", "0.05", "--min-np", "2", "--max-np", "3"},
                         concat(worker_args(dir, 40), {"--grow", hosts + "@6@localhost:3"})),
                  seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "round 1: 2 workers")) << r.err;
  EXPECT_TRUE(contains(r.err, "round 2: 3 workers (ids 0,1,2); workers joining")) << r.err;
  expect_matches_reference(r);
  auto journals = read_journals(dir);
  ASSERT_EQ(journals.size(), 3u);
  // The newcomer started from the state it received (past step 6), as rank 2
  // of 3, and finished with the others.
  ASSERT_FALSE(journals[2].starts.empty());
  const Step& first = journals[2].starts.front();
  EXPECT_EQ(first.size, 3);
  EXPECT_EQ(first.rank, 2);
  EXPECT_GE(first.epoch * kStepsPerEpoch + first.batch, 6);
  EXPECT_TRUE(journals[2].done);
  // A growth costs no repeated step: the state was committed just before.
  expect_sample_accounting(journals, 0);
}

TEST(Elastic, TooFewSurvivorsStopTheJobWithAClearError) {
  const TempDir temp("kolo-elastic");
  const std::string& dir = temp.path();
  RunResult r = run_kolorun(concat({"-np", "2", "--min-np", "2", "--cooldown", "60",
                                    "--elastic-timeout", "1", "--grace", "1"},
                                   concat(worker_args(dir), {"--kill", "1@5"})),
                            seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "1 worker left, 2 needed (--min-np); waiting up to 1 s")) << r.err;
  const auto lines = r.err_lines();
  ASSERT_FALSE(lines.empty());
  EXPECT_TRUE(contains(lines.back(), "too few workers to continue: 2 needed (--min-np 2), 1 left"))
      << lines.back();
  EXPECT_TRUE(contains(lines.back(), "worker 1 (pid ")) << lines.back();
  auto journals = read_journals(dir);
  EXPECT_FALSE(journals[0].done);
  expect_all_gone(journals);
}

TEST(Elastic, MaxRestartsIsHonoured) {
  const TempDir temp("kolo-elastic");
  const std::string& dir = temp.path();
  RunResult r = run_kolorun(concat({"-np", "3", "--min-np", "1", "--max-restarts", "1",
                                    "--cooldown", "60", "--grace", "1"},
                                   concat(worker_args(dir), {"--kill", "1@4", "--kill", "2@12"})),
                            seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + 9) << r.err;
  EXPECT_TRUE(contains(r.err, "(restart 1 of 1)")) << r.err;
  const auto lines = r.err_lines();
  ASSERT_FALSE(lines.empty());
  EXPECT_TRUE(contains(lines.back(), "worker 2 (pid ")) << lines.back();
  EXPECT_TRUE(contains(lines.back(), "re-formed 1 time after failures (--max-restarts 1)"))
      << lines.back();
  expect_all_gone(read_journals(dir));
}

TEST(Elastic, AHostWhoseWorkersKeepFailingIsSetAsideWithAGrowingCooldown) {
  const TempDir temp("kolo-elastic");
  const std::string& dir = temp.path();
  const std::string hosts = dir + "/hosts";
  std::ofstream(hosts) << "127.0.0.1:2\n127.0.0.2:1\n";
  RunResult r = run_kolorun(
      concat({"--host-discovery-script", discovery_script(dir, hosts), "--discovery-interval",
              "0.05", "--min-np", "2", "--max-np", "3", "--cooldown", "0.1"},
             concat(worker_args(dir, 40), {"--fail-on-host", "127.0.0.2"})),
      seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "before joining; host 127.0.0.2 set aside for 0.1 s (failure 1)"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "host 127.0.0.2 set aside for 0.2 s (failure 2)")) << r.err;
  EXPECT_TRUE(contains(r.err, "host 127.0.0.2 set aside for 0.4 s (failure 3)")) << r.err;
  EXPECT_FALSE(contains(r.err, "restart 1")) << "failed starts are not restarts: " << r.err;
  expect_matches_reference(r);
}

// A program that fails before it reaches the rendezvous, on every host: the
// job fails once more workers than --max-restarts failed with none joined,
// with the last one's status, not after --elastic-timeout (600 s here).
TEST(Elastic, EveryWorkerFailingBeforeJoiningFailsTheJobAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  RunResult r = run_kolorun({"-np", "2", "--min-np", "2", "--max-restarts", "2", "--cooldown",
                             "0.05", "--elastic-timeout", "600", "sh", "-c", "exit 3"},
                            seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  const auto lines = r.err_lines();
  ASSERT_FALSE(lines.empty());
  // 3 or 4 starts: both slots restart together after their cooldown.
  EXPECT_TRUE(contains(lines.back(), "every worker failed before joining (")) << lines.back();
  EXPECT_TRUE(contains(lines.back(), " starts, more than --max-restarts 2)")) << lines.back();
  EXPECT_TRUE(contains(lines.back(), "exited with code 3")) << lines.back();
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(30));
}

// kolorun escalates in elastic mode too: worker 2 ignores SIGTERM, stops
// itself and never joins; round 1 forms with the other two after
// --elastic-timeout, they finish, and kolorun SIGKILLs worker 2 after --grace
// instead of waiting for it forever.
TEST(Elastic, AStuckWorkerOutsideTheWorldIsKilledAfterTheGraceWhenTrainingEnds) {
  const TempDir temp("kolo-elastic");
  const std::string& dir = temp.path();
  RunResult r =
      run_kolorun(concat({"-np", "3", "--min-np", "2", "--elastic-timeout", "2", "--grace", "1"},
                         concat(worker_args(dir, 0), {"--stuck-before-join", "2"})),
                  seconds(60));
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "round 1: 2 workers (ids 0,1)")) << r.err;
  expect_matches_reference(r);
  expect_all_gone(read_journals(dir));
}

// A frozen member (SIGSTOP): the others' collective times out (--timeout 2)
// naming it; kolorun evicts it (SIGKILL), counts a restart, sets its host
// aside and re-forms without it. Before, every timeout re-formed a round that
// again included the stopped worker, forever.
TEST(Elastic, AStoppedMemberIsEvictedAndTheWorldReformsWithoutIt) {
  const TempDir temp("kolo-elastic");
  const std::string& dir = temp.path();
  RunResult r = run_kolorun(
      concat({"-np", "3", "--min-np", "2", "--timeout", "2", "--cooldown", "60", "--grace", "1"},
             concat(worker_args(dir), {"--stop-at", "2@10"})),
      seconds(90));
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "did not take part in round 1 after it failed")) << r.err;
  EXPECT_TRUE(contains(r.err, "evicted (SIGKILL) (restart 1 of 3); host localhost set aside"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "round 2: 2 workers (ids 0,1)")) << r.err;
  EXPECT_FALSE(contains(r.err, "round 3")) << r.err;
  expect_matches_reference(r);
  auto journals = read_journals(dir);
  expect_sample_accounting(journals, 1);
  expect_all_gone(journals);
}

// A member stuck in a system call (pause()), with --max-restarts 0: its
// eviction is a failure like a death, so the job stops and says why.
TEST(Elastic, AnEvictionCountsAgainstMaxRestarts) {
  const TempDir temp("kolo-elastic");
  const std::string& dir = temp.path();
  RunResult r = run_kolorun(
      concat({"-np", "3", "--min-np", "2", "--timeout", "2", "--max-restarts", "0", "--grace", "1"},
             concat(worker_args(dir), {"--hang-at", "1@10"})),
      seconds(90));
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto lines = r.err_lines();
  ASSERT_FALSE(lines.empty());
  EXPECT_TRUE(contains(lines.back(), "worker 1 (pid ")) << lines.back();
  EXPECT_TRUE(contains(lines.back(), "evicted (SIGKILL)")) << lines.back();
  EXPECT_TRUE(contains(lines.back(), "re-formed 0 times after failures (--max-restarts 0)"))
      << lines.back();
  expect_all_gone(read_journals(dir));
}

TEST(Elastic, AConnectionWithoutTheSecretIsRejectedAndTrainingIsUnaffected) {
  const TempDir temp("kolo-elastic");
  const std::string& dir = temp.path();
  RunResult r = run_kolorun(
      concat({"-np", "2", "--min-np", "2"}, concat(worker_args(dir), {"--rogue-at", "5"})),
      seconds(60));
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "rogue_unsigned=rejected rogue_wrong_secret=refused")) << r.out;
  EXPECT_TRUE(
      contains(r.err, "kolorun: elastic: rendezvous: rejected a connection from 127.0.0.1:"))
      << r.err;
  // The forged "elastic/latest" never landed: one round, no re-formation.
  EXPECT_FALSE(contains(r.err, "round 2")) << r.err;
  expect_matches_reference(r);
}

}  // namespace
}  // namespace kolo::kolorun_test

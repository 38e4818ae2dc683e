// Elastic pieces that need no processes: the round text kolorun publishes,
// State commit/restore (memory and file), the discovery script's output and
// the host cooldown.
#include "kolo/core/elastic.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "elastic/state_access.h"
#include "elastic_hosts.h"
#include "kolo/core/checked_file.h"
#include "temp_dir.h"

namespace kolo {
namespace {

using elastic::Membership;

const std::string kRound =
    "kolo-round 7 4\n"
    "12 local localhost\n"
    "3 nodeb nodeb\n"
    "5 local 127.0.0.2\n"
    "9 nodeb nodeb\n";

TEST(ElasticMembership, PlacementFollowsMachinesInRankOrder) {
  Membership m = Membership::parse(kRound, 5);
  EXPECT_EQ(m.round, 7);
  EXPECT_EQ(m.size, 4);
  EXPECT_EQ(m.rank, 2);
  EXPECT_EQ(m.local_rank, 1);  // second rank on the local machine (two aliases, one machine)
  EXPECT_EQ(m.local_size, 2);
  EXPECT_EQ(m.cross_rank, 0);
  EXPECT_EQ(m.cross_size, 2);
  EXPECT_EQ(m.worker_ids, (std::vector<int64_t>{12, 3, 5, 9}));
  Membership b = Membership::parse(kRound, 9);
  EXPECT_EQ(b.rank, 3);
  EXPECT_EQ(b.local_rank, 1);
  EXPECT_EQ(b.cross_rank, 1);
  EXPECT_TRUE(Membership::contains(kRound, 3));
  EXPECT_FALSE(Membership::contains(kRound, 4));
  EXPECT_THROW(Membership::parse(kRound, 4), ContractError);
}

TEST(ElasticMembership, MalformedRoundsAreFaults) {
  EXPECT_THROW(Membership::parse("nonsense", 1), RuntimeFault);
  EXPECT_THROW(Membership::parse("kolo-round 1 3\n1 local a\n", 1), RuntimeFault);
}

TEST(ElasticState, CommitRestoreAndFile) {
  const testing::TempDir dir("kolo-state");
  const std::string path = dir.file("commit.bin");
  double w[3] = {1, 2, 3};
  int64_t seen = 5;
  elastic::BufferState state(elastic::State::Options{path});
  state.add("w", w, sizeof(w));
  state.add("seen", &seen, sizeof(seen));
  EXPECT_THROW(state.add("w", w, sizeof(w)), ContractError);
  state.restore();  // nothing committed yet: no change
  EXPECT_EQ(w[0], 1);
  state.epoch = 2;
  state.batch = 7;
  state.commit();
  EXPECT_EQ(state.commit_count(), 1);
  w[0] = 100;
  seen = 9;
  state.epoch = 3;
  state.batch = 1;
  state.restore();
  EXPECT_EQ(w[0], 1);
  EXPECT_EQ(seen, 5);
  EXPECT_EQ(state.epoch, 2);
  EXPECT_EQ(state.batch, 7);
  // The file holds the commit: a fresh state resumes from it.
  double w2[3] = {0, 0, 0};
  int64_t seen2 = 0;
  elastic::BufferState resumed;
  resumed.add("w", w2, sizeof(w2));
  resumed.add("seen", &seen2, sizeof(seen2));
  resumed.load_commit_file(path);
  EXPECT_EQ(w2[2], 3);
  EXPECT_EQ(seen2, 5);
  EXPECT_EQ(resumed.epoch, 2);
  EXPECT_EQ(resumed.batch, 7);
  EXPECT_EQ(resumed.committed(), state.committed());
  // Reset callbacks run in order.
  std::string calls;
  state.on_reset([&] { calls += "a"; });
  state.on_reset([&] { calls += "b"; });
  detail::ElasticStateAccess::run_reset_callbacks(state);  // as run() does
  EXPECT_EQ(calls, "ab");
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string read_all(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Issue 15: a flipped byte in elastic.commit used to load silently (training
// went on from damaged weights) and a truncated one failed without naming the
// file. Now the commit file has a format version and a checksum, and every
// kind of damage is an error naming the file; the state is left untouched.
TEST(ElasticState, ADamagedCommitFileIsAnErrorNamingIt) {
  const testing::TempDir dir("kolo-state");
  const std::string path = dir.file("elastic.commit");
  double w[4] = {1, 2, 3, 4};
  elastic::BufferState state(elastic::State::Options{path});
  state.add("w", w, sizeof(w));
  state.epoch = 3;
  state.commit();
  const std::string good = read_all(path);

  auto expect_rejected = [&](const std::string& bytes, const std::string& what) {
    write_all(path, bytes);
    double target[4] = {0, 0, 0, 0};
    elastic::BufferState fresh;
    fresh.add("w", target, sizeof(target));
    try {
      fresh.load_commit_file(path);
      ADD_FAILURE() << "loaded a damaged commit (" << what << ")";
    } catch (const ContractError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("kolo elastic commit '" + path + "'"), std::string::npos) << message;
      EXPECT_NE(message.find(what), std::string::npos) << message;
    }
    EXPECT_EQ(target[3], 0);
    EXPECT_EQ(fresh.epoch, 0);
  };
  for (size_t at : {size_t{40}, good.size() / 2, good.size() - 1}) {
    std::string flipped = good;
    flipped[at] ^= 0x01;
    expect_rejected(flipped, "checksum mismatch");
  }
  expect_rejected(good.substr(0, good.size() - 5), "truncated");
  expect_rejected(good.substr(0, 10), "truncated");
  // A commit written before the container (raw state bytes), or another kind of kolo file.
  expect_rejected(good.substr(32), "not a kolo elastic commit");
  expect_rejected(encode_checked(kCheckpointFile, good.substr(32)), "bad magic");
  // A payload of a newer commit format.
  std::string newer = good.substr(32);
  newer[0] = 9;
  expect_rejected(encode_checked(kElasticCommitFile, newer), "commit format 9 is not supported");
  // Buffers of another state.
  float other[2] = {0, 0};
  elastic::BufferState mismatched;
  mismatched.add("other", other, sizeof(other));
  write_all(path, good);
  EXPECT_NE(error_of([&] { mismatched.load_commit_file(path); }).find("does not fit this state"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { mismatched.load_commit_file(dir.file("missing")); }).find("does not exist"),
      std::string::npos);
}

TEST(ElasticState, ACommitOfDifferentBuffersIsAContractError) {
  double a[2] = {1, 2};
  elastic::BufferState one;
  one.add("a", a, sizeof(a));
  one.epoch = 4;
  one.commit();
  double c[2] = {0, 0};
  elastic::BufferState same;
  same.add("a", c, sizeof(c));
  same.load_commit(one.committed());
  EXPECT_EQ(c[1], 2);
  EXPECT_EQ(same.epoch, 4);
  float b[2] = {0, 0};
  elastic::BufferState other;
  other.add("b", b, sizeof(b));
  try {
    other.load_commit(one.committed());
    FAIL() << "expected a ContractError";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("buffer 'a' (16 bytes) where this rank registered 'b'"),
              std::string::npos)
        << e.what();
  }
}

TEST(ElasticRun, OutsideElasticModeRunIsInitAndTrain) {
  elastic::BufferState state;
  int calls = 0;
  InitOptions options;
  options.env = map_env({});
  elastic::RunOptions run_options;
  run_options.init = options;
  elastic::run(
      state, [&] { ++calls; }, run_options);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(is_initialized());
  EXPECT_EQ(size(), 1);
  shutdown();
}

TEST(ElasticRendezvous, OptionsNeedKolorunsVariables) {
  EXPECT_FALSE(elastic::Rendezvous::enabled(map_env({})));
  EXPECT_TRUE(elastic::Rendezvous::enabled(map_env({{"KOLO_ELASTIC", "1"}})));
  try {
    elastic::Rendezvous::from_env(map_env({{"KOLO_ELASTIC", "1"}}));
    FAIL() << "expected a ContractError";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("KOLO_STORE_ADDR is not set"), std::string::npos)
        << e.what();
  }
}

}  // namespace

namespace launcher {
namespace {

TEST(ElasticHosts, DiscoveryOutputIsParsedStrictly) {
  auto hosts = parse_discovery_output("# comment\nnode1:4\n\n  node2  \n127.0.0.2:1\n");
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].name, "node1");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[1].name, "node2");
  EXPECT_EQ(hosts[1].slots, 1);
  EXPECT_EQ(hosts[2].name, "127.0.0.2");
  EXPECT_THROW(parse_discovery_output("node1:0\n"), std::runtime_error);
  EXPECT_THROW(parse_discovery_output("node1:x\n"), std::runtime_error);
  EXPECT_THROW(parse_discovery_output("a:1\na:2\n"), std::runtime_error);
  try {
    parse_discovery_output("good:1\nbad:-1\n");
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2 'bad:-1'"), std::string::npos) << e.what();
  }
}

TEST(ElasticHosts, DiscoveryScriptRunsAndItsFailuresAreNamed) {
  const testing::TempDir dir("kolo-discovery");
  const std::string good = dir.file("good.sh"), bad = dir.file("bad.sh");
  std::ofstream(good) << "#!/bin/sh\necho a:2\necho b\n";
  std::ofstream(bad) << "#!/bin/sh\necho 'no hosts today' >&2\nexit 3\n";
  chmod(good.c_str(), 0755);
  chmod(bad.c_str(), 0755);
  auto hosts = run_discovery_script(good, std::chrono::seconds(10));
  ASSERT_EQ(hosts.size(), 2u);
  EXPECT_EQ(hosts[0].slots, 2);
  try {
    run_discovery_script(bad, std::chrono::seconds(10));
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("exited with code 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no hosts today"), std::string::npos) << e.what();
  }
}

TEST(ElasticHosts, CooldownDoublesPerFailureAndEnds) {
  using Clock = HostCooldown::Clock;
  HostCooldown cooldown(2.0);
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(cooldown.available("a", t0));
  EXPECT_DOUBLE_EQ(cooldown.record_failure("a", t0), 2.0);
  EXPECT_FALSE(cooldown.available("a", t0 + std::chrono::seconds(1)));
  EXPECT_TRUE(cooldown.available("a", t0 + std::chrono::seconds(2)));
  EXPECT_DOUBLE_EQ(cooldown.record_failure("a", t0), 4.0);
  EXPECT_DOUBLE_EQ(cooldown.record_failure("a", t0), 8.0);
  EXPECT_EQ(cooldown.failures("a"), 3);
  EXPECT_TRUE(cooldown.available("b", t0));
  for (int i = 0; i < 20; ++i) cooldown.record_failure("a", t0);
  EXPECT_DOUBLE_EQ(cooldown.record_failure("a", t0), kMaxCooldownSeconds);
  Clock::time_point when;
  ASSERT_TRUE(cooldown.next_release(t0, &when));
  EXPECT_GT(when, t0);
}

}  // namespace
}  // namespace launcher
}  // namespace kolo

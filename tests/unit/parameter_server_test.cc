// The parameter server's shape (kolo/core/parameter_server.h): roles, the
// partition by bytes and the models' fingerprint. Its messages and clocks:
// tests/torch_internal/ps_protocol_test.cc.
#include "kolo/core/parameter_server.h"

#include <gtest/gtest.h>

#include <climits>
#include <map>
#include <string>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo::ps {
namespace {

Config config_with(const std::map<std::string, std::string>& env) {
  return Config::load(map_env(env));
}

TEST(PsRoles, LastRanksServe) {
  Topology t;
  t.size = 5;
  t.rank = 3;
  Roles roles = roles_from(t, config_with({{"KOLO_PS_SERVERS", "2"}}));
  EXPECT_EQ(roles.workers, 3);
  EXPECT_TRUE(roles.is_server());
  EXPECT_EQ(roles.server_index(), 0);
  EXPECT_EQ(roles.server_rank(1), 4);
  t.rank = 2;
  EXPECT_FALSE(roles_from(t, config_with({{"KOLO_PS_SERVERS", "2"}})).is_server());
}

TEST(PsRoles, NoServersOrNoWorkersIsAClearError) {
  Topology t;
  t.size = 2;
  try {
    roles_from(t, config_with({}));
    FAIL() << "no servers accepted";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("--servers"), std::string::npos) << e.what();
  }
  EXPECT_THROW(roles_from(t, config_with({{"KOLO_PS_SERVERS", "2"}})), ContractError);
  EXPECT_THROW(config_with({{"KOLO_PS_SERVERS", "-1"}}), ContractError);
}

// Every element lands on exactly one server, in order, and the servers' bytes
// differ by less than one element's size.
TEST(PsPartition, CoversEveryElementOnceWithEqualBytes) {
  const std::vector<VariableSpec> specs = {{"a", {7, 3}, DType::kF32},
                                           {"b", {5}, DType::kF32},
                                           {"c", {2, 2, 2}, DType::kF64},
                                           {"d", {1}, DType::kF32}};
  for (int servers : {1, 2, 3, 5, 40}) {
    const Partition p = Partition::by_bytes(specs, servers);
    ASSERT_EQ(p.slices.size(), static_cast<size_t>(servers));
    std::vector<std::vector<int>> owner(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) owner[i].assign(specs[i].numel(), -1);
    int64_t total_bytes = 0, most = 0, least = INT64_MAX;
    for (int s = 0; s < servers; ++s) {
      int64_t bytes = 0, numel = 0;
      for (const Slice& slice : p.slices[s]) {
        ASSERT_LT(slice.begin, slice.end);
        for (int64_t e = slice.begin; e < slice.end; ++e) {
          ASSERT_EQ(owner[slice.variable][e], -1) << "element on two servers";
          owner[slice.variable][e] = s;
        }
        bytes += slice.numel() * static_cast<int64_t>(dtype_size(specs[slice.variable].dtype));
        numel += slice.numel();
      }
      EXPECT_EQ(p.shard_numel[s], numel);
      total_bytes += bytes;
      most = std::max(most, bytes);
      least = std::min(least, bytes);
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      for (int64_t e = 0; e < specs[i].numel(); ++e) {
        ASSERT_NE(owner[i][e], -1) << specs[i].name << "[" << e << "] on no server";
        if (e > 0) {
          EXPECT_LE(owner[i][e - 1], owner[i][e]) << "slices out of order";
        }
      }
    }
    EXPECT_EQ(total_bytes, 21 * 4 + 5 * 4 + 8 * 8 + 4);
    if (servers <= 5) {
      EXPECT_LE(most - least, 2 * 8) << servers << " servers";
    }
  }
  EXPECT_THROW(Partition::by_bytes(specs, 0), ContractError);
}

TEST(PsMessages, FingerprintSeesNamesShapesDtypes) {
  const std::vector<VariableSpec> a = {{"w", {4, 2}, DType::kF32}};
  EXPECT_EQ(fingerprint(a), fingerprint({{"w", {4, 2}, DType::kF32}}));
  EXPECT_NE(fingerprint(a), fingerprint({{"v", {4, 2}, DType::kF32}}));
  EXPECT_NE(fingerprint(a), fingerprint({{"w", {2, 4}, DType::kF32}}));
  EXPECT_NE(fingerprint(a), fingerprint({{"w", {4, 2}, DType::kF64}}));
}

}  // namespace
}  // namespace kolo::ps

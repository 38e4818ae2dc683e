// The NCCL unique-id exchange through the store (comm/nccl_id.h): compiled
// and tested in every build, since it needs no GPU.
#include "comm/nccl_id.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/core/store.h"

namespace kolo::detail {
namespace {

using namespace std::chrono_literals;

std::string id_of(char c) { return std::string(kNcclIdBytes, c); }

TEST(NcclId, MemberZeroGeneratesAndEveryMemberGetsTheSameId) {
  auto store = make_memory_store();
  const int n = 4;
  std::vector<std::string> ids(n);
  int generated = 0;
  std::vector<std::thread> threads;
  for (int r = n - 1; r >= 0; --r) {  // the readers wait for member 0
    threads.emplace_back([&, r] {
      ids[r] = exchange_nccl_id(*store, "job/nccl0", r, 5s, [&] {
        ++generated;
        return id_of('k');
      });
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(generated, 1);
  for (const std::string& id : ids) EXPECT_EQ(id, id_of('k'));
}

TEST(NcclId, PrefixesKeepCommunicatorsApart) {
  auto store = make_memory_store();
  exchange_nccl_id(*store, "a", 0, 1s, [] { return id_of('a'); });
  exchange_nccl_id(*store, "b", 0, 1s, [] { return id_of('b'); });
  EXPECT_EQ(exchange_nccl_id(*store, "a", 1, 1s, nullptr), id_of('a'));
  EXPECT_EQ(exchange_nccl_id(*store, "b", 2, 1s, nullptr), id_of('b'));
}

TEST(NcclId, AMissingMemberZeroIsTheStoresTimeout) {
  auto store = make_memory_store();
  EXPECT_THROW(exchange_nccl_id(*store, "lonely", 1, 200ms, nullptr), TimeoutError);
}

TEST(NcclId, AnIdOfTheWrongLengthIsRefused) {
  auto store = make_memory_store();
  store->set("bad/nccl_id", Bytes(7, 1));
  try {
    exchange_nccl_id(*store, "bad", 1, 1s, nullptr);
    FAIL() << "no error";
  } catch (const RuntimeFault& e) {
    EXPECT_NE(std::string(e.what()).find("has 7 bytes, expected 128"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(exchange_nccl_id(*store, "short", 0, 1s, [] { return std::string(3, 'x'); }),
               ContractError);
}

}  // namespace
}  // namespace kolo::detail

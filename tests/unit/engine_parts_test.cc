// Engine internals that every rank must compute identically: the wire format
// of request lists and the response cache's slots and LRU order.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/message.h"
#include "engine/response_cache.h"
#include "kolo/core/errors.h"

namespace kolo::detail {
namespace {

RequestInfo info(const std::string& name, std::vector<int64_t> shape) {
  RequestInfo i;
  i.kind = RequestKind::kAllgather;
  i.dtype = DType::kBF16;
  i.op = ReduceOp::kMax;
  i.root = 3;
  i.prescale = 0.5;
  i.postscale = 2.0;
  i.name = name;
  i.shape = std::move(shape);
  i.splits = {1, 2, 3};
  return i;
}

TEST(EngineMessage, RequestListRoundTrips) {
  RequestList list;
  list.requests = {info("a", {2, 3}), info("grad/layer1.0.conv1.weight", {})};
  list.verdicts = {{"stuck", {1, 3}, 12.5}};
  list.has_params = true;
  list.cycle_time_ms = 0.5;
  list.fusion_threshold_bytes = 1 << 20;
  const std::string bytes = serialize(list);
  const RequestList back =
      deserialize(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ASSERT_EQ(back.requests.size(), 2u);
  EXPECT_EQ(back.requests[0], list.requests[0]);
  EXPECT_EQ(back.requests[1], list.requests[1]);
  ASSERT_EQ(back.verdicts.size(), 1u);
  EXPECT_EQ(back.verdicts[0].name, "stuck");
  EXPECT_EQ(back.verdicts[0].missing, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(back.verdicts[0].waited_seconds, 12.5);
  EXPECT_TRUE(back.has_params);
  EXPECT_EQ(back.cycle_time_ms, 0.5);
  EXPECT_EQ(back.fusion_threshold_bytes, 1 << 20);

  const RequestList empty = deserialize(
      reinterpret_cast<const uint8_t*>(serialize(RequestList{}).data()), serialize({}).size());
  EXPECT_TRUE(empty.requests.empty());
  EXPECT_FALSE(empty.has_params);
}

TEST(EngineMessage, CorruptListsAreRuntimeFaults) {
  RequestList list;
  list.requests = {info("a", {2, 3})};
  const std::string bytes = serialize(list);
  for (size_t cut : {size_t{0}, size_t{3}, bytes.size() / 2, bytes.size() - 1}) {
    EXPECT_THROW(deserialize(reinterpret_cast<const uint8_t*>(bytes.data()), cut), RuntimeFault)
        << cut;
  }
  std::string longer = bytes + "x";
  EXPECT_THROW(deserialize(reinterpret_cast<const uint8_t*>(longer.data()), longer.size()),
               RuntimeFault);
  std::string bad_magic = bytes;
  bad_magic[0] ^= 1;
  EXPECT_THROW(deserialize(reinterpret_cast<const uint8_t*>(bad_magic.data()), bad_magic.size()),
               RuntimeFault);
}

// Found by tests/fuzz/engine_message_fuzz (corpus regression-request-count):
// 12 bytes announcing 2^32 - 1 requests made deserialize() reserve about
// 400 GiB (an out-of-memory abort under ASan, std::bad_alloc otherwise).
TEST(EngineMessage, ARequestCountTheBytesCannotHoldIsARuntimeFault) {
  const std::string bytes = std::string("1lok") + std::string(4, '\xff') + "\xff\xff\xff\x08";
  EXPECT_THROW(deserialize(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
               RuntimeFault);
}

ResponsePtr response(const std::string& name) {
  auto r = std::make_shared<Response>();
  r->name = name;
  return r;
}

TEST(EngineResponseCache, LeastRecentlyUsedIsEvictedAndFreedSlotsAreReusedLowestFirst) {
  ResponseCache cache(3);
  std::string evicted;
  EXPECT_EQ(cache.put(response("a"), info("a", {1}), &evicted), 0);
  EXPECT_EQ(cache.put(response("b"), info("b", {1}), &evicted), 1);
  EXPECT_EQ(cache.put(response("c"), info("c", {1}), &evicted), 2);
  EXPECT_TRUE(evicted.empty());
  cache.touch(cache.find("a"));                                      // order now b, c, a
  EXPECT_EQ(cache.put(response("d"), info("d", {1}), &evicted), 1);  // b's slot
  EXPECT_EQ(evicted, "b");
  EXPECT_EQ(cache.find("b"), -1);
  EXPECT_EQ(cache.find("d"), 1);
  EXPECT_EQ(cache.mine(1).name, "d");
  EXPECT_EQ(cache.response(1)->name, "d");
  cache.erase("a");
  cache.erase("c");
  EXPECT_EQ(cache.size(), 1);
  EXPECT_EQ(cache.slot_count(), 3);  // the bit vector keeps its length
  EXPECT_EQ(cache.put(response("e"), info("e", {1}), &evicted), 0);
  EXPECT_EQ(cache.put(response("f"), info("f", {1}), &evicted), 2);
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(cache.put(response("g"), info("g", {1}), &evicted), 1);  // d is the oldest
  EXPECT_EQ(evicted, "d");
}

TEST(EngineResponseCache, ZeroCapacityCachesNothing) {
  ResponseCache cache(0);
  std::string evicted;
  EXPECT_EQ(cache.put(response("a"), info("a", {1}), &evicted), -1);
  EXPECT_EQ(cache.find("a"), -1);
  EXPECT_EQ(cache.slot_count(), 0);
}

}  // namespace
}  // namespace kolo::detail

// The engine's tensor queue: a name is pending from push() until release(),
// names are reusable after release, and a program that makes up a new name
// for every call does not grow the queue's bookkeeping without bound.
#include "engine/tensor_queue.h"

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo::detail {
namespace {

std::unique_ptr<Request> request(const std::string& name, int process_set = 0) {
  auto r = std::make_unique<Request>();
  r->info.name = name;
  r->process_set = process_set;
  return r;
}

TEST(TensorQueue, PendingNameIsRejectedUntilReleased) {
  TensorQueue queue;
  queue.push(request("w"));
  EXPECT_THROW(queue.push(request("w")), ContractError);
  queue.push(request("w", 1));  // another process set: a different name space
  std::vector<std::unique_ptr<Request>> drained = queue.drain();
  ASSERT_EQ(drained.size(), 2u);
  EXPECT_THROW(queue.push(request("w")), ContractError);  // drained is still pending
  queue.release(0, "w");
  queue.push(request("w"));  // reusable, as every training step does
  EXPECT_THROW(queue.push(request("w")), ContractError);
}

TEST(TensorQueue, ReleaseAllReleasesEveryFinishedName) {
  TensorQueue queue;
  for (const char* name : {"a", "b", "c"}) queue.push(request(name));
  std::vector<Finished> finished;
  for (auto& r : queue.drain()) finished.push_back({std::move(r), nullptr});
  queue.release_all(finished);
  for (const char* name : {"a", "b", "c"}) queue.push(request(name));
  EXPECT_THROW(queue.push(request("b")), ContractError);
}

TEST(TensorQueue, ManyOneOffNamesKeepPendingOnesPending) {
  // Far more released one-off names than the queue keeps: the sweep that
  // drops them must keep the names still pending.
  TensorQueue queue;
  queue.push(request("held"));
  for (int i = 0; i < 20000; ++i) {
    const std::string name = "once/" + std::to_string(i);
    queue.push(request(name));
    queue.release(0, name);
  }
  EXPECT_THROW(queue.push(request("held")), ContractError);
  queue.push(request("once/7"));  // released earlier: free again
  EXPECT_EQ(queue.drain().size(), 20002u);
}

}  // namespace
}  // namespace kolo::detail

namespace kolo::detail {
namespace {

TEST(TensorQueue, RecycledRequestsComeBackEmpty) {
  TensorQueue queue;
  std::unique_ptr<Request> r = queue.take_request();
  r->info.name = "grad/a-name-longer-than-the-small-string-buffer";
  r->info.splits = {1, 2};
  r->handle = std::make_shared<HandleState>();
  r->allocate = [](const std::vector<int64_t>&) { return TensorView{}; };
  r->open_phases.push_back(TimelinePhase::kQueue);
  r->negotiated_once = true;
  const Request* address = r.get();
  std::vector<Finished> finished;
  finished.push_back({std::move(r), nullptr});
  queue.recycle(finished);
  EXPECT_TRUE(finished.empty());
  std::unique_ptr<Request> again = queue.take_request();
  EXPECT_EQ(again.get(), address);  // reused, most recent first
  ASSERT_TRUE(again->handle);       // a fresh state: not done, no callbacks
  EXPECT_FALSE(again->handle->done);
  EXPECT_TRUE(again->handle->callbacks.empty());
  EXPECT_FALSE(again->allocate);
  EXPECT_TRUE(again->open_phases.empty());
  EXPECT_FALSE(again->negotiated_once);
  EXPECT_TRUE(again->info.splits.empty());
  EXPECT_NE(queue.take_request().get(), address);  // the spare was taken once
}

// A finished request's HandleState is reused once the caller has dropped its
// Handle, reset to a fresh state; while the caller still holds it, the next
// request gets a new one and the old state keeps its result.
TEST(TensorQueue, HandleStatesAreReusedOnlyOnceTheCallerLetGo) {
  TensorQueue queue;
  auto finish_one = [&](std::unique_ptr<Request> r, std::exception_ptr error) {
    r->handle->complete(error);
    std::vector<Finished> finished;
    finished.push_back({std::move(r), nullptr});
    queue.release_all(finished);
    queue.recycle(finished);
  };

  std::unique_ptr<Request> r = queue.take_request();
  r->info.name = "w";
  std::shared_ptr<HandleState> held = r->handle;  // the caller's Handle
  held->value = 7;
  queue.push(std::move(r));
  finish_one(std::move(queue.drain().front()),
             std::make_exception_ptr(std::runtime_error("first failed")));

  std::unique_ptr<Request> second = queue.take_request();
  EXPECT_NE(second->handle, held);  // still held: not reused
  EXPECT_TRUE(held->done);          // and untouched
  EXPECT_TRUE(held->error);
  EXPECT_EQ(held->value, 7);
  HandleState* second_state = second->handle.get();
  second->info.name = "w";  // the released name can be pushed again
  queue.push(std::move(second));
  finish_one(std::move(queue.drain().front()), nullptr);

  held.reset();
  std::unique_ptr<Request> third = queue.take_request();
  EXPECT_EQ(third->handle.get(), second_state);  // nobody held it: reused, reset
  EXPECT_FALSE(third->handle->done);
  EXPECT_FALSE(third->handle->error);
  EXPECT_EQ(third->handle->value, 0);
}

}  // namespace
}  // namespace kolo::detail

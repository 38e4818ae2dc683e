// The tensor adapter and the collectives on torch::Tensor, ranks as threads
// (world sizes 1-3), plus the default-runtime path at world size 1.
#include "kolo/torch/tensor.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "torch_harness.h"

namespace kolo {
namespace {

using testing::kTorchTimeout;
using testing::on;
using testing::run_with_engines;

using testing::error_of;

// --- The adapter (no engine) ------------------------------------------------

TEST(TorchTensorView, MapsEverySupportedDtypeBothWays) {
  const std::vector<std::pair<c10::ScalarType, DType>> pairs = {
      {torch::kByte, DType::kU8},       {torch::kChar, DType::kI8},
      {torch::kShort, DType::kI16},     {torch::kInt, DType::kI32},
      {torch::kLong, DType::kI64},      {torch::kHalf, DType::kF16},
      {torch::kBFloat16, DType::kBF16}, {torch::kFloat, DType::kF32},
      {torch::kDouble, DType::kF64}};
  for (const auto& [torch_type, kolo_type] : pairs) {
    EXPECT_EQ(to_kolo_dtype(torch_type, "op", "t"), kolo_type);
    EXPECT_EQ(to_torch_dtype(kolo_type), torch_type);
    torch::Tensor t = torch::zeros({2, 3}, torch::TensorOptions().dtype(torch_type));
    TensorView view = tensor_view(t, "op", "t");
    EXPECT_EQ(view.data, t.data_ptr());
    EXPECT_EQ(view.dtype, kolo_type);
    EXPECT_EQ(view.shape, (std::vector<int64_t>{2, 3}));
  }
  EXPECT_TRUE(tensor_view(torch::tensor(1.5), "op", "s").shape.empty());
}

TEST(TorchTensorView, RejectsUnsupportedDtypesListingTheSupportedOnes) {
  for (auto type : {torch::kBool, torch::kComplexFloat, torch::kComplexDouble}) {
    const std::string message = error_of([&] {
      tensor_view(torch::zeros({2}, torch::TensorOptions().dtype(type)), "kolo::allreduce",
                  "grad/w");
    });
    EXPECT_NE(message.find("kolo::allreduce"), std::string::npos) << message;
    EXPECT_NE(message.find("'grad/w'"), std::string::npos) << message;
    EXPECT_NE(message.find("uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64"),
              std::string::npos)
        << message;
  }
}

TEST(TorchTensorView, RejectsATensorOnADeviceKoloDoesNotSupportNamingTheDevice) {
  // The meta device exists in every libtorch build, GPU or not: its tensors
  // have no memory, so a silent host copy or a read of data_ptr() would be
  // wrong (or crash); the view refuses it by name.
  const torch::Tensor t = torch::empty({4}, torch::TensorOptions().device(torch::kMeta));
  const std::string message = error_of([&] { tensor_view(t, "kolo::allreduce", "grad/w"); });
  EXPECT_NE(message.find("kolo::allreduce"), std::string::npos) << message;
  EXPECT_NE(message.find("'grad/w' is on device meta"), std::string::npos) << message;
  EXPECT_NE(message.find(".cpu()"), std::string::npos) << message;
}

TEST(TorchTensorView, RejectsNonContiguousAndUndefinedTensors) {
  torch::Tensor t = torch::zeros({3, 4}).t();
  std::string message = error_of([&] { tensor_view(t, "kolo::allreduce", "w"); });
  EXPECT_NE(message.find("'w' is not contiguous"), std::string::npos) << message;
  EXPECT_NE(message.find(".contiguous()"), std::string::npos) << message;
  message = error_of([&] { tensor_view(torch::Tensor(), "kolo::allreduce", "u"); });
  EXPECT_NE(message.find("'u' is undefined"), std::string::npos) << message;
}

// --- Collectives through the engine -----------------------------------------

class TorchCollectives : public ::testing::TestWithParam<int> {
 protected:
  int world() const { return GetParam(); }
};

TEST_P(TorchCollectives, AllreduceSyncInPlaceAsyncWithScales) {
  const int n = world();
  run_with_engines(n, [&](int rank, Engine& engine) {
    auto o = on(engine);
    torch::Tensor x = torch::full({2, 3}, static_cast<float>(rank + 1));
    // Average into a new tensor: the input is untouched.
    torch::Tensor avg = allreduce(x, "avg", o);
    EXPECT_TRUE(torch::allclose(avg, torch::full({2, 3}, (n + 1) / 2.0f)));
    EXPECT_TRUE(torch::equal(x, torch::full({2, 3}, static_cast<float>(rank + 1))));
    // Sum with scales, in place, on doubles.
    torch::Tensor d = torch::arange(4, torch::kDouble) * (rank + 1);
    TensorOpOptions s = o;
    s.op = ReduceOp::kSum;
    s.prescale = 2.0;
    s.postscale = 0.25;
    torch::Tensor same = allreduce_(d, "sum", s);
    EXPECT_TRUE(same.is_same(d));
    const double ranks_sum = n * (n + 1) / 2.0;
    EXPECT_TRUE(torch::allclose(d, torch::arange(4, torch::kDouble) * ranks_sum * 0.5));
    // Async: the handle is dropped before completion, the tensors stay alive.
    { allreduce_async(torch::ones({1000}) * rank, "dropped", o); }
    TensorOpOptions sum = o;
    sum.op = ReduceOp::kSum;
    TensorHandle h = allreduce_async(torch::ones({5}, torch::kLong) * (rank + 1), "int", sum);
    torch::Tensor r = h.wait(kTorchTimeout);
    EXPECT_EQ(r.scalar_type(), torch::kLong);
    EXPECT_TRUE(torch::equal(r, torch::full({5}, static_cast<int64_t>(ranks_sum), torch::kLong)));
    TensorHandle in_place = allreduce_async_(x, "inplace", o);
    EXPECT_TRUE(in_place.wait(kTorchTimeout).is_same(x));
    EXPECT_TRUE(torch::allclose(x, torch::full({2, 3}, (n + 1) / 2.0f)));
    torch::Tensor max = allreduce(torch::tensor({rank}), "max", [&] {
      TensorOpOptions m = o;
      m.op = ReduceOp::kMax;
      return m;
    }());
    EXPECT_EQ(max.item<int64_t>(), n - 1);
  });
}

TEST_P(TorchCollectives, AllgatherWithADifferentFirstDimensionPerRank) {
  const int n = world();
  run_with_engines(n, [&](int rank, Engine& engine) {
    torch::Tensor mine = torch::full({rank + 1, 3}, static_cast<float>(rank));
    torch::Tensor all = allgather(mine, "rows", on(engine));
    ASSERT_EQ(all.size(0), n * (n + 1) / 2);
    ASSERT_EQ(all.size(1), 3);
    int64_t row = 0;
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k <= r; ++k, ++row) {
        EXPECT_TRUE(torch::equal(all[row], torch::full({3}, static_cast<float>(r))));
      }
    }
    TensorHandle h = allgather_async(torch::tensor(rank * 10, torch::kInt), "scalars", on(engine));
    torch::Tensor scalars = h.wait(kTorchTimeout);
    EXPECT_EQ(scalars.scalar_type(), torch::kInt);
    ASSERT_EQ(scalars.numel(), n);
    for (int r = 0; r < n; ++r) EXPECT_EQ(scalars[r].item<int32_t>(), r * 10);
    EXPECT_EQ(h.received_splits(), std::vector<int64_t>(n, 1));
  });
}

TEST_P(TorchCollectives, BroadcastCopiesRootIncludingBoolTensors) {
  const int n = world();
  run_with_engines(n, [&](int rank, Engine& engine) {
    auto o = on(engine);
    o.root = n - 1;
    torch::Tensor x = torch::arange(6, torch::kFloat).reshape({2, 3}) + rank;
    torch::Tensor copy = broadcast(x, "copy", o);
    EXPECT_TRUE(torch::equal(copy, torch::arange(6, torch::kFloat).reshape({2, 3}) + (n - 1)));
    EXPECT_TRUE(torch::equal(x, torch::arange(6, torch::kFloat).reshape({2, 3}) + rank));
    broadcast_(x, "inplace", o);
    EXPECT_TRUE(torch::equal(x, copy));
    torch::Tensor flags = torch::tensor({rank == n - 1, false, rank != n - 1});
    broadcast_async_(flags, "flags", o).wait(kTorchTimeout);
    EXPECT_TRUE(torch::equal(flags, torch::tensor({true, false, false})));
    torch::Tensor shorts = torch::full({3}, rank, torch::kShort);
    EXPECT_TRUE(torch::equal(broadcast_async(shorts, "shorts", o).wait(kTorchTimeout),
                             torch::full({3}, n - 1, torch::kShort)));
  });
}

TEST_P(TorchCollectives, ReducescatterGivesThisRanksRows) {
  const int n = world();
  run_with_engines(n, [&](int rank, Engine& engine) {
    auto o = on(engine);
    o.op = ReduceOp::kSum;
    // 5 rows: with 2 ranks 3 + 2, with 3 ranks 2 + 2 + 1.
    torch::Tensor x = torch::arange(10, torch::kFloat).reshape({5, 2}) * (rank + 1);
    torch::Tensor mine = reducescatter(x, "rs", o);
    const auto shape = Engine::reducescatter_shape({5, 2}, n, rank);
    ASSERT_EQ(mine.sizes().vec(), shape);
    int64_t first = 0;
    for (int r = 0; r < rank; ++r) first += Engine::reducescatter_shape({5, 2}, n, r)[0];
    const float ranks_sum = n * (n + 1) / 2.0f;
    EXPECT_TRUE(torch::equal(
        mine, torch::arange(10, torch::kFloat).reshape({5, 2}).slice(0, first, first + shape[0]) *
                  ranks_sum));
  });
}

TEST_P(TorchCollectives, AlltoallWithSplits) {
  const int n = world();
  run_with_engines(n, [&](int rank, Engine& engine) {
    // Rank r sends k + 1 rows of value 100 * r + k to rank k.
    std::vector<int64_t> splits;
    std::vector<torch::Tensor> parts;
    for (int k = 0; k < n; ++k) {
      splits.push_back(k + 1);
      parts.push_back(torch::full({k + 1, 2}, 100.0 * rank + k, torch::kDouble));
    }
    AlltoallResult result = alltoall(torch::cat(parts), splits, "a2a", on(engine));
    EXPECT_EQ(result.received_splits, std::vector<int64_t>(n, rank + 1));
    ASSERT_EQ(result.output.size(0), n * (rank + 1));
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(torch::equal(result.output.slice(0, r * (rank + 1), (r + 1) * (rank + 1)),
                               torch::full({rank + 1, 2}, 100.0 * r + rank, torch::kDouble)));
    }
  });
}

TEST_P(TorchCollectives, BroadcastOfBytesAndObjects) {
  const int n = world();
  run_with_engines(n, [&](int rank, Engine& engine) {
    auto o = on(engine);
    const std::string payload = rank == 0 ? std::string("hello\0world", 11) : "ignored";
    EXPECT_EQ(broadcast_bytes(payload, "bytes", o), std::string("hello\0world", 11));
    EXPECT_EQ(broadcast_bytes(rank == 0 ? "" : "x", "empty", o), "");
    c10::Dict<std::string, int64_t> dict;
    dict.insert("rank", rank);
    dict.insert("answer", 42);
    c10::IValue value = broadcast_object(c10::IValue(dict), "dict", o);
    auto received = value.toGenericDict();
    EXPECT_EQ(received.at("rank").toInt(), 0);
    EXPECT_EQ(received.at("answer").toInt(), 42);
    c10::IValue tensor = broadcast_object(c10::IValue(torch::full({2}, rank)), "tensor", o);
    EXPECT_TRUE(torch::equal(tensor.toTensor(), torch::full({2}, 0)));
  });
}

TEST_P(TorchCollectives, AllgatherOfBytesBarrierAndBroadcastFromRoot) {
  const int n = world();
  run_with_engines(n, [&](int rank, Engine& engine) {
    auto o = on(engine);
    // Every rank's bytes, of a different length each (rank 0's empty).
    const std::vector<std::string> all = allgather_bytes(
        std::string(static_cast<size_t>(rank), '\0') + (rank ? "x" : ""), "bytes.all", o);
    ASSERT_EQ(all.size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(all[r], std::string(static_cast<size_t>(r), '\0') + (r ? "x" : ""));
    }
    barrier(o);
    // Only root produces; its bytes reach everyone.
    o.root = n - 1;
    bool produced = false;
    const std::string got = broadcast_from_root(
        [&] {
          produced = true;
          return std::string("from root");
        },
        "from_root", o);
    EXPECT_EQ(got, "from root");
    EXPECT_EQ(produced, rank == n - 1);
    // Root's failure reaches every rank as the same kind of error.
    const std::string message = error_of([&] {
      broadcast_from_root([]() -> std::string { throw ContractError("no state to send"); },
                          "failing", o);
    });
    EXPECT_NE(message.find("no state to send"), std::string::npos) << message;
    if (rank != n - 1) {
      EXPECT_NE(message.find("reported by root rank " + std::to_string(n - 1)), std::string::npos)
          << message;
    }
  });
}

TEST_P(TorchCollectives, ProcessSetsIncludingReducescatterMembership) {
  const int n = world();
  if (n < 2) GTEST_SKIP() << "a proper subset needs two ranks";
  run_with_engines(n, [&](int rank, Engine& engine) {
    // Ranks 0 and n-1, through the frontend's call; the engine answers
    // membership itself.
    const ProcessSet set = add_process_set({0, n - 1}, on(engine));
    EXPECT_EQ(set.size(), 2);
    EXPECT_EQ(set.ranks(), (std::vector<int>{0, n - 1}));
    EXPECT_EQ(set.included(), rank == 0 || rank == n - 1);
    EXPECT_EQ(set.rank(), rank == 0 ? 0 : rank == n - 1 ? 1 : -1);
    EXPECT_EQ(engine.process_set(set.id()).ranks(), set.ranks());
    if (set.included()) {
      auto o = on(engine);
      o.process_set = set.id();
      barrier(o);
      o.op = ReduceOp::kSum;
      torch::Tensor sum = allreduce(torch::tensor({rank}), "set.sum", o);
      EXPECT_EQ(sum.item<int64_t>(), n - 1);
      torch::Tensor mine = reducescatter(torch::ones({3, 1}) * (rank + 1), "set.rs", o);
      const int64_t rows = rank == 0 ? 2 : 1;
      EXPECT_TRUE(torch::equal(mine, torch::full({rows, 1}, static_cast<float>(n + 1))));
    } else {
      // A call on a set this rank is not in names the call and the set.
      auto o = on(engine);
      o.process_set = set.id();
      const std::string message = error_of([&] { reducescatter(torch::ones({3}), "set.rs", o); });
      EXPECT_NE(message.find("not a member of process set"), std::string::npos) << message;
    }
    barrier(on(engine));
    // Everyone finishes together (engines are torn down collectively).
    allreduce(torch::ones({1}), "done", on(engine));
  });
}

TEST_P(TorchCollectives, EmptyNameIsAContractError) {
  run_with_engines(world(), [&](int rank, Engine& engine) {
    EXPECT_THROW(allreduce(torch::ones({1}), "", on(engine)), ContractError);
    torch::Tensor t = torch::ones({2, 2}).t();
    const std::string message = error_of([&] { broadcast_(t, "nc", on(engine)); });
    EXPECT_NE(message.find("kolo::broadcast_"), std::string::npos) << message;
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, TorchCollectives, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

TEST(TorchDefaultRuntime, CallsWithoutAnEngineUseKoloRuntime) {
  InitOptions init;
  init.env = map_env({});
  kolo::init(init);
  torch::Tensor x = torch::full({4}, 3.0f);
  TensorOpOptions o;
  o.timeout = kTorchTimeout;
  EXPECT_TRUE(torch::equal(allreduce(x, "default", o), x));
  kolo::shutdown();
  // The error names the call the user made, not the runtime accessor.
  const std::string message = error_of([&] { allreduce(x, "after_shutdown", o); });
  EXPECT_NE(message.find("kolo::allreduce called before kolo::init()"), std::string::npos)
      << message;
  EXPECT_NE(error_of([] { barrier(); }).find("kolo::barrier called before kolo::init()"),
            std::string::npos);
}

}  // namespace
}  // namespace kolo

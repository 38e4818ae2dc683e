// Engine, ranks as threads: requests whose arguments disagree across ranks
// fail on every rank with a message naming the tensor, the op, the ranks and
// their values; nobody hangs and the next step works.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "engine_harness.h"
#include "kolo/core/engine.h"
#include "kolo/core/errors.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

using testing::EngineWorld;
using testing::kEngineTimeout;
using testing::run_ranks;
using testing::Tensor;

struct MismatchCase {
  std::string what;
  // Submits tensor `name` on `rank`; the last rank disagrees with the others.
  std::function<Handle(Engine&, const std::string& name, int rank, bool odd, Tensor& in,
                       Tensor& out)>
      submit;
  std::vector<std::string> expected;  // substrings of the message ("%o" = odd rank's value)
};

std::vector<MismatchCase> mismatch_cases() {
  std::vector<MismatchCase> cases;
  cases.push_back({"operation",
                   [](Engine& e, const std::string& name, int, bool odd, Tensor& in, Tensor& out) {
                     if (odd)
                       return e.allgather_async(name, in.view(), testing::allocate_into(out));
                     return e.allreduce_async(name, in.view(), in.view());
                   },
                   {"Mismatched operations", "ALLREDUCE", "ALLGATHER"}});
  cases.push_back({"dtype",
                   [](Engine& e, const std::string& name, int, bool odd, Tensor& in, Tensor&) {
                     TensorView v = in.view();
                     if (odd) {
                       v.dtype = DType::kI32;  // same bytes, other type
                     }
                     return e.allreduce_async(name, v, v);
                   },
                   {"Mismatched ALLREDUCE data types", "has f32", "has i32"}});
  cases.push_back({"shape",
                   [](Engine& e, const std::string& name, int, bool odd, Tensor& in, Tensor&) {
                     TensorView v = in.view();
                     v.shape = odd ? std::vector<int64_t>{2, 3} : std::vector<int64_t>{6};
                     return e.allreduce_async(name, v, v);
                   },
                   {"Mismatched ALLREDUCE tensor shapes", "has [6]", "has [2, 3]"}});
  cases.push_back(
      {"allgather trailing shape",
       [](Engine& e, const std::string& name, int rank, bool odd, Tensor& in, Tensor& out) {
         TensorView v = in.view();
         // First dims differ on every rank (legal); trailing dims differ on the odd one.
         v.shape = odd ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{1 + rank % 2, 2};
         return e.allgather_async(name, v, testing::allocate_into(out));
       },
       {"Mismatched ALLGATHER tensor shapes", "all but the first dimension", "[1, 3]"}});
  cases.push_back({"op",
                   [](Engine& e, const std::string& name, int, bool odd, Tensor& in, Tensor&) {
                     RequestOptions o;
                     o.op = odd ? ReduceOp::kMax : ReduceOp::kSum;
                     return e.allreduce_async(name, in.view(), in.view(), o);
                   },
                   {"Mismatched ALLREDUCE reduction ops", "has sum", "has max"}});
  cases.push_back({"prescale",
                   [](Engine& e, const std::string& name, int, bool odd, Tensor& in, Tensor&) {
                     RequestOptions o;
                     o.prescale = odd ? 0.5 : 1.0;
                     return e.allreduce_async(name, in.view(), in.view(), o);
                   },
                   {"Mismatched ALLREDUCE prescale factors", "has 1", "has 0.5"}});
  cases.push_back(
      {"postscale",
       [](Engine& e, const std::string& name, int rank, bool odd, Tensor& in, Tensor& out) {
         RequestOptions o;
         o.postscale = odd ? 2.0 : 1.0;
         out = Tensor(Engine::reducescatter_shape(in.shape, e.size(), rank));
         return e.reducescatter_async(name, in.view(), out.view(), o);
       },
       {"Mismatched REDUCESCATTER postscale factors", "has 1", "has 2"}});
  cases.push_back({"root",
                   [](Engine& e, const std::string& name, int, bool odd, Tensor& in, Tensor&) {
                     RequestOptions o;
                     o.root = odd ? 1 : 0;
                     return e.broadcast_async(name, in.view(), o);
                   },
                   {"Mismatched BROADCAST root ranks", "has rank 0", "has rank 1"}});
  return cases;
}

class EngineMismatch : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(EngineMismatch, EveryRankFailsWithTheValuesAndTheNextStepWorks) {
  // Not a structured binding: lambdas below capture n, which clang before 16
  // (the sanitizer build's) rejects for bindings.
  const std::string backend = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  EngineWorld world(backend, n);
  const auto cases = mismatch_cases();
  std::vector<std::vector<std::string>> messages(n, std::vector<std::string>(cases.size()));
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    const bool odd = rank == n - 1;
    for (size_t c = 0; c < cases.size(); ++c) {
      const std::string name = "bad/" + std::to_string(c);
      Tensor in({6}, 1);
      Tensor out;
      Handle h = cases[c].submit(*engine, name, rank, odd, in, out);
      try {
        h.wait(kEngineTimeout);
        messages[rank][c] = "(no error)";
      } catch (const ContractError& e) {
        messages[rank][c] = e.what();
      }
      // The engine stays usable: the same name, now consistent, works.
      Tensor good({6}, float(rank));
      engine->allreduce_async(name, good.view(), good.view(), {ReduceOp::kSum})
          .wait(kEngineTimeout);
      ASSERT_EQ(good.data[5], float(n * (n - 1) / 2)) << cases[c].what;
    }
  });
  for (size_t c = 0; c < cases.size(); ++c) {
    for (int r = 0; r < n; ++r) {
      const std::string& m = messages[r][c];
      SCOPED_TRACE(cases[c].what + " on rank " + std::to_string(r) + ": " + m);
      EXPECT_NE(m.find("'bad/" + std::to_string(c) + "'"), std::string::npos);
      for (const auto& part : cases[c].expected) EXPECT_NE(m.find(part), std::string::npos) << part;
      const std::string odd_rank = "rank " + std::to_string(n - 1);
      EXPECT_TRUE(m.find(odd_rank + " has") != std::string::npos ||
                  m.find(odd_rank + " submitted") != std::string::npos);
      EXPECT_EQ(m, messages[0][c]) << "every rank gets the same message";
    }
  }
}

// A name agreed through the response cache for several steps, then submitted
// with another shape by one rank: the two paths (bit vector, full round) must
// not split the name; every rank fails, then the old shape works again.
TEST_P(EngineMismatch, ChangedShapeOfACachedNameFailsEverywhere) {
  // Not a structured binding: lambdas below capture n, which clang before 16
  // (the sanitizer build's) rejects for bindings.
  const std::string backend = std::get<0>(GetParam());
  const int n = std::get<1>(GetParam());
  EngineWorld world(backend, n);
  std::vector<std::string> messages(n);
  std::vector<Engine::Stats> stats(n);
  run_ranks(n, [&](int rank) {
    auto engine = world.engine(rank);
    Tensor w({6}, 1);
    for (int step = 0; step < 12; ++step) {
      TensorView v = w.view();
      const bool changed = step == 6 && rank == n - 1;
      if (changed) v.shape = {2, 3};
      Handle h = engine->allreduce_async("w", v, v, {ReduceOp::kMax});
      if (step == 6) {
        try {
          h.wait(kEngineTimeout);
        } catch (const ContractError& e) {
          messages[rank] = e.what();
        }
      } else {
        h.wait(kEngineTimeout);
        ASSERT_EQ(w.data[0], 1.0f);
      }
    }
    stats[rank] = engine->stats();
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_NE(messages[r].find("Mismatched ALLREDUCE tensor shapes for tensor 'w'"),
              std::string::npos)
        << messages[r];
    EXPECT_NE(messages[r].find("has [2, 3]"), std::string::npos) << messages[r];
    EXPECT_GE(stats[r].cache_hits, 8u);
  }
}

std::string param_name(const ::testing::TestParamInfo<EngineMismatch::ParamType>& info) {
  return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineMismatch,
                         ::testing::Combine(::testing::ValuesIn(testing::engine_backends()),
                                            ::testing::Values(2, 3, 4)),
                         param_name);

}  // namespace
}  // namespace kolo

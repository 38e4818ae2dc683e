// broadcast_parameters / broadcast_optimizer_state: bitwise identical
// parameters, buffers, optimizer state (including lazily created state) and
// group options on every rank, for SGD with momentum, Adam, AdamW, RMSprop and
// Adagrad; structural mismatches are an error on every rank.
#include "kolo/torch/broadcast.h"

#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/torch/compat.h"
#include "test_net.h"
#include "torch_harness.h"

namespace kolo {
namespace {

using testing::model_bytes;
using testing::Net;
using testing::on;
using testing::run_with_engines;
using testing::tensor_bytes;
using testing::train_step;

using testing::error_of;

// Gives every tensor of `net` values that depend on the rank.
void scramble(Net& net, int rank) {
  torch::NoGradGuard no_grad;
  int k = 0;
  for (auto& t : testing::all_tensors(net)) {
    t.copy_((torch::arange(t.numel(), torch::kDouble).reshape(t.sizes()) * 0.37 + rank * 10 + k++)
                .to(t.scalar_type()));
  }
}

TEST(BroadcastParameters, ParametersAndBuffersBecomeBitwiseIdentical) {
  for (int n : {1, 2, 3}) {
    std::vector<std::string> bytes(n);
    run_with_engines(n, [&](int rank, Engine& engine) {
      Net net;
      scramble(net, rank);
      broadcast_parameters(net, /*root=*/n - 1, on(engine));
      bytes[rank] = model_bytes(net);
    });
    Net expected;
    scramble(expected, n - 1);
    for (int rank = 0; rank < n; ++rank) {
      EXPECT_EQ(bytes[rank], model_bytes(expected)) << "rank " << rank << " of " << n;
    }
  }
}

// A module whose parameter is a non-contiguous view (staged through a copy).
struct Transposed : torch::nn::Module {
  Transposed() { w = register_parameter("w", torch::zeros({3, 4}).t()); }
  torch::Tensor w;
};

TEST(BroadcastParameters, NamedTensorsAndNonContiguousParameters) {
  const int n = 2;
  std::vector<std::string> bytes(n);
  run_with_engines(n, [&](int rank, Engine& engine) {
    Transposed m;
    {
      torch::NoGradGuard no_grad;
      m.w.copy_(torch::arange(12, torch::kFloat).reshape({4, 3}) + rank);
    }
    ASSERT_FALSE(m.w.is_contiguous());
    broadcast_parameters(m.named_parameters(), 0, on(engine));
    EXPECT_TRUE(torch::equal(m.w, torch::arange(12, torch::kFloat).reshape({4, 3})));
    torch::Tensor extra = torch::full({2}, rank, torch::kLong);
    const std::vector<std::pair<std::string, torch::Tensor>> named = {{"extra", extra}};
    broadcast_parameters(named, 1, on(engine));
    EXPECT_TRUE(torch::equal(extra, torch::full({2}, 1, torch::kLong)));
  });
}

TEST(BroadcastParameters, DifferentModelsAreAnErrorOnEveryRank) {
  const int n = 3;
  std::vector<std::string> messages(n);
  run_with_engines(n, [&](int rank, Engine& engine) {
    Net net(rank == 1 ? 4 : 3);  // rank 1's layers are wider
    messages[rank] = error_of([&] { broadcast_parameters(net, 0, on(engine)); });
  });
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_NE(messages[rank].find("rank 1"), std::string::npos) << messages[rank];
    EXPECT_NE(messages[rank].find("param/fc.weight"), std::string::npos) << messages[rank];
  }
}

// --- Optimizer state --------------------------------------------------------

// Everything that defines an optimizer's behaviour, per parameter in order:
// each state tensor's bytes and step, and each group's hyperparameters.
std::string optimizer_bytes(torch::optim::Optimizer& optimizer) {
  using namespace torch::optim;
  std::ostringstream out;
  out.precision(17);
  for (auto& group : optimizer.param_groups()) {
    auto& o = group.options();
    if (auto* s = dynamic_cast<SGDOptions*>(&o)) {
      out << "sgd " << s->lr() << " " << s->momentum() << " " << s->weight_decay() << "\n";
    } else if (auto* a = dynamic_cast<AdamOptions*>(&o)) {
      out << "adam " << a->lr() << " " << std::get<0>(a->betas()) << " " << std::get<1>(a->betas())
          << " " << a->weight_decay() << "\n";
    } else if (auto* w = dynamic_cast<AdamWOptions*>(&o)) {
      out << "adamw " << w->lr() << " " << std::get<0>(w->betas()) << " " << w->weight_decay()
          << "\n";
    } else if (auto* r = dynamic_cast<RMSpropOptions*>(&o)) {
      out << "rmsprop " << r->lr() << " " << r->alpha() << " " << r->momentum() << "\n";
    } else if (auto* g = dynamic_cast<AdagradOptions*>(&o)) {
      out << "adagrad " << g->lr() << " " << g->lr_decay() << "\n";
    }
    for (const auto& p : group.params()) {
      auto it = optimizer.state().find(kolo::compat::optimizer_state_key(p));
      if (it == optimizer.state().end()) {
        out << "no state\n";
        continue;
      }
      auto* state = it->second.get();
      if (auto* s = dynamic_cast<SGDParamState*>(state)) {
        out << tensor_bytes(s->momentum_buffer());
      } else if (auto* a = dynamic_cast<AdamParamState*>(state)) {
        out << a->step() << tensor_bytes(a->exp_avg()) << tensor_bytes(a->exp_avg_sq())
            << tensor_bytes(a->max_exp_avg_sq());
      } else if (auto* w = dynamic_cast<AdamWParamState*>(state)) {
        out << w->step() << tensor_bytes(w->exp_avg()) << tensor_bytes(w->exp_avg_sq());
      } else if (auto* r = dynamic_cast<RMSpropParamState*>(state)) {
        out << r->step() << tensor_bytes(r->square_avg()) << tensor_bytes(r->momentum_buffer())
            << tensor_bytes(r->grad_avg());
      } else if (auto* g = dynamic_cast<AdagradParamState*>(state)) {
        out << g->step() << tensor_bytes(g->sum());
      } else {
        out << "unknown state type";
      }
      out << "\n";
    }
  }
  return out.str();
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(Net& net, int rank)>;

struct OptimizerCase {
  const char* name;
  MakeOptimizer make;  // hyperparameters depend on the rank
};

std::vector<OptimizerCase> optimizer_cases() {
  using namespace torch::optim;
  return {
      {"sgd_momentum",
       [](Net& net, int rank) {
         return std::make_unique<SGD>(net.parameters(),
                                      SGDOptions(0.1 + rank).momentum(0.9 - 0.1 * rank));
       }},
      {"adam",
       [](Net& net, int rank) {
         return std::make_unique<Adam>(net.parameters(),
                                       AdamOptions(0.01 + rank).betas({0.9 - 0.1 * rank, 0.999}));
       }},
      {"adamw",
       [](Net& net, int rank) {
         return std::make_unique<AdamW>(net.parameters(),
                                        AdamWOptions(0.01 + rank).weight_decay(0.01 * rank));
       }},
      {"rmsprop",
       [](Net& net, int rank) {
         return std::make_unique<RMSprop>(net.parameters(),
                                          RMSpropOptions(0.01 + rank).momentum(0.5).alpha(0.9));
       }},
      {"adagrad",
       [](Net& net, int rank) {
         return std::make_unique<Adagrad>(net.parameters(),
                                          AdagradOptions(0.01 + rank).lr_decay(0.1 * rank));
       }},
  };
}

class BroadcastOptimizerState : public ::testing::TestWithParam<int> {};

TEST_P(BroadcastOptimizerState, StateAndOptionsBecomeBitwiseIdenticalForEveryOptimizer) {
  const int n = GetParam();
  for (const OptimizerCase& c : optimizer_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> after_broadcast(n);
    std::vector<std::string> after_step(n);
    run_with_engines(n, [&](int rank, Engine& engine) {
      Net net;
      scramble(net, rank);
      auto optimizer = c.make(net, rank);
      // Root has stepped twice; rank 1 once with other data (its state must be
      // replaced); rank 2 never (its state does not exist yet).
      if (rank == 0) {
        train_step(net, *optimizer, 1.0f);
        train_step(net, *optimizer, 0.5f);
      } else if (rank == 1) {
        train_step(net, *optimizer, 3.0f);
      }
      broadcast_parameters(net, 0, on(engine));
      broadcast_optimizer_state(*optimizer, 0, on(engine));
      after_broadcast[rank] = model_bytes(net) + optimizer_bytes(*optimizer);
      // The same step everywhere now gives the same result everywhere.
      train_step(net, *optimizer, 0.25f);
      after_step[rank] = model_bytes(net) + optimizer_bytes(*optimizer);
    });
    EXPECT_NE(after_broadcast[0].find("\n"), std::string::npos);
    EXPECT_EQ(after_broadcast[0].find("no state"), std::string::npos);
    for (int rank = 1; rank < n; ++rank) {
      EXPECT_TRUE(after_broadcast[rank] == after_broadcast[0]) << "rank " << rank;
      EXPECT_TRUE(after_step[rank] == after_step[0]) << "rank " << rank;
    }
  }
}

TEST_P(BroadcastOptimizerState, AnOptimizerOfAnotherTypeIsAnErrorOnEveryRank) {
  const int n = GetParam();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<std::string> messages(n);
  run_with_engines(n, [&](int rank, Engine& engine) {
    Net net;
    auto cases = optimizer_cases();
    auto optimizer = cases[rank == n - 1 ? 0 : 1].make(net, rank);  // last rank: SGD, others Adam
    messages[rank] = error_of([&] { broadcast_optimizer_state(*optimizer, 0, on(engine)); });
  });
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_NE(messages[rank].find("rank " + std::to_string(n - 1)), std::string::npos)
        << messages[rank];
    EXPECT_NE(messages[rank].find("same optimizer class"), std::string::npos) << messages[rank];
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, BroadcastOptimizerState, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

}  // namespace
}  // namespace kolo

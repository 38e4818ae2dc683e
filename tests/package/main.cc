// The out-of-tree consumer of tests/package: what a project that uses an
// installed kolo writes (README "Using kolo from C++"). Run under kolorun:
//   kolorun -np 2 ./kolo_consumer
// Each rank trains a linear model on its own shard of a regression problem
// for a few steps with kolo::DistributedOptimizer (gradients averaged across
// the ranks), then checks that every rank holds the same weights and that the
// loss fell. Exit status 0 only if all of it holds on this rank.
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdio>

#include "kolo/kolo.h"
#include "kolo/torch/broadcast.h"
#include "kolo/torch/optimizer.h"
#include "kolo/torch/tensor.h"
#include "same_kolo.h"

int main() {
  kolo::init();
  const int rank = kolo::rank();
  const int size = kolo::size();

  if (!same_kolo(rank)) return 1;

  torch::manual_seed(1234);
  torch::nn::Linear model(8, 1);
  kolo::broadcast_parameters(*model, /*root=*/0);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  kolo::DistributedOptimizer optimizer(sgd, model->named_parameters());

  // This rank's shard: 32 samples (32, 8) of y = x . w_true.
  torch::manual_seed(100 + rank);
  const torch::Tensor x = torch::randn({32, 8});
  const torch::Tensor y = x.matmul(torch::arange(1.0, 9.0).reshape({8, 1}));

  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < 5; ++step) {
    optimizer.zero_grad();
    torch::Tensor loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    optimizer.step();
    (step == 0 ? first_loss : last_loss) = loss.item<double>();
  }

  // Every rank's weights, side by side: (size, 9).
  const torch::Tensor mine = torch::cat({model->weight.detach().flatten(), model->bias.detach()});
  const torch::Tensor all = kolo::allgather(mine.unsqueeze(0), "consumer/weights");
  const double spread = (all - all[0]).abs().max().item<double>();
  const bool ok = spread == 0.0 && last_loss < first_loss;
  std::printf("kolo consumer: rank %d of %d, kolo %s, loss %.4f -> %.4f, weight spread %g: %s\n",
              rank, size, kolo::version(), first_loss, last_loss, spread, ok ? "ok" : "FAILED");
  kolo::shutdown();
  return ok ? 0 : 1;
}

// A model of MLP blocks trained on a grid of data, pipeline and tensor
// parallelism: kolo::ParallelGrid, kolo::Pipeline, kolo::ParallelMLP and a
// data-parallel optimizer, top to bottom.
//
//   kolorun -np 4 build/examples/model_parallel/model_parallel --dp 2 --pp 2
//   kolorun -np 4 build/examples/model_parallel/model_parallel --tp 2 --dp 2
//   kolorun -np 8 build/examples/model_parallel/model_parallel --dp 2 --pp 2 --tp 2
//
// The task: regression onto a fixed random "teacher" network. Every rank
// draws the same global batches from the same seed; each data-parallel
// replica trains on its rows. The model:
//
//   input (B, hidden) -> --blocks x [MLP block: Linear(hidden, ffn), GELU,
//   Linear(ffn, hidden)] -> head Linear(hidden, hidden) -> (B, hidden)
//
// With --tp > 1 each block is a kolo::ParallelMLP (its matrices split across
// the tensor-parallel group, one allreduce forward, one backward); with --pp
// > 1 the blocks are cut into stages (kolo::Pipeline, 1F1B on --micro-batches
// micro-batches); the optimizer of each stage (and tensor slice) averages
// gradients across the data-parallel replicas (DistributedOptimizer, or ZeRO
// with --zero-stage). The result trains the same model as one process on the
// whole batch would (tests/torch/grid_test.cc checks that equivalence).
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kolo/kolo.h"
#include "kolo/torch.h"

namespace {

struct Flags {
  int dp = 1, pp = 1, tp = 1;
  int blocks = 4;
  int hidden = 256;
  int ffn = 1024;
  int batch = 64;  // global batch, rows per step
  int micro_batches = 4;
  std::string schedule = "1f1b";
  int steps = 200;
  int log_every = 20;
  double lr = 1e-3;
  int zero_stage = 0;
};

// The layers of one MLP block, as modules of the Sequential (so that a
// pipeline can cut between blocks and their parameters keep one name).
void add_block(torch::nn::Sequential& model, const Flags& f, kolo::ParallelGrid& grid, int b) {
  if (f.tp == 1) {
    model->push_back(torch::nn::Linear(f.hidden, f.ffn));
    model->push_back(torch::nn::GELU());
    model->push_back(torch::nn::Linear(f.ffn, f.hidden));
    return;
  }
  kolo::TensorParallelOptions tp;
  tp.process_set = grid.tp_set();  // this rank's tensor-parallel group
  tp.name = "block" + std::to_string(b);
  model->push_back(kolo::ParallelMLP(f.hidden, f.ffn, tp));
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"kolo: an MLP-block model on a dp x pp x tp grid"};
  app.add_option("--dp", f.dp, "data-parallel replicas")->check(CLI::PositiveNumber);
  app.add_option("--pp", f.pp, "pipeline stages")->check(CLI::PositiveNumber);
  app.add_option("--tp", f.tp, "tensor-parallel ranks per layer")->check(CLI::PositiveNumber);
  app.add_option("--blocks", f.blocks, "MLP blocks")->check(CLI::PositiveNumber);
  app.add_option("--hidden", f.hidden, "width between blocks")->check(CLI::PositiveNumber);
  app.add_option("--ffn", f.ffn, "width inside a block")->check(CLI::PositiveNumber);
  app.add_option("--batch", f.batch, "global batch (rows per step)")->check(CLI::PositiveNumber);
  app.add_option("--micro-batches", f.micro_batches, "micro-batches per step (--pp > 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--schedule", f.schedule, "gpipe or 1f1b")
      ->check(CLI::IsMember({"gpipe", "1f1b"}));
  app.add_option("--steps", f.steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--log-every", f.log_every, "steps between loss lines")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", f.lr, "Adam's learning rate")->check(CLI::PositiveNumber);
  app.add_option("--zero-stage", f.zero_stage, "0 = DistributedOptimizer, 1-3 = ZeRO")
      ->check(CLI::Range(0, 3));
  CLI11_PARSE(app, argc, argv);

  try {
    // 1. The runtime and the grid: dp x pp x tp must be the world size.
    kolo::init_torch();  // kolo::init() that also joins torchrun's c10d store
    kolo::ParallelGrid grid{f.dp, f.pp, f.tp};
    if (f.batch % f.dp != 0) throw kolo::ContractError("--batch must divide by --dp");
    if (kolo::rank() == 0) {
      std::printf("%d ranks as %s; %d blocks of %d -> %d -> %d; global batch %d\n", kolo::size(),
                  grid.describe().c_str(), f.blocks, f.hidden, f.ffn, f.hidden, f.batch);
    }

    // 2. The model, built the same way on every rank (same seed: the same
    //    weights; tensor-parallel blocks keep their slice of them).
    torch::manual_seed(42);
    torch::nn::Sequential model;
    for (int b = 0; b < f.blocks; ++b) add_block(model, f, grid, b);
    model->push_back(torch::nn::Linear(f.hidden, f.hidden));  // the head
    // The teacher: a fixed random network the model learns to imitate.
    torch::nn::Sequential teacher(torch::nn::Linear(f.hidden, f.hidden), torch::nn::Tanh(),
                                  torch::nn::Linear(f.hidden, f.hidden));

    // 3. The pipeline: this rank's stage of the model (every rank when --pp 1).
    std::unique_ptr<kolo::Pipeline> pipe;
    if (f.pp > 1) {
      kolo::PipelineOptions options;
      options.schedule = kolo::parse_pipeline_schedule(f.schedule);
      options.micro_batches = f.micro_batches;
      options.stage_ranks = grid.pp_ranks();  // this rank's pipeline, stage order
      // The data-parallel optimizer below divides by its backward passes.
      options.optimizer_averages_micro_batches = true;
      pipe = std::make_unique<kolo::Pipeline>(model, options);
      model = pipe->module();  // keep only this stage's modules alive
    }

    // 4. The optimizer of this rank's parameters, averaging gradients across
    //    the data-parallel replicas of the same stage and tensor slice.
    torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(f.lr));
    kolo::ParallelOptimizerOptions dp;
    dp.process_set = grid.dp_set();
    dp.zero_stage = f.zero_stage;
    dp.backward_passes_per_step = f.pp > 1 ? f.micro_batches : 1;
    dp.name_prefix =
        "grad/pp" + std::to_string(grid.pp_rank()) + "/tp" + std::to_string(grid.tp_rank()) + "/";
    auto optimizer = kolo::make_parallel_optimizer(adam, *model, dp);

    // 5. Train. This replica's rows of each global batch.
    const bool reports = pipe == nullptr || pipe->is_last();
    const bool prints = reports && grid.dp_rank() == 0 && grid.tp_rank() == 0;
    const int64_t rows = f.batch / f.dp;
    torch::manual_seed(7);  // the data stream, the same on every rank
    const auto start = std::chrono::steady_clock::now();
    for (int step = 1; step <= f.steps; ++step) {
      torch::Tensor x = torch::randn({f.batch, f.hidden});
      torch::Tensor y;
      {
        torch::NoGradGuard no_grad;
        y = teacher->forward(x);
      }
      x = x.narrow(0, grid.dp_rank() * rows, rows);
      y = y.narrow(0, grid.dp_rank() * rows, rows);
      auto mse = [](const torch::Tensor& out, const torch::Tensor& target) {
        return torch::mse_loss(out, target);
      };
      optimizer->zero_grad();
      torch::Tensor loss;
      if (pipe) {
        loss = pipe->train_step(x, y, mse);
      } else {
        loss = mse(model->forward(x), y);
        loss.backward();
      }
      optimizer->step();
      if (reports && (step % f.log_every == 0 || step == f.steps)) {
        // The mean over the replicas (each saw its own rows).
        kolo::CallOptions over_replicas;
        over_replicas.process_set = grid.dp_set();
        const double mean = kolo::metric_average(loss.item<double>(), "loss", over_replicas);
        if (prints) {
          const double seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          std::printf("step %4d  loss %.5f  %.1f samples/s\n", step, mean,
                      step * f.batch / seconds);
          std::fflush(stdout);
        }
      }
    }
    // Only the reporting ranks average the last loss: everyone waits for
    // them before the engines shut down (shutting an engine down is collective).
    kolo::runtime().world().barrier({});
    kolo::shutdown();
    return 0;
  } catch (const kolo::Error& error) {
    std::fprintf(stderr, "model_parallel: %s\n", error.what());
    return 1;
  }
}

// The example's command line (flags.h).
#include "flags.h"

#include <CLI/CLI.hpp>
#include <cstdio>

namespace fashion_mnist {

std::optional<int> parse_flags(int argc, char** argv, Flags& flags) {
  CLI::App app{"Fashion-MNIST CNN trained data-parallel with kolo (run it under kolorun)"};
  app.add_option("--epochs", flags.epochs, "Epochs to train")->capture_default_str();
  app.add_option("--batch-size", flags.batch_size, "Images per worker per step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--optimizer", flags.optimizer.name,
                 "adam, sgd (with momentum), lars or lamb (layer-wise, for large batches: "
                 "docs/large_batch.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"adam", "sgd", "lars", "lamb"}));
  app.add_option("--lr", flags.optimizer.lr,
                 "Learning rate (with --scale-lr: for one worker); default: adam 0.001, sgd "
                 "0.05, lars and lamb the 8 x 2048 recipe's (docs/large_batch.md)")
      ->check(CLI::PositiveNumber);
  app.add_option("--momentum", flags.optimizer.momentum, "Momentum of sgd and lars")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.999999));
  app.add_option("--weight-decay", flags.optimizer.weight_decay,
                 "Weight decay; default: adam 0, sgd and lars 5e-4, lamb 0.01 (lars and lamb "
                 "leave biases and normalisation parameters undecayed)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--scale-lr", flags.scale_lr, "Multiply the learning rate by the number of workers");
  app.add_option("--warmup-epochs", flags.warmup_epochs,
                 "Epochs over which the rate climbs linearly: from --lr to the scaled rate with "
                 "--scale-lr, else from --lr / (warmup steps) to --lr")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr-decay", flags.lr_decay,
                 "After the warmup: constant, or cosine (down to 0 at the last epoch)")
      ->capture_default_str()
      ->check(CLI::IsMember({"constant", "cosine"}));
  CLI::Option* min_lr =
      app.add_option("--min-lr", flags.min_lr,
                     "--lr-decay cosine: the rate reached at the last epoch (a floor, so that a "
                     "short run keeps learning to its end)")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber);
  CLI::Option* trust_coefficient =
      app.add_option("--trust-coefficient", flags.optimizer.trust_coefficient,
                     "lars: eta, the trust ratio's coefficient (eta ||w|| / ||g||)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
  CLI::Option* trust_clip =
      app.add_flag("--trust-clip", flags.optimizer.trust_clip,
                   "lars: a layer's rate is min(lr, trust ratio) (NVIDIA's LARC clip mode) "
                   "instead of lr x trust ratio");
  CLI::Option* min_trust_ratio =
      app.add_option("--min-trust-ratio", flags.optimizer.min_trust_ratio,
                     "lamb: the least trust ratio ||w|| / ||u|| a layer's update is scaled by")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber);
  CLI::Option* max_trust_ratio =
      app.add_option("--max-trust-ratio", flags.optimizer.max_trust_ratio,
                     "lamb: the greatest trust ratio ||w|| / ||u|| a layer's update is scaled by")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-dir", flags.checkpoint_dir,
                 "Save after every epoch: <dir>/index.kolo and shards, rank 0 one shard "
                 "(--zero-stage 0) or every rank its own (stages 1-3); with --elastic, every "
                 "commit to <dir>/elastic.commit and each round's starting state to "
                 "<dir>/round<k>.start; with --strategy ps-*, every parameter server its "
                 "shards <dir>/ps-shard-<s>-of-<S>-step-<N>.kolo (its newest 3 saves)");
  app.add_flag("--resume", flags.resume,
               "Start from the checkpoint in --checkpoint-dir (same --zero-stage kind; a ZeRO "
               "checkpoint loads at any worker count; a parameter-server one at the worker and "
               "server counts that saved it)");
  app.add_flag("--resume-if-present", flags.resume_if_present,
               "As --resume when --checkpoint-dir holds a checkpoint, else start afresh: the "
               "same command line serves the first start and every restart (torchrun "
               "--max-restarts restarts the whole group with the same arguments)")
      ->excludes("--resume");
  app.add_option("--threads", flags.threads,
                 "Threads per worker (default: $OMP_NUM_THREADS, which kolorun sets, else 1)");
  app.add_option("--train-subset", flags.train_subset,
                 "Train on the first N images only (quick runs); 0 = all")
      ->capture_default_str();
  app.add_option("--test-subset", flags.test_subset, "Test on the first N images only; 0 = all")
      ->capture_default_str();
  app.add_option("--zero-stage", flags.zero_stage,
                 "0 = DistributedOptimizer; 1, 2, 3 = ZeRO stage (kolo::ZeroOptimizer)")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            if (value == "0" || value == "1" || value == "2" || value == "3") return "";
            return "is '" + value +
                   "'; use 0 (DistributedOptimizer, plain data parallelism) or the ZeRO stage 1, "
                   "2 or 3 (docs/zero.md)";
          },
          "0|1|2|3"))
      ->capture_default_str();
  app.add_option("--precision", flags.precision,
                 "Arithmetic of the forward pass: fp32, or bf16 (bf16 autocast; float32 weights, "
                 "gradients and optimizer state)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--device", flags.device,
                 "Where each worker trains: cpu, or cuda (its GPU: the local rank modulo the "
                 "GPUs present; gradients go through NCCL, or through host memory where "
                 "workers share a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--compression", flags.compression,
                 "Gradient compression: none, fp16, bf16, or powersgd (low-rank, with error "
                 "feedback: kolo::powersgd_hook)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "fp16", "bf16", "powersgd"}));
  app.add_option("--powersgd-rank", flags.powersgd_rank,
                 "--compression powersgd: rank of each gradient's approximation (torch's "
                 "matrix_approximation_rank)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--data-dir", flags.data_dir, "Directory of the gzipped IDX files")
      ->capture_default_str();
  app.add_option("--seed", flags.seed, "Seed shared by all workers")->capture_default_str();
  app.add_option("--progress-lines", flags.progress_lines, "Progress lines per epoch")
      ->capture_default_str();
  app.add_flag("--balance", flags.balance,
               "Split each global batch (workers x --batch-size) by the workers' measured speed "
               "(kolo::BatchBalancer) instead of evenly");
  app.add_flag("--elastic", flags.elastic,
               "Survive workers dying and joining under kolorun --min-np/--max-np "
               "(docs/elastic.md)");
  app.add_option("--commit-every", flags.commit_every,
                 "--elastic: commit the training state every N steps (and at each epoch's end)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--stop-at", flags.stop_at,
                 "--elastic: stop once the commit at EPOCH:STEP (1-based epoch, steps done) is "
                 "made, e.g. to replay one round of an elastic run (kolo-bench chaos)")
      ->type_name("EPOCH:STEP");
  app.add_option("--strategy", flags.strategy,
                 "allreduce: one worker per process (kolorun -np N); mirrored: --replicas "
                 "workers per process as threads sharing its one copy of the data "
                 "(kolo::MirroredStrategy); ps-sync, ps-async, ps-ssp: workers pull the "
                 "parameters from parameter servers and push gradients, the servers apply "
                 "the optimizer (kolorun -np W --servers S; docs/strategies.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"allreduce", "mirrored", "ps-sync", "ps-async", "ps-ssp"}));
  app.add_option("--replicas", flags.replicas,
                 "--strategy mirrored: workers per process (--batch-size and --threads are "
                 "per replica)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI::Option* max_staleness =
      app.add_option("--max-staleness", flags.max_staleness,
                     "--strategy ps-ssp: steps a worker may run ahead of the slowest one")
          ->capture_default_str()
          ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (min_lr->count() > 0 && flags.lr_decay != "cosine") {
    std::fprintf(stderr,
                 "fashion_mnist: --min-lr is the floor of --lr-decay cosine; add --lr-decay "
                 "cosine or drop --min-lr\n");
    return 2;
  }
  if ((trust_coefficient->count() > 0 || trust_clip->count() > 0) &&
      flags.optimizer.name != "lars") {
    std::fprintf(stderr,
                 "fashion_mnist: --trust-coefficient and --trust-clip set kolo::LARS; add "
                 "--optimizer lars or drop them (lamb's are --min-trust-ratio and "
                 "--max-trust-ratio)\n");
    return 2;
  }
  if ((min_trust_ratio->count() > 0 || max_trust_ratio->count() > 0) &&
      flags.optimizer.name != "lamb") {
    std::fprintf(stderr,
                 "fashion_mnist: --min-trust-ratio and --max-trust-ratio set kolo::LAMB; add "
                 "--optimizer lamb or drop them (lars's is --trust-coefficient)\n");
    return 2;
  }
  if (flags.optimizer.min_trust_ratio > flags.optimizer.max_trust_ratio) {
    std::fprintf(stderr,
                 "fashion_mnist: --min-trust-ratio %g is above --max-trust-ratio %g; the "
                 "clamp needs min <= max\n",
                 flags.optimizer.min_trust_ratio, flags.optimizer.max_trust_ratio);
    return 2;
  }
  if ((flags.resume || flags.resume_if_present) && flags.checkpoint_dir.empty()) {
    std::fprintf(stderr, "fashion_mnist: %s needs --checkpoint-dir\n",
                 flags.resume ? "--resume" : "--resume-if-present");
    return 2;
  }
  if (flags.resume_if_present && (flags.elastic || flags.strategy != "allreduce")) {
    std::fprintf(stderr,
                 "fashion_mnist: --resume-if-present is for data-parallel training under a "
                 "launcher that restarts the group (torchrun --max-restarts); --elastic and "
                 "--strategy %s take --resume\n",
                 flags.strategy.c_str());
    return 2;
  }
  if (flags.zero_stage != 0 && flags.compression != "none") {
    // kolo::ZeroOptimizer reduce-scatters full-precision gradients (docs/zero.md).
    std::fprintf(stderr,
                 "fashion_mnist: --compression %s works with --zero-stage 0 only (ZeRO stage %d "
                 "does not compress gradients); drop --compression or use --zero-stage 0\n",
                 flags.compression.c_str(), flags.zero_stage);
    return 2;
  }
  if (flags.elastic && flags.balance) {
    std::fprintf(stderr,
                 "fashion_mnist: --balance works without --elastic only (an elastic round "
                 "re-shards the data by worker, not by global batch); drop one of them\n");
    return 2;
  }
  if (flags.elastic && flags.zero_stage != 0) {
    std::fprintf(
        stderr,
        "fashion_mnist: --elastic cannot be combined with --zero-stage %d: ZeRO shards "
        "the optimizer's state across a fixed set of workers, while an elastic commit holds the "
        "whole state on every worker; use --zero-stage 0 (the default) with --elastic\n",
        flags.zero_stage);
    return 2;
  }
  if (flags.elastic && flags.strategy != "allreduce") {
    std::fprintf(stderr,
                 "fashion_mnist: --elastic trains one worker per process; drop --strategy %s "
                 "or --elastic\n",
                 flags.strategy.c_str());
    return 2;
  }
  if (max_staleness->count() > 0 && flags.strategy != "ps-ssp") {
    std::fprintf(stderr,
                 "fashion_mnist: --max-staleness bounds --strategy ps-ssp only; add "
                 "--strategy ps-ssp or drop --max-staleness\n");
    return 2;
  }
  if (flags.device == "cuda" && (flags.strategy != "allreduce" || flags.elastic)) {
    std::fprintf(stderr,
                 "fashion_mnist: --device cuda trains with --strategy allreduce (the default) "
                 "and without --elastic; the other strategies keep their models on the CPU\n");
    return 2;
  }
  if (on_parameter_servers(flags)) {
    // The servers apply one element-wise optimizer at one rate to the
    // gradients as they arrive; what would need the whole model on a worker,
    // a rate schedule or a weighting of the workers' gradients is refused.
    const char* refused = nullptr;
    if (flags.optimizer.name == "lars" || flags.optimizer.name == "lamb") {
      refused =
          "--optimizer lars/lamb (layer-wise: the servers hold slices, not layers; use adam "
          "or sgd)";
    } else if (flags.warmup_epochs > 0 || flags.scale_lr || flags.lr_decay != "constant") {
      refused =
          "--warmup-epochs, --scale-lr and --lr-decay (the servers' optimizer keeps the "
          "rate --lr)";
    } else if (flags.zero_stage != 0 || flags.compression != "none" || flags.balance) {
      refused = "--zero-stage, --compression and --balance (allreduce options)";
    }
    if (refused) {
      std::fprintf(stderr, "fashion_mnist: --strategy %s cannot be combined with %s\n",
                   flags.strategy.c_str(), refused);
      return 2;
    }
  }
  return std::nullopt;
}

bool on_parameter_servers(const Flags& flags) { return flags.strategy.rfind("ps-", 0) == 0; }

}  // namespace fashion_mnist

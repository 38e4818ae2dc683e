// The worker side of `kolo-bench scaling` (see scaling_bench.h): one process
// of one configuration trains the model and prints its throughput as JSON.
#define USE_C10D_GLOO 1  // ProcessGroupGloo.hpp is empty without it
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "fashion_mnist_data.h"  // examples/fashion_mnist, compiled into kolo-bench
#include "kolo/core/batch_balancer.h"
#include "kolo/core/runtime.h"
#include "kolo/core/store.h"
#include "kolo/torch/broadcast.h"
#include "kolo/torch/mirrored.h"
#include "kolo/torch/optimizer.h"
#include "scaling_bench.h"
#include "scaling_models.h"

namespace kolo::bench {
namespace {

using Clock = std::chrono::steady_clock;

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::atoi(value) : fallback;
}

// Training images as uint8 (N, 1, 28, 28) and labels; converted to float one
// batch at a time, as a real input pipeline would.
struct Data {
  torch::Tensor images;
  torch::Tensor labels;
};

Data load_data(const ScalingWorkerOptions& options) {
  if (options.synthetic) {
    constexpr int64_t kImages = 4096;
    torch::manual_seed(7);
    return {torch::randint(0, 256, {kImages, 1, 28, 28}, torch::kUInt8),
            torch::randint(0, 10, {kImages}, torch::kLong)};
  }
  fashion_mnist::Split train = fashion_mnist::load_split(options.data_dir, "train");
  return {train.images, train.labels};
}

// The model, its parameters by name, and its optimizer (Adam for the CNN as
// the seed, SGD for the MLP).
struct Trainee {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

Trainee make_trainee(const std::string& model) {
  torch::manual_seed(42);
  Trainee t;
  if (model == "cnn") {
    ScalingCnn cnn;
    t.module = cnn.ptr();
    t.forward = [cnn](const torch::Tensor& x) mutable { return cnn->forward(x); };
    t.optimizer =
        std::make_unique<torch::optim::Adam>(cnn->parameters(), torch::optim::AdamOptions(1e-3));
  } else if (model == "mlp") {
    ScalingMlp mlp;
    t.module = mlp.ptr();
    t.forward = [mlp](const torch::Tensor& x) mutable { return mlp->forward(x); };
    t.optimizer =
        std::make_unique<torch::optim::SGD>(mlp->parameters(), torch::optim::SGDOptions(0.01));
  } else {
    throw std::invalid_argument("kolo-bench scaling --worker: unknown --model '" + model +
                                "' (cnn or mlp)");
  }
  return t;
}

// This process's peak resident memory (VmHWM), bytes; 0 if unknown.
double peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024;  // kB
  }
  return 0;
}

// The images and labels of rows [start, start + count), images as float in [0, 1].
std::pair<torch::Tensor, torch::Tensor> batch_of(const Data& data, int64_t start, int64_t count) {
  return {data.images.slice(0, start, start + count).to(torch::kFloat).div_(255.0),
          data.labels.slice(0, start, start + count)};
}

// Step k's global batch of `global` images is a contiguous slice of the data
// (wrapping around); where the part at `offset` in it starts.
int64_t batch_start(const Data& data, int64_t step, int64_t global, int64_t offset) {
  return (step * global + offset) % (data.images.size(0) - global);
}

// kolo_mirrored: `options.replicas` replicas of the model as threads of this
// process (kolo::MirroredStrategy), one data set in memory, --threads each;
// one JSON row per replica, as if each were a worker process.
int run_mirrored_worker(const ScalingWorkerOptions& options, const Data& data) {
  kolo::init();  // kolorun -np 1: the replicas' world is this process's
  kolo::MirroredOptions mirrored;
  mirrored.replicas = options.replicas;
  mirrored.threads_per_replica = options.threads;
  kolo::MirroredStrategy strategy(mirrored);
  // Every replica's model (the models are not torch::nn::Cloneable; replica
  // 0's weights are broadcast below), built here: torch's generator is global.
  std::vector<Trainee> trainees;
  for (int r = 0; r < strategy.replicas(); ++r) trainees.push_back(make_trainee(options.model));
  const int64_t batch = options.batch;
  const int64_t global = batch * strategy.num_replicas_in_sync();
  if (data.images.size(0) <= global)
    throw std::invalid_argument(
        "kolo-bench scaling --worker: " + std::to_string(data.images.size(0)) +
        " images cannot fill a global batch of " + std::to_string(global));
  std::vector<nlohmann::json> rows(strategy.replicas());
  strategy.run([&](kolo::ReplicaContext& replica) {
    Trainee& trainee = trainees[replica.replica()];
    trainee.module->train();
    kolo::broadcast_parameters(*trainee.module, /*root=*/0, replica.options());
    auto distributed = replica.options<kolo::DistributedOptimizerOptions>();
    if (options.bucket_bytes >= 0) distributed.bucket_bytes = options.bucket_bytes;
    kolo::DistributedOptimizer optimizer(*trainee.optimizer, trainee.module->named_parameters(),
                                         distributed);
    auto train_step = [&](int64_t step) {
      const auto [images, labels] =
          batch_of(data, batch_start(data, step, global, replica.rank() * batch), batch);
      optimizer.zero_grad();
      torch::nn::functional::cross_entropy(trainee.forward(images), labels).backward();
      optimizer.step();
    };
    int64_t step = 0;
    for (int i = 0; i < options.warmup_steps; ++i) train_step(step++);
    const Clock::time_point start = Clock::now();
    for (int i = 0; i < options.steps; ++i) train_step(step++);
    const double elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    rows[replica.replica()] = {{"rank", replica.rank()},
                               {"world", replica.size()},
                               {"threads", options.threads},
                               {"batch", batch},
                               {"images_per_sec", batch * options.steps / elapsed_s},
                               {"step_ms", 1000.0 * elapsed_s / options.steps}};
  });
  int64_t bytes = 0;
  for (const torch::Tensor& p : trainees[0].module->parameters()) {
    bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  const double resident = peak_resident_bytes();
  for (nlohmann::json& row : rows) {
    row["allreduced_bytes_per_step"] = bytes;
    row["pid"] = getpid();
    row["resident_bytes"] = resident;
    std::printf("%s\n", row.dump().c_str());
  }
  std::fflush(stdout);
  kolo::shutdown();
  return 0;
}

}  // namespace

int run_scaling_worker(const ScalingWorkerOptions& options) {
  torch::set_num_threads(options.threads);
  const bool use_kolo = options.system == "kolo";
  const bool use_c10d = options.system == "c10d_gloo";
  if (!use_kolo && !use_c10d && options.system != "local")
    throw std::invalid_argument("kolo-bench scaling --worker: unknown --system '" + options.system +
                                "' (kolo, c10d_gloo or local)");

  if (use_kolo && options.replicas > 0) return run_mirrored_worker(options, load_data(options));

  int rank = env_int("RANK", 0);
  int world = env_int("WORLD_SIZE", 1);
  if (use_kolo) {
    kolo::init();
    rank = kolo::rank();
    world = kolo::size();
  }
  const Data data = load_data(options);
  Trainee trainee = make_trainee(options.model);
  trainee.module->train();

  // The gradient exchange of each system.
  std::unique_ptr<kolo::DistributedOptimizer> kolo_optimizer;
  std::shared_ptr<kolo::PowerSGDHook> powersgd;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  if (use_kolo) {
    kolo::broadcast_parameters(*trainee.module, /*root=*/0);
    kolo::DistributedOptimizerOptions distributed;
    if (options.bucket_bytes >= 0) distributed.bucket_bytes = options.bucket_bytes;
    distributed.compression = kolo::parse_compression(options.compression);
    distributed.gradient_as_bucket_view = options.bucket_view;
    if (options.powersgd_rank > 0) {
      kolo::PowerSGDOptions psgd;
      psgd.rank = options.powersgd_rank;
      psgd.start_step = 1;  // step 0 (warm-up) lays the buckets out
      powersgd = kolo::powersgd_hook(psgd);
      distributed.comm_hook = powersgd;
    }
    kolo_optimizer = std::make_unique<kolo::DistributedOptimizer>(
        *trainee.optimizer, trainee.module->named_parameters(), distributed);
  } else if (use_c10d) {
    // Today's C++ recipe (pytorch/examples#809): a Gloo process group, rank
    // 0's weights broadcast, then every gradient allreduced after backward().
    auto store = c10::make_intrusive<c10d::FileStore>(options.store_path, world);
    auto group_options = c10d::ProcessGroupGloo::Options::create();
    group_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, group_options);
    torch::NoGradGuard no_grad;
    for (torch::Tensor& p : trainee.module->parameters()) {
      std::vector<at::Tensor> one{p};
      group->broadcast(one)->wait();
    }
  }
  torch::manual_seed(1000 + static_cast<uint64_t>(rank));  // dropout differs per rank

  // kolo_balanced: the same global batch, split by the workers' measured
  // compute speed; each worker's loss is weighted by its share.
  const int64_t batch = options.batch;
  const int64_t global = batch * world;
  std::unique_ptr<kolo::BatchBalancer> balancer;
  if (use_kolo && options.balance) {
    kolo::BatchBalancerOptions balance;
    balance.global_batch = global;
    // Batches in multiples of 4 images: few distinct shapes, each of which
    // costs oneDNN a one-time kernel setup.
    if (global % 4 == 0 && global / 4 >= world) balance.granularity = 4;
    balancer = std::make_unique<kolo::BatchBalancer>(balance);
  }

  const int64_t n = data.images.size(0);
  if (n <= global)
    throw std::invalid_argument("kolo-bench scaling --worker: " + std::to_string(n) +
                                " images cannot fill a global batch of " + std::to_string(global));
  int64_t step_index = 0;
  // One training step; returns the images it used.
  auto train_step = [&]() -> int64_t {
    // Step k's global batch is a contiguous slice; rank r takes its part.
    const int64_t count = balancer ? balancer->batch() : batch;
    const int64_t offset = balancer ? balancer->offset() : rank * batch;
    const int64_t start = batch_start(data, step_index, global, offset);
    ++step_index;
    const Clock::time_point compute_start = Clock::now();
    const auto [images, labels] = batch_of(data, start, count);
    if (kolo_optimizer)
      kolo_optimizer->zero_grad();
    else
      trainee.optimizer->zero_grad();
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(trainee.forward(images), labels);
    if (balancer) {
      (loss * balancer->gradient_weight()).backward();
      balancer->record(std::chrono::duration<double>(Clock::now() - compute_start).count());
    } else {
      loss.backward();
    }
    if (kolo_optimizer) {
      kolo_optimizer->step();
      return count;
    }
    if (group) {
      for (torch::Tensor& p : trainee.module->parameters()) {
        std::vector<at::Tensor> one{p.grad()};
        group->allreduce(one)->wait();
        p.grad().div_(world);
      }
    }
    trainee.optimizer->step();
    return count;
  };

  // Independent workers (sync_dir): every timed step must run beside the
  // others, as the ceiling means; a worker that ran its last steps alone
  // would be faster than side by side. So they start timing together and
  // keep training, untimed, until the last one has finished (through kolo's
  // file store in the directory the driver gives them).
  std::shared_ptr<kolo::Store> side_by_side;
  if (!options.sync_dir.empty() && world > 1)
    side_by_side = kolo::make_file_store(options.sync_dir);
  auto all_ranks = [&](const std::string& what) {
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) keys.push_back(what + "." + std::to_string(r));
    return keys;
  };

  for (int i = 0; i < options.warmup_steps; ++i) train_step();
  if (group) group->barrier()->wait();
  if (side_by_side) {
    side_by_side->set("ready." + std::to_string(rank), {});
    side_by_side->wait(all_ranks("ready"), std::chrono::seconds(options.sync_timeout_s));
  }
  const Clock::time_point start = Clock::now();
  int64_t images = 0;
  for (int i = 0; i < options.steps; ++i) images += train_step();
  const double elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (side_by_side) {
    side_by_side->set("done." + std::to_string(rank), {});
    const std::vector<std::string> done = all_ranks("done");
    while (!side_by_side->check(done)) train_step();
  }

  nlohmann::json row = {{"rank", rank},
                        {"world", world},
                        {"threads", options.threads},
                        {"batch", static_cast<double>(images) / options.steps},
                        {"images_per_sec", static_cast<double>(images) / elapsed_s},
                        {"step_ms", 1000.0 * elapsed_s / options.steps},
                        {"pid", getpid()},
                        {"resident_bytes", peak_resident_bytes()}};
  if (use_kolo) {
    // What this worker hands to allreduce per step: every gradient, or
    // PowerSGD's factors and uncompressed rest (float32 elements).
    int64_t bytes = 0;
    for (const torch::Tensor& p : trainee.module->parameters()) {
      bytes += p.numel() * static_cast<int64_t>(p.element_size());
    }
    if (powersgd) bytes = powersgd->stats().sent_elements * 4;
    row["allreduced_bytes_per_step"] = bytes;
  }
  std::printf("%s\n", row.dump().c_str());
  std::fflush(stdout);
  if (group) group->barrier()->wait();  // nobody leaves while a peer still reduces
  kolo_optimizer.reset();
  if (use_kolo) kolo::shutdown();
  return 0;
}

}  // namespace kolo::bench

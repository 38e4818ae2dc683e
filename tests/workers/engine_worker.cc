// Worker for the engine's integration tests: kolo::init() from the launcher's
// variables, then the engine of the default runtime on whatever backend was
// chosen. Every rank: named allreduces submitted in a rank-dependent order,
// an allgather with per-rank first dimensions, a process set of all ranks but
// the last, and join() after a rank-dependent number of steps. Prints
// "rank R: engine ok" and exits 0, or "rank R: FAIL ..." and exits 1.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "kolo/core/engine.h"
#include "kolo/core/runtime.h"

namespace {

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void run() {
  kolo::init();
  const int rank = kolo::rank();
  const int n = kolo::size();
  kolo::Engine& engine = kolo::runtime().engine();

  // Allreduces in reverse order on odd ranks, for a few steps (name reuse).
  constexpr int kTensors = 30;
  std::vector<std::vector<float>> grads(kTensors, std::vector<float>(100));
  for (int step = 0; step < 5; ++step) {
    std::vector<kolo::Handle> handles(kTensors);
    for (int k = 0; k < kTensors; ++k) {
      const int t = rank % 2 == 0 ? k : kTensors - 1 - k;
      std::fill(grads[t].begin(), grads[t].end(), float(rank + t + step));
      kolo::TensorView v{grads[t].data(), kolo::DType::kF32, {100}};
      handles[t] =
          engine.allreduce_async("grad/" + std::to_string(t), v, v, {kolo::ReduceOp::kSum});
    }
    for (int t = 0; t < kTensors; ++t) {
      handles[t].wait();
      const float expected = float(n * (t + step) + n * (n - 1) / 2);
      expect(grads[t][99] == expected, "grad/" + std::to_string(t) + " = " +
                                           std::to_string(grads[t][99]) + ", expected " +
                                           std::to_string(expected));
    }
  }

  // Allgather: rank r contributes r + 1 rows.
  std::vector<float> rows(static_cast<size_t>(rank + 1) * 2, float(rank));
  std::vector<float> gathered;
  kolo::TensorView in{rows.data(), kolo::DType::kF32, {rank + 1, 2}};
  engine
      .allgather_async("rows", in,
                       [&](const std::vector<int64_t>& shape) {
                         gathered.resize(static_cast<size_t>(shape[0] * shape[1]));
                         return kolo::TensorView{gathered.data(), kolo::DType::kF32, shape};
                       })
      .wait();
  expect(gathered.size() == static_cast<size_t>(n * (n + 1)), "allgather size");
  expect(gathered.back() == float(n - 1), "allgather last row");

  // A process set of all ranks but the last (every rank creates it).
  std::vector<int> members;
  for (int r = 0; r < std::max(1, n - 1); ++r) members.push_back(r);
  const int set = engine.add_process_set(members).id();
  if (rank < static_cast<int>(members.size())) {
    std::vector<float> x(4, float(rank + 1));
    kolo::TensorView v{x.data(), kolo::DType::kF32, {4}};
    kolo::RequestOptions o;
    o.op = kolo::ReduceOp::kSum;
    o.process_set = set;
    engine.allreduce("in-set", v, v, o);
    const int m = static_cast<int>(members.size());
    expect(x[0] == float(m * (m + 1) / 2), "process set sum " + std::to_string(x[0]));
  }

  // Uneven steps, then join: rank r runs r + 1 steps; averages divide by the
  // ranks still running.
  for (int step = 0; step <= rank; ++step) {
    std::vector<float> x(8, float(rank));
    kolo::TensorView v{x.data(), kolo::DType::kF32, {8}};
    engine.allreduce("uneven", v, v);
    float sum = 0;
    int running = 0;
    for (int r = step; r < n; ++r) {
      sum += float(r);
      ++running;
    }
    expect(x[7] == sum / float(running), "join average at step " + std::to_string(step));
  }
  const int last = engine.join();
  expect(last == n - 1, "join returned " + std::to_string(last));
  std::printf("rank %d: engine ok (%s, %llu collectives for %llu responses)\n", rank,
              kolo::runtime().world().backend(),
              static_cast<unsigned long long>(engine.stats().collectives),
              static_cast<unsigned long long>(engine.stats().responses));
  std::fflush(stdout);
  kolo::shutdown();
}

}  // namespace

int main() {
  try {
    run();
    return 0;
  } catch (const std::exception& e) {
    std::printf("rank %s: FAIL %s\n", std::getenv("KOLO_RANK") ? std::getenv("KOLO_RANK") : "?",
                e.what());
    std::fflush(stdout);
    return 1;
  }
}

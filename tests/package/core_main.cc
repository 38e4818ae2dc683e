// The out-of-tree consumer of kolo's core alone (no libtorch), built by the
// add_subdirectory mode of tests/package: a project that embeds kolo's source
// tree and uses only the engine. Run under kolorun:
//   kolorun -np 2 ./kolo_consumer
// Each rank sums, through the engine, 1000 floats holding its rank + 1, and
// checks that every element came back as 1 + 2 + ... + size. Exit status 0
// only if that holds on this rank.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kolo/kolo.h"
#include "same_kolo.h"

int main() {
  kolo::init();
  const int rank = kolo::rank();
  const int size = kolo::size();

  if (!same_kolo(rank)) return 1;

  constexpr int64_t kCount = 1000;
  std::vector<float> values(kCount, static_cast<float>(rank + 1));
  const kolo::TensorView view{values.data(), kolo::DType::kF32, {kCount}};
  kolo::RequestOptions sum;
  sum.op = kolo::ReduceOp::kSum;
  kolo::runtime().engine().allreduce("consumer/values", view, view, sum);

  const float expected = static_cast<float>(size * (size + 1) / 2);
  int wrong = 0;
  for (float v : values) wrong += v != expected;
  std::printf("kolo core consumer: rank %d of %d, kolo %s, sum %g (expected %g), %d wrong: %s\n",
              rank, size, kolo::version(), values[0], expected, wrong,
              wrong == 0 ? "ok" : "FAILED");
  kolo::shutdown();
  return wrong == 0 ? 0 : 1;
}

// Worker that checks the collectives end to end, started by kolorun or mpirun.
//
//   kolo_check_worker [--counts 0,1,7,1000] [--quick] [--p2p]
//
// kolo::init() from the launcher's variables; prints
// "rank=R size=S local_rank=L local_size=LS cross_rank=C cross_size=CS backend=B source=X";
// runs the collective correctness matrix (tests/support/collective_check.h) on
// the world communicator; prints every mismatch; prints "check passed" and exits
// 0, or exits 1 on mismatches and 2 on an error (message on stderr).
// --quick keeps the run short for oversubscribed ranks: f32/i32/f16 only, sum
// and max only. --p2p runs the point-to-point checks (tests/support/p2p_check.h)
// on the world communicator instead of the collective matrix.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "collective_check.h"
#include "kolo/kolo.h"
#include "p2p_check.h"

int main(int argc, char** argv) {
  kolo::testing::CheckMatrix matrix;
  matrix.counts = {0, 1, 7, 1000, 65537};
  bool quick = false;
  bool p2p = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--counts" && i + 1 < argc) {
      matrix.counts.clear();
      std::stringstream list(argv[++i]);
      std::string item;
      while (std::getline(list, item, ',')) matrix.counts.push_back(std::stoul(item));
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--p2p") {
      p2p = true;
    } else {
      std::fprintf(stderr, "kolo_check_worker: unknown argument %s\n", a.c_str());
      return 64;
    }
  }
  if (quick) {
    matrix.dtypes = {kolo::DType::kF32, kolo::DType::kI32, kolo::DType::kF16};
    matrix.ops = {kolo::ReduceOp::kSum, kolo::ReduceOp::kMax};
  }

  int rank = -1;
  try {
    kolo::init();
    rank = kolo::rank();
    const auto& topology = kolo::runtime().topology();
    std::printf(
        "rank=%d size=%d local_rank=%d local_size=%d cross_rank=%d cross_size=%d "
        "backend=%s source=%s\n",
        kolo::rank(), kolo::size(), kolo::local_rank(), kolo::local_size(), kolo::cross_rank(),
        kolo::cross_size(), kolo::runtime().world().backend(), topology.source.c_str());
    std::fflush(stdout);
    auto failures = p2p ? kolo::testing::check_point_to_point(kolo::runtime().world())
                        : kolo::testing::check_collectives(kolo::runtime().world(), matrix);
    if (p2p) kolo::runtime().world().barrier({});  // peers may still drain their transfers
    for (const auto& failure : failures) std::printf("FAIL %s\n", failure.c_str());
    kolo::shutdown();
    if (!failures.empty()) {
      std::printf("check failed: %zu mismatches\n", failures.size());
      return 1;
    }
    std::printf("check passed\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolo_check_worker: rank %d: %s\n", rank, e.what());
    return 2;
  }
}

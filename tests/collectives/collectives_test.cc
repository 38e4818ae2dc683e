// Ranks as threads: the collective correctness matrix on every backend that
// runs inside one process (threads, shm, gloo), world sizes 1-8, plus argument
// mismatches (every rank gets ContractError, none hangs) and timeouts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "collective_check.h"
#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"
#include "thread_ranks.h"

namespace kolo {
namespace {

using std::chrono::milliseconds;
using testing::run_ranks;
using testing::run_ranks_catching;

// Per-call timeout of the matrix: generous for 8 threads sharing 2 cores, and
// well below run_ranks' watchdog so that a hang is reported as TimeoutError.
constexpr milliseconds kMatrixTimeout{90000};

std::vector<std::string> backends_under_test() {
  std::vector<std::string> names = {"threads", "shm"};
#if KOLO_HAVE_GLOO
  names.push_back("gloo");
#endif
  return names;
}

// A prefix no other test or concurrently running test process uses (shm names
// its segment after it).
std::string unique_prefix(const std::string& what) {
  static std::atomic<int> counter{0};
  return "kolo-test-" + std::to_string(getpid()) + "-" + what + "-" + std::to_string(counter++);
}

// Builds the communicator of `rank` inside its thread. For "threads" the whole
// world is built up front and handed out.
class World {
 public:
  World(const std::string& backend, int size, milliseconds timeout)
      : backend_(backend), size_(size), timeout_(timeout) {
    if (backend == "threads") {
      thread_comms_ = make_thread_communicators(size, timeout);
    } else {
      store_ = make_memory_store();
      prefix_ = unique_prefix(backend + "-" + std::to_string(size));
    }
  }

  std::unique_ptr<Communicator> connect(int rank) {
    if (backend_ == "threads") return std::move(thread_comms_[rank]);
    CommunicatorOptions options;
    options.rank = rank;
    options.size = size_;
    options.store = store_;
    options.prefix = prefix_;
    options.timeout = timeout_;
    return make_communicator(backend_, options);
  }

 private:
  std::string backend_;
  int size_;
  milliseconds timeout_;
  std::vector<std::unique_ptr<Communicator>> thread_comms_;
  std::shared_ptr<Store> store_;
  std::string prefix_;
};

// ---- the matrix -----------------------------------------------------------------

class Matrix : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Runs `matrix` on every rank of a `backend` world of `size` and expects no
// mismatch (the first 30 are reported).
void expect_matrix_passes(const std::string& backend, int size,
                          const testing::CheckMatrix& matrix) {
  World world(backend, size, kMatrixTimeout);
  std::vector<std::vector<std::string>> failures(size);
  run_ranks(size, [&](int rank) {
    auto comm = world.connect(rank);
    ASSERT_EQ(comm->rank(), rank);
    ASSERT_EQ(comm->size(), size);
    failures[rank] = testing::check_collectives(*comm, matrix);
  });
  size_t total = 0;
  std::string report;
  for (const auto& lines : failures) {
    for (const auto& line : lines) {
      if (total++ < 30) report += line + "\n";
    }
  }
  EXPECT_EQ(total, 0u) << report;
}

TEST_P(Matrix, EveryCollectiveOpDtypeAndCount) {
  expect_matrix_passes(std::get<0>(GetParam()), std::get<1>(GetParam()), testing::CheckMatrix{});
}

std::string matrix_name(const ::testing::TestParamInfo<Matrix::ParamType>& info) {
  return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Backends, Matrix,
                         ::testing::Combine(::testing::ValuesIn(backends_under_test()),
                                            ::testing::Values(1, 2, 3, 4, 5, 8)),
                         matrix_name);

// Reductions that reduce.h accumulates in a wider type (f16/bf16 sums and
// averages, integers with a scale or an average) above the backends' small
// direct path: gloo sends them in the caller's dtype to each block's owner,
// which reduces in rank order (gloo_communicator.cc, direct_reduce_scatter),
// instead of its float32/double ring. Odd counts (blocks of unequal length),
// both scale factors, in place and not, every world size from 2 to 5.
class StagedMatrix : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(StagedMatrix, LargeStagedReductionsMatchTheReference) {
  testing::CheckMatrix matrix;
  matrix.counts = {100003};  // 195 KiB of f16: past the 64 KiB direct path, several segments
  matrix.dtypes = {DType::kF16, DType::kBF16, DType::kI32, DType::kU8};
  matrix.ops = {ReduceOp::kSum, ReduceOp::kAverage};
  matrix.collectives = {"allreduce", "reducescatter"};
  matrix.full_matrix_max_count = matrix.counts[0];
  expect_matrix_passes(std::get<0>(GetParam()), std::get<1>(GetParam()), matrix);
}

INSTANTIATE_TEST_SUITE_P(Backends, StagedMatrix,
                         ::testing::Combine(::testing::ValuesIn(backends_under_test()),
                                            ::testing::Values(2, 3, 5)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---- the checker itself catches wrong results ----------------------------------

// Delegates to a correct communicator, then damages selected results.
class DamagingCommunicator final : public Communicator {
 public:
  explicit DamagingCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return "damaging"; }
  void allreduce(const void* in, void* out, size_t count, DType dtype,
                 const AllreduceOptions& options) override {
    inner_->allreduce(in, out, count, dtype, options);
    // Off by one in element 3 of rank 1's f32 sums.
    if (rank() == 1 && dtype == DType::kF32 && options.op == ReduceOp::kSum && count > 3) {
      static_cast<float*>(out)[3] += 1.0f;
    }
  }
  void allgather(const void* in, void* out, size_t count, DType dtype,
                 const CollectiveOptions& options) override {
    inner_->allgather(in, out, count, dtype, options);
    // Rank 0's block lands in every block of rank 0's result.
    const size_t block = count * dtype_size(dtype);
    if (rank() == 0) {
      for (int k = 1; k < size(); ++k) std::memcpy(static_cast<char*>(out) + k * block, out, block);
    }
  }
  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType dtype,
                  const CollectiveOptions& options) override {
    inner_->allgatherv(in, out, counts, dtype, options);
  }
  void broadcast(void* buffer, size_t count, DType dtype,
                 const BroadcastOptions& options) override {
    std::vector<char> keep(static_cast<char*>(buffer),
                           static_cast<char*>(buffer) + count * dtype_size(dtype));
    inner_->broadcast(buffer, count, dtype, options);
    // Non-roots keep their old contents when the root is 1.
    if (options.root == 1 && rank() != 1) std::memcpy(buffer, keep.data(), keep.size());
  }
  void reducescatter(const void* in, void* out, size_t count, DType dtype,
                     const AllreduceOptions& options) override {
    inner_->reducescatter(in, out, count, dtype, options);
  }
  void alltoall(const void* in, void* out, size_t count, DType dtype,
                const CollectiveOptions& options) override {
    inner_->alltoall(in, out, count, dtype, options);
  }
  void alltoallv(const void* in, const std::vector<size_t>& send_counts, void* out,
                 const std::vector<size_t>& recv_counts, DType dtype,
                 const CollectiveOptions& options) override {
    inner_->alltoallv(in, send_counts, out, recv_counts, dtype, options);
  }
  void barrier(const CollectiveOptions& options) override { inner_->barrier(options); }

 private:
  std::unique_ptr<Communicator> inner_;
};

TEST(CheckCollectives, ReportsDamagedResults) {
  constexpr int kSize = 2;
  auto comms = make_thread_communicators(kSize, std::chrono::seconds(60));
  testing::CheckMatrix matrix;
  matrix.counts = {7};
  matrix.dtypes = {DType::kF32, DType::kI32};
  std::vector<std::vector<std::string>> failures(kSize);
  run_ranks(kSize, [&](int rank) {
    DamagingCommunicator comm(std::move(comms[rank]));
    failures[rank] = testing::check_collectives(comm, matrix);
  });
  auto contains = [](const std::vector<std::string>& lines, const std::string& a,
                     const std::string& b) {
    for (const auto& line : lines) {
      if (line.find(a) != std::string::npos && line.find(b) != std::string::npos) return true;
    }
    return false;
  };
  std::string all;
  for (const auto& lines : failures) {
    for (const auto& line : lines) all += line + "\n";
  }
  EXPECT_TRUE(contains(failures[1], "allreduce f32 sum count=7 out_of_place", "rank 1 index 3"))
      << all;
  EXPECT_TRUE(contains(failures[1], "allreduce f32 sum count=7 in_place", "rank 1 index 3")) << all;
  EXPECT_TRUE(contains(failures[0], "allgather f32 count=7", "rank 0 index 7")) << all;
  EXPECT_TRUE(contains(failures[0], "broadcast i32 count=7 root=1", "rank 0 index 0")) << all;
  // Nothing else was damaged: no other collective, rank or op is reported.
  for (const auto& lines : failures) {
    for (const auto& line : lines) {
      const bool expected =
          line.rfind("allreduce f32 sum", 0) == 0 || line.rfind("allgather f32", 0) == 0 ||
          line.rfind("allgather i32", 0) == 0 || line.find("root=1") != std::string::npos;
      EXPECT_TRUE(expected) << line;
    }
  }
  EXPECT_TRUE(failures[1].size() >= 2);
}

// ---- mismatches: every rank gets ContractError ------------------------------

class Mismatch : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr int kSize = 3;
  // Short enough that a backend that hangs instead of reporting fails the test
  // quickly (with TimeoutError, which is not a ContractError).
  static constexpr milliseconds kTimeout{15000};

  // Runs `call(comm, rank)` on every rank of a fresh world and expects each rank
  // to throw ContractError whose message contains every one of `words`.
  void expect_contract_error_everywhere(const std::function<void(Communicator&, int)>& call,
                                        const std::vector<std::string>& words) {
    World world(GetParam(), kSize, kTimeout);
    const auto errors = run_ranks_catching(kSize, [&](int rank) {
      auto comm = world.connect(rank);
      call(*comm, rank);
    });
    for (int rank = 0; rank < kSize; ++rank) {
      ASSERT_TRUE(errors[rank]) << "rank " << rank << " returned normally";
      try {
        std::rethrow_exception(errors[rank]);
      } catch (const ContractError& e) {
        for (const auto& word : words) {
          EXPECT_NE(std::string(e.what()).find(word), std::string::npos)
              << "rank " << rank << ": '" << word << "' not in: " << e.what();
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank
                      << " threw something else than ContractError: " << e.what();
      }
    }
  }
};

TEST_P(Mismatch, Count) {
  expect_contract_error_everywhere(
      [](Communicator& comm, int rank) {
        std::vector<float> data(8, 1.0f);
        comm.allreduce(data.data(), data.data(), rank == 1 ? 7 : 8, DType::kF32, {});
      },
      {"allreduce", "count", "rank 1"});
}

TEST_P(Mismatch, Dtype) {
  expect_contract_error_everywhere(
      [](Communicator& comm, int rank) {
        std::vector<double> data(4, 1.0);
        comm.allreduce(data.data(), data.data(), 4, rank == 2 ? DType::kF64 : DType::kF32, {});
      },
      {"allreduce", "dtype", "rank 2", "f64", "f32"});
}

TEST_P(Mismatch, Op) {
  expect_contract_error_everywhere(
      [](Communicator& comm, int rank) {
        std::vector<int32_t> data(4, 1);
        AllreduceOptions options;
        options.op = rank == 1 ? ReduceOp::kMax : ReduceOp::kSum;
        comm.allreduce(data.data(), data.data(), 4, DType::kI32, options);
      },
      {"allreduce", "op", "rank 1", "max", "sum"});
}

TEST_P(Mismatch, Root) {
  expect_contract_error_everywhere(
      [](Communicator& comm, int rank) {
        std::vector<uint8_t> data(16, 0);
        BroadcastOptions options;
        options.root = rank == 2 ? 1 : 0;
        comm.broadcast(data.data(), data.size(), DType::kU8, options);
      },
      {"broadcast", "root", "rank 2"});
}

INSTANTIATE_TEST_SUITE_P(Backends, Mismatch, ::testing::ValuesIn(backends_under_test()),
                         [](const auto& info) { return info.param; });

// ---- threads backend: timeouts and local errors ------------------------------

TEST(ThreadsBackend, MissingRankTimesOutNamingIt) {
  constexpr int kSize = 3;
  auto comms = make_thread_communicators(kSize, milliseconds(200));
  const auto errors = run_ranks_catching(kSize, [&](int rank) {
    if (rank == 2) return;  // never calls
    std::vector<float> data(4, 1.0f);
    comms[rank]->allreduce(data.data(), data.data(), 4, DType::kF32, {});
  });
  EXPECT_FALSE(errors[2]);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(errors[rank]) << "rank " << rank;
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const TimeoutError& e) {
      EXPECT_EQ(e.failed_ranks(), std::vector<int>{2}) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank(s) 2 did not arrive"), std::string::npos)
          << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": not a TimeoutError: " << e.what();
    }
  }
  // The world is broken now: later calls fail at once with a RuntimeFault.
  EXPECT_THROW(comms[0]->barrier({}), RuntimeFault);
}

TEST(ThreadsBackend, PerCallTimeoutOverridesDefault) {
  auto comms = make_thread_communicators(2, std::chrono::seconds(300));
  CollectiveOptions options;
  options.timeout = milliseconds(50);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(comms[0]->barrier(options), TimeoutError);  // rank 1 never calls
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(ThreadsBackend, LocalArgumentErrorReachesEveryRank) {
  constexpr int kSize = 3;
  auto comms = make_thread_communicators(kSize, std::chrono::seconds(15));
  const auto errors = run_ranks_catching(kSize, [&](int rank) {
    std::vector<float> data(4, 1.0f);
    comms[rank]->allreduce(rank == 1 ? nullptr : data.data(), data.data(), 4, DType::kF32, {});
  });
  for (int rank = 0; rank < kSize; ++rank) {
    ASSERT_TRUE(errors[rank]);
    try {
      std::rethrow_exception(errors[rank]);
    } catch (const ContractError& e) {
      EXPECT_NE(std::string(e.what()).find("in is null"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("on rank 1"), std::string::npos) << e.what();
    }
  }
  // A contract error leaves the world usable.
  std::vector<int> sums(kSize);
  run_ranks(kSize, [&](int rank) {
    int value = rank + 1;
    comms[rank]->allreduce(&value, &sums[rank], 1, DType::kI32, {});
  });
  EXPECT_EQ(sums, (std::vector<int>{6, 6, 6}));
}

TEST(ThreadsBackend, InconsistentAlltoallvCountsFailEverywhere) {
  constexpr int kSize = 2;
  auto comms = make_thread_communicators(kSize, std::chrono::seconds(15));
  const auto errors = run_ranks_catching(kSize, [&](int rank) {
    std::vector<float> in(8), out(8);
    // Rank 0 sends 2 to rank 1, but rank 1 expects 3 from rank 0.
    std::vector<size_t> send = {1, 2},
                        recv = rank == 0 ? std::vector<size_t>{1, 1} : std::vector<size_t>{3, 1};
    if (rank == 1) send = {1, 1};
    comms[rank]->alltoallv(in.data(), send, out.data(), recv, DType::kF32, {});
  });
  for (int rank = 0; rank < kSize; ++rank) {
    ASSERT_TRUE(errors[rank]);
    EXPECT_THROW(std::rethrow_exception(errors[rank]), ContractError);
  }
}

TEST(ThreadsBackend, DifferentCollectivesFailEverywhere) {
  constexpr int kSize = 2;
  auto comms = make_thread_communicators(kSize, std::chrono::seconds(15));
  const auto errors = run_ranks_catching(kSize, [&](int rank) {
    std::vector<float> data(4, 1.0f);
    if (rank == 0) {
      comms[rank]->allreduce(data.data(), data.data(), 4, DType::kF32, {});
    } else {
      comms[rank]->barrier({});
    }
  });
  for (int rank = 0; rank < kSize; ++rank) {
    ASSERT_TRUE(errors[rank]);
    EXPECT_THROW(std::rethrow_exception(errors[rank]), ContractError);
  }
}

TEST(ThreadsBackend, RejectsBadWorlds) {
  EXPECT_THROW(make_thread_communicators(0), ContractError);
  EXPECT_THROW(make_thread_communicators(2, milliseconds(0)), ContractError);
  auto comms = make_thread_communicators(1);
  EXPECT_STREQ(comms[0]->backend(), "threads");
}

}  // namespace
}  // namespace kolo

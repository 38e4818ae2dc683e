// shm backend with ranks as threads: pipelining through the segment, slot
// reuse, segment cleanup, argument mismatches and faults that one process can
// stage (timeouts, a peer that destroys its communicator). The full
// correctness matrix over shm is in tests/collectives; killed processes are in
// tests/multiproc/shm_fault_test.cc.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/shm_segment.h"
#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"

namespace kolo {
namespace {

using std::chrono::milliseconds;

// Bitwise equality of two float vectors (memcmp of an empty vector's null
// data() is undefined behaviour, which UBSan reports).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Names of this process's shm segments in /dev/shm.
std::vector<std::string> my_segments() {
  std::vector<std::string> names;
  const std::string prefix = "kolo-" + std::to_string(getpid()) + "-";
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (dirent* entry = readdir(dir)) {
    if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) == 0) {
      names.push_back(entry->d_name);
    }
  }
  closedir(dir);
  return names;
}

struct WorldOptions {
  int size = 2;
  int64_t chunk_bytes = 4096;  // small: most sizes below take many pipeline steps
  int spin_us = 20;
  milliseconds timeout{10000};
};

// Builds every rank's communicator, one thread per rank (construction is collective).
std::vector<std::unique_ptr<Communicator>> make_world(const WorldOptions& world) {
  auto store = make_memory_store();
  std::vector<std::unique_ptr<Communicator>> comms(world.size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions options;
      options.rank = r;
      options.size = world.size;
      options.store = store;
      options.prefix = "test/shm";
      options.timeout = world.timeout;
      options.shm_chunk_bytes = world.chunk_bytes;
      options.shm_spin_us = world.spin_us;
      comms[r] = make_communicator("shm", options);
    });
  }
  for (auto& thread : threads) thread.join();
  return comms;
}

// Runs body(rank, comm) on one thread per rank; returns each rank's exception.
std::vector<std::exception_ptr> run_ranks(std::vector<std::unique_ptr<Communicator>>& comms,
                                          const std::function<void(int, Communicator&)>& body) {
  std::vector<std::exception_ptr> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        body(static_cast<int>(r), *comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return errors;
}

void expect_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& error) {
      ADD_FAILURE() << "rank " << r << ": " << error.what();
    }
  }
}

// Rethrows rank r's error as E and returns its message ("" + failure otherwise).
template <typename E>
std::string error_of(const std::vector<std::exception_ptr>& errors, size_t r) {
  if (!errors[r]) {
    ADD_FAILURE() << "rank " << r << " did not throw";
    return "";
  }
  try {
    std::rethrow_exception(errors[r]);
  } catch (const E& error) {
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "rank " << r << " threw the wrong type: " << error.what();
  }
  return "";
}

// Integer-valued floats keep sums exact, so results compare with ==.
float value(int rank, size_t index) { return static_cast<float>((index * 7 + rank * 3) % 101); }

TEST(ShmCommunicator, AllreduceLargerThanSegmentBothSchemes) {
  // With 4 KiB slots both sizes take many steps: 80 KB goes through the gather
  // scheme (every rank reduces every slot), 200 KB through reduce-scatter +
  // allgather (each rank reduces 1/n of each chunk).
  for (int size : {2, 3}) {
    auto comms = make_world({size});
    for (size_t count : {size_t{20000}, size_t{50000}}) {
      for (bool in_place : {false, true}) {
        std::vector<std::vector<float>> outs(size);
        expect_no_errors(run_ranks(comms, [&](int r, Communicator& comm) {
          std::vector<float> in(count);
          for (size_t i = 0; i < count; ++i) in[i] = value(r, i);
          std::vector<float> out(count, -1.0f);
          float* dst = in_place ? in.data() : out.data();
          AllreduceOptions options;
          options.prescale = 2.0;
          comm.allreduce(in.data(), dst, count, DType::kF32, options);
          outs[r].assign(dst, dst + count);
        }));
        for (int r = 0; r < size; ++r) {
          for (size_t i = 0; i < count; ++i) {
            float expected = 0;
            for (int k = 0; k < size; ++k) expected += 2.0f * value(k, i);
            ASSERT_EQ(outs[r][i], expected)
                << "size " << size << " count " << count << " rank " << r << " index " << i;
          }
        }
      }
    }
  }
}

TEST(ShmCommunicator, AllCollectivesPipelined) {
  const int size = 3;
  auto comms = make_world({size});
  const size_t count = 3001;  // odd, > one 4 KiB slot of i32 per rank
  expect_no_errors(run_ranks(comms, [&](int r, Communicator& comm) {
    auto v = [](int rank, size_t i) { return static_cast<int32_t>(rank * 100000 + i); };
    // allgather, out of place and in place
    std::vector<int32_t> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = v(r, i);
    std::vector<int32_t> out(size * count, -1);
    comm.allgather(in.data(), out.data(), count, DType::kI32, {});
    for (int k = 0; k < size; ++k)
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(out[k * count + i], v(k, i));
    std::vector<int32_t> gathered(size * count, -1);
    std::copy(in.begin(), in.end(), gathered.begin() + r * count);
    comm.allgather(gathered.data() + r * count, gathered.data(), count, DType::kI32, {});
    ASSERT_EQ(gathered, out);

    // allgatherv with a rank contributing nothing
    std::vector<size_t> counts = {count, 0, 2 * count + 5};
    size_t total = 0;
    for (size_t c : counts) total += c;
    std::vector<int32_t> mine(counts[r]);
    for (size_t i = 0; i < counts[r]; ++i) mine[i] = v(r, i);
    std::vector<int32_t> all(total, -1);
    comm.allgatherv(mine.data(), all.data(), counts, DType::kI32, {});
    size_t at = 0;
    for (int k = 0; k < size; ++k)
      for (size_t i = 0; i < counts[k]; ++i) ASSERT_EQ(all[at++], v(k, i));

    // broadcast from every root
    for (int root = 0; root < size; ++root) {
      std::vector<int32_t> buffer(count, -1);
      if (r == root) buffer = in;
      BroadcastOptions options;
      options.root = root;
      comm.broadcast(buffer.data(), count, DType::kI32, options);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(buffer[i], v(root, i));
    }

    // reducescatter (sum of block r over ranks), out of place and in place
    std::vector<int32_t> blocks(size * count);
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = v(r, i);
    std::vector<int32_t> reduced(count, -1);
    comm.reducescatter(blocks.data(), reduced.data(), count, DType::kI32, {});
    for (size_t i = 0; i < count; ++i) {
      int32_t expected = 0;
      for (int k = 0; k < size; ++k) expected += v(k, r * count + i);
      ASSERT_EQ(reduced[i], expected);
    }
    comm.reducescatter(blocks.data(), blocks.data(), count, DType::kI32, {});
    ASSERT_TRUE(std::equal(reduced.begin(), reduced.end(), blocks.begin()));

    // alltoall: block k of rank r holds v(r, k * count + i); in place too
    std::vector<int32_t> send(size * count);
    for (size_t i = 0; i < send.size(); ++i) send[i] = v(r, i);
    std::vector<int32_t> recv(size * count, -1);
    comm.alltoall(send.data(), recv.data(), count, DType::kI32, {});
    for (int k = 0; k < size; ++k)
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv[k * count + i], v(k, r * count + i));
    comm.alltoall(send.data(), send.data(), count, DType::kI32, {});
    ASSERT_EQ(send, recv);

    // alltoallv: rank r sends (r + 1) * (k + 1) * 700 elements to rank k
    std::vector<size_t> send_counts(size), recv_counts(size);
    for (int k = 0; k < size; ++k) {
      send_counts[k] = static_cast<size_t>((r + 1) * (k + 1) * 700);
      recv_counts[k] = static_cast<size_t>((k + 1) * (r + 1) * 700);
    }
    send_counts[1] = r == 2 ? 0 : send_counts[1];  // rank 2 sends nothing to rank 1
    if (r == 1) recv_counts[2] = 0;
    std::vector<int32_t> vsend, vrecv;
    for (int k = 0; k < size; ++k)
      for (size_t i = 0; i < send_counts[k]; ++i) vsend.push_back(v(r, k * 100000 + i));
    size_t recv_total = 0;
    for (size_t c : recv_counts) recv_total += c;
    vrecv.assign(recv_total, -1);
    comm.alltoallv(vsend.data(), send_counts, vrecv.data(), recv_counts, DType::kI32, {});
    at = 0;
    for (int k = 0; k < size; ++k)
      for (size_t i = 0; i < recv_counts[k]; ++i) ASSERT_EQ(vrecv[at++], v(k, r * 100000 + i));

    comm.barrier({});
  }));
}

TEST(ShmCommunicator, ManySequentialCallsReuseSlots) {
  const int size = 4;
  auto comms = make_world({size, 8192});
  expect_no_errors(run_ranks(comms, [&](int r, Communicator& comm) {
    for (int iteration = 0; iteration < 1500; ++iteration) {
      const size_t count = static_cast<size_t>(iteration % 7 == 0 ? 5000 : iteration % 13);
      std::vector<int64_t> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = r + iteration + static_cast<int64_t>(i);
      AllreduceOptions options;
      options.op = ReduceOp::kMax;
      comm.allreduce(data.data(), data.data(), count, DType::kI64, options);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], size - 1 + iteration + int64_t(i));
      int64_t token = r == iteration % size ? iteration : -1;
      BroadcastOptions broadcast_options;
      broadcast_options.root = iteration % size;
      comm.broadcast(&token, 1, DType::kI64, broadcast_options);
      ASSERT_EQ(token, iteration);
      if (iteration % 5 == 0) comm.barrier({});
    }
  }));
}

TEST(ShmCommunicator, SegmentNameRemovedAfterRendezvousAndDestroy) {
  {
    auto comms = make_world({4});
    // The name is unlinked as soon as every rank has mapped the segment.
    EXPECT_TRUE(my_segments().empty());
    expect_no_errors(run_ranks(comms, [](int, Communicator& comm) { comm.barrier({}); }));
  }
  EXPECT_TRUE(my_segments().empty());
}

TEST(ShmCommunicator, WorldOfOneNeedsNoStore) {
  CommunicatorOptions options;
  options.shm_chunk_bytes = 4096;
  options.shm_spin_us = 0;
  auto comm = make_communicator("shm", options);
  std::vector<float> in = {1, 2, 3}, out(3);
  AllreduceOptions reduce;
  reduce.op = ReduceOp::kAverage;
  reduce.postscale = 2.0;
  comm->allreduce(in.data(), out.data(), 3, DType::kF32, reduce);
  EXPECT_EQ(out, (std::vector<float>{2, 4, 6}));
  EXPECT_TRUE(my_segments().empty());
}

// Alone, allreduce goes straight from the input to the output (no slot): the
// result is the input scaled, in place and not, in every scheme's size range
// and for the dtypes DistributedOptimizer sends; bad arguments still throw.
TEST(ShmCommunicator, WorldOfOneAllreduceIsTheScaledInput) {
  CommunicatorOptions options;
  options.shm_chunk_bytes = 4096;
  options.shm_spin_us = 0;
  auto comm = make_communicator("shm", options);
  for (size_t count : {size_t{0}, size_t{3}, size_t{50000}}) {  // 50000 f32 > a 4 KiB slot
    std::vector<float> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = 0.1f * static_cast<float>(i) - 7.3f;
    const std::vector<float> original = in;
    AllreduceOptions average;
    average.op = ReduceOp::kAverage;
    comm->allreduce(in.data(), in.data(), count, DType::kF32, average);  // in place: unchanged
    EXPECT_TRUE(same_bits(in, original));
    std::vector<float> out(count, -1.0f);
    comm->allreduce(in.data(), out.data(), count, DType::kF32, average);  // a copy
    EXPECT_TRUE(same_bits(out, original));
    AllreduceOptions scaled;
    scaled.prescale = 2.0;
    scaled.postscale = 3.0;
    comm->allreduce(in.data(), out.data(), count, DType::kF32, scaled);
    for (size_t i = 0; i < count; ++i) ASSERT_FLOAT_EQ(out[i], 6.0f * original[i]) << i;
  }
  std::vector<int32_t> ints = {-5, 0, 7, 2147483647};
  AllreduceOptions average;
  average.op = ReduceOp::kAverage;
  comm->allreduce(ints.data(), ints.data(), ints.size(), DType::kI32, average);
  EXPECT_EQ(ints, (std::vector<int32_t>{-5, 0, 7, 2147483647}));
  std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x7bff};  // 1, -2, 65504 in fp16
  std::vector<uint16_t> half_out(3);
  comm->allreduce(halves.data(), half_out.data(), 3, DType::kF16, average);
  EXPECT_EQ(half_out, halves);
  std::vector<float> data(10, 1.0f);
  try {
    comm->allreduce(nullptr, data.data(), 10, DType::kF32, {});
    ADD_FAILURE() << "expected ContractError";
  } catch (const ContractError& error) {
    EXPECT_NE(std::string(error.what()).find("in is null"), std::string::npos) << error.what();
  }
  // Still in step: other collectives alone work after the fast path.
  float one = 1;
  comm->allreduce(&one, &one, 1, DType::kF32, {});
  comm->broadcast(&one, 1, DType::kF32, {});
  EXPECT_EQ(one, 1.0f);
}

TEST(ShmCommunicator, BadChunkSizeIsContractError) {
  CommunicatorOptions options;
  options.shm_chunk_bytes = 100;
  options.shm_spin_us = 0;
  try {
    make_communicator("shm", options);
    ADD_FAILURE() << "expected ContractError";
  } catch (const ContractError& error) {
    EXPECT_NE(std::string(error.what()).find("KOLO_SHM_CHUNK_BYTES"), std::string::npos);
  }
}

TEST(ShmCommunicator, CountMismatchFailsEveryRankAndStaysUsable) {
  const int size = 3;
  auto comms = make_world({size});
  auto errors = run_ranks(comms, [](int r, Communicator& comm) {
    std::vector<float> data(1000, 1.0f);
    comm.allreduce(data.data(), data.data(), r == 2 ? 999 : 1000, DType::kF32, {});
  });
  std::string first = error_of<ContractError>(errors, 0);
  EXPECT_NE(first.find("count differs"), std::string::npos) << first;
  for (int r = 1; r < size; ++r) EXPECT_EQ(error_of<ContractError>(errors, r), first);

  // A contract error does not break the communicator.
  expect_no_errors(run_ranks(comms, [&](int, Communicator& comm) {
    float x = 1.0f;
    comm.allreduce(&x, &x, 1, DType::kF32, {});
    ASSERT_EQ(x, static_cast<float>(size));
  }));
}

TEST(ShmCommunicator, DtypeAndCollectiveMismatch) {
  auto comms = make_world({2});
  auto errors = run_ranks(comms, [](int r, Communicator& comm) {
    std::vector<int32_t> data(10, 1);
    comm.allreduce(data.data(), data.data(), 10, r == 0 ? DType::kI32 : DType::kF32, {});
  });
  EXPECT_NE(error_of<ContractError>(errors, 0).find("dtype differs"), std::string::npos);
  EXPECT_NE(error_of<ContractError>(errors, 1).find("dtype differs"), std::string::npos);

  errors = run_ranks(comms, [](int r, Communicator& comm) {
    int32_t x = 0;
    if (r == 0) {
      comm.barrier({});
    } else {
      comm.broadcast(&x, 1, DType::kI32, {});
    }
  });
  EXPECT_NE(error_of<ContractError>(errors, 0).find("different collectives"), std::string::npos);
  EXPECT_NE(error_of<ContractError>(errors, 1).find("different collectives"), std::string::npos);
}

TEST(ShmCommunicator, LocalArgumentErrorReachesEveryRank) {
  auto comms = make_world({3});
  auto errors = run_ranks(comms, [](int r, Communicator& comm) {
    std::vector<float> data(10, 1.0f);
    comm.allreduce(r == 1 ? nullptr : data.data(), data.data(), 10, DType::kF32, {});
  });
  const std::string own = error_of<ContractError>(errors, 1);
  EXPECT_NE(own.find("in is null"), std::string::npos) << own;
  for (int r : {0, 2}) {
    const std::string other = error_of<ContractError>(errors, r);
    EXPECT_NE(other.find("in is null"), std::string::npos) << other;
    EXPECT_NE(other.find("rank 1"), std::string::npos) << other;
  }
}

TEST(ShmCommunicator, AlltoallvCountsDisagree) {
  auto comms = make_world({2});
  auto errors = run_ranks(comms, [](int r, Communicator& comm) {
    // Consistent would be recv = {1, 1} on rank 0 and {2, 2} on rank 1.
    std::vector<size_t> send = {1, 2};
    std::vector<size_t> recv = r == 0 ? std::vector<size_t>{1, 1} : std::vector<size_t>{2, 3};
    std::vector<float> in(3, 0.0f), out(5, 0.0f);
    comm.alltoallv(in.data(), send, out.data(), recv, DType::kF32, {});
  });
  const std::string first = error_of<ContractError>(errors, 0);
  EXPECT_NE(first.find("recv_counts"), std::string::npos) << first;
  EXPECT_EQ(error_of<ContractError>(errors, 1), first);
}

TEST(ShmCommunicator, AbsentRankTimesOutAndBreaksCommunicator) {
  WorldOptions world;
  world.size = 3;
  auto comms = make_world(world);
  auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks(comms, [](int r, Communicator& comm) {
    if (r == 2) return;  // never arrives
    CollectiveOptions options;
    options.timeout = milliseconds(300);
    comm.barrier(options);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // The first rank to time out names rank 2; the other may stop because of the abort.
  bool named = false;
  for (int r : {0, 1}) {
    ASSERT_TRUE(errors[r]);
    try {
      std::rethrow_exception(errors[r]);
    } catch (const RuntimeFault& fault) {
      const std::vector<int>& failed = fault.failed_ranks();
      named = named || (failed.size() == 1 && failed[0] == 2);
      EXPECT_NE(std::string(fault.what()).find("2"), std::string::npos) << fault.what();
    }
  }
  EXPECT_TRUE(named);
  // Unusable afterwards, on every rank, without waiting.
  errors = run_ranks(comms, [](int, Communicator& comm) { comm.barrier({}); });
  for (int r = 0; r < 3; ++r) EXPECT_FALSE(error_of<RuntimeFault>(errors, r).empty());
}

TEST(ShmCommunicator, TimeoutIsTimeoutErrorNamingLateRank) {
  auto comms = make_world({2});
  auto errors = run_ranks(comms, [](int r, Communicator& comm) {
    if (r == 1) return;
    std::vector<float> data(100, 1.0f);
    AllreduceOptions options;
    options.timeout = milliseconds(200);
    comm.allreduce(data.data(), data.data(), 100, DType::kF32, options);
  });
  const std::string message = error_of<TimeoutError>(errors, 0);
  EXPECT_NE(message.find("rank(s) 1"), std::string::npos) << message;
  EXPECT_NE(message.find("allreduce"), std::string::npos) << message;
}

TEST(ShmCommunicator, DestroyedPeerFailsWaiterFast) {
  WorldOptions world;
  world.timeout = milliseconds(60000);
  auto comms = make_world(world);
  std::atomic<bool> waiting{false};
  std::thread destroyer([&] {
    while (!waiting.load()) std::this_thread::yield();
    std::this_thread::sleep_for(milliseconds(50));
    comms[1].reset();
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    waiting = true;
    comms[0]->barrier({});
    ADD_FAILURE() << "expected RuntimeFault";
  } catch (const RuntimeFault& fault) {
    EXPECT_EQ(fault.failed_ranks(), std::vector<int>{1});
    EXPECT_NE(std::string(fault.what()).find("destroyed"), std::string::npos) << fault.what();
  }
  destroyer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// A job killed during a rendezvous leaves a named segment; the next
// communicator on the host removes it once its creator is gone.
TEST(ShmSegment, StaleSegmentsOfDeadCreatorsAreRemoved) {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);  // now a pid with no process
  auto make = [](const std::string& name, bool old) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << name;
    if (fd < 0) return;
    if (old) {
      timespec times[2] = {{time(nullptr) - 3600, 0}, {time(nullptr) - 3600, 0}};
      futimens(fd, times);
    }
    close(fd);
  };
  const std::string dead_old = "/kolo-" + std::to_string(child) + "-00000000000000aa";
  const std::string dead_new = "/kolo-" + std::to_string(child) + "-00000000000000bb";
  const std::string alive_old = "/kolo-" + std::to_string(getpid()) + "-00000000000000cc";
  make(dead_old, true);
  make(dead_new, false);
  make(alive_old, true);
  EXPECT_GE(detail::remove_stale_segments(std::chrono::seconds(10)), 1);
  auto exists = [](const std::string& name) {
    return access(("/dev/shm" + name).c_str(), F_OK) == 0;
  };
  EXPECT_FALSE(exists(dead_old));
  EXPECT_TRUE(exists(dead_new));
  EXPECT_TRUE(exists(alive_old));
  shm_unlink(dead_new.c_str());
  shm_unlink(alive_old.c_str());
}

}  // namespace
}  // namespace kolo

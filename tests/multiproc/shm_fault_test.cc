// shm backend with ranks as forked processes: a peer SIGKILLed in the middle
// of a long series of collectives, argument mismatches across processes, and
// more ranks than cores. Children rendezvous through a file store in a fresh
// temporary directory and report one line each through a pipe; the parent
// always reaps or kills every child (a watchdog bounds every wait).
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/errors.h"
#include "kolo/core/store.h"
#include "temp_dir.h"

namespace kolo {
namespace {

using Clock = std::chrono::steady_clock;
using kolo::testing::TempDir;
using std::chrono::milliseconds;

// Exit codes of the children.
constexpr int kExitOk = 0;
constexpr int kExitWrongError = 2;
constexpr int kExitNoError = 3;
constexpr int kExitOtherException = 4;

struct Child {
  pid_t pid = -1;
  int report_fd = -1;  // read end of the child's report pipe
  std::string report;  // everything the child wrote
  int status = -1;     // waitpid status once reaped
  bool reaped = false;
};

// What a child runs: (rank, communicator, report) -> exit code. `report`
// writes one line to the parent.
using ChildBody = std::function<int(int rank, Communicator& comm,
                                    const std::function<void(const std::string&)>& report)>;

struct WorldSpec {
  int size = 3;
  milliseconds timeout{20000};  // per collective; faults must be seen long before
  std::string store_dir;
};

// Forks `size` children; each builds its shm communicator and runs body.
std::vector<Child> spawn(const WorldSpec& spec, const ChildBody& body) {
  std::vector<Child> children(spec.size);
  for (int rank = 0; rank < spec.size; ++rank) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      const int out = fds[1];
      auto report = [out](const std::string& line) {
        const std::string text = line + "\n";
        ssize_t ignored = write(out, text.data(), text.size());
        (void)ignored;
      };
      int code = kExitOtherException;
      try {
        CommunicatorOptions options;
        options.rank = rank;
        options.size = spec.size;
        options.store = make_file_store(spec.store_dir);
        options.prefix = "fault";
        options.timeout = spec.timeout;
        options.shm_spin_us = 50;
        options.shm_chunk_bytes = 65536;
        auto comm = make_communicator("shm", options);
        code = body(rank, *comm, report);
      } catch (const std::exception& error) {
        report(std::string("unexpected exception: ") + error.what());
      }
      _exit(code);
    }
    close(fds[1]);
    children[rank].pid = pid;
    children[rank].report_fd = fds[0];
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
  }
  return children;
}

// Reads whatever the children wrote so far.
void drain_reports(std::vector<Child>& children) {
  char buffer[4096];
  for (Child& child : children) {
    if (child.report_fd < 0) continue;
    while (true) {
      const ssize_t got = read(child.report_fd, buffer, sizeof(buffer));
      if (got > 0) {
        child.report.append(buffer, static_cast<size_t>(got));
        continue;
      }
      if (got == 0) {
        close(child.report_fd);
        child.report_fd = -1;
      }
      break;
    }
  }
}

// Waits until pred() (checked after each poll of the reports) or the deadline.
bool wait_reports(std::vector<Child>& children, const std::function<bool()>& pred,
                  milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    drain_reports(children);
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  drain_reports(children);
  return pred();
}

// Reaps the listed children; kills (and reaps) everything still running at
// the deadline. Returns false if the watchdog had to kill someone.
bool reap(std::vector<Child>& children, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  bool all_exited = true;
  for (Child& child : children) {
    while (!child.reaped) {
      const pid_t done = waitpid(child.pid, &child.status, WNOHANG);
      if (done == child.pid) {
        child.reaped = true;
      } else if (Clock::now() >= deadline) {
        kill(child.pid, SIGKILL);
        waitpid(child.pid, &child.status, 0);
        child.reaped = true;
        all_exited = false;
      } else {
        drain_reports(children);
        std::this_thread::sleep_for(milliseconds(5));
      }
    }
  }
  drain_reports(children);
  return all_exited;
}

int exit_code(const Child& child) {
  return WIFEXITED(child.status) ? WEXITSTATUS(child.status) : -WTERMSIG(child.status);
}

std::vector<std::string> leftover_segments(const std::vector<Child>& children) {
  std::vector<std::string> names;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (dirent* entry = readdir(dir)) {
    for (const Child& child : children) {
      const std::string prefix = "kolo-" + std::to_string(child.pid) + "-";
      if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) == 0) {
        names.push_back(entry->d_name);
      }
    }
  }
  closedir(dir);
  return names;
}

// A long series of mixed collectives; reports "progress" once under way.
int collective_series(int rank, Communicator& comm,
                      const std::function<void(const std::string&)>& report) {
  std::vector<float> data(300000, 1.0f);  // 1.2 MB: many pipeline steps per call
  std::vector<float> gathered(data.size() * comm.size());
  for (int iteration = 0; iteration < 2000000; ++iteration) {
    if (iteration == 20) report("progress");
    const size_t count = iteration % 3 == 0 ? 7 : data.size();
    comm.allreduce(data.data(), data.data(), count, DType::kF32, {});
    std::fill(data.begin(), data.begin() + count, 1.0f);
    if (iteration % 5 == 0) comm.allgather(data.data(), gathered.data(), 1000, DType::kF32, {});
    if (iteration % 7 == 0) comm.barrier({});
  }
  return kExitNoError;
}

void kill_peer_test(int size, int victim) {
  TempDir dir("kolo-shm-fault");
  WorldSpec spec;
  spec.size = size;
  spec.store_dir = dir.path();
  auto children = spawn(spec, [victim](int rank, Communicator& comm, const auto& report) {
    try {
      return collective_series(rank, comm, report);
    } catch (const TimeoutError& error) {
      report(std::string("timeout: ") + error.what());
      return kExitWrongError;
    } catch (const RuntimeFault& fault) {
      report(std::string("fault: ") + fault.what());
      for (int failed : fault.failed_ranks()) {
        if (failed == victim) return kExitOk;
      }
      return kExitWrongError;
    }
  });
  const bool under_way = wait_reports(
      children,
      [&] {
        for (const Child& child : children)
          if (child.report.find("progress") == std::string::npos) return false;
        return true;
      },
      milliseconds(20000));
  EXPECT_TRUE(under_way) << "children did not start their collectives";
  kill(children[victim].pid, SIGKILL);
  // The victim stays a zombie until reaped: the survivors must still see it as dead.
  const auto killed_at = Clock::now();
  std::vector<Child> survivors;
  for (int rank = 0; rank < size; ++rank) {
    if (rank != victim) survivors.push_back(children[rank]);
  }
  const bool exited = reap(survivors, milliseconds(10000));
  const double seconds = std::chrono::duration<double>(Clock::now() - killed_at).count();
  std::vector<Child> victim_only = {children[victim]};
  reap(victim_only, milliseconds(1000));
  EXPECT_TRUE(exited) << "survivors hung; the watchdog killed them";
  for (const Child& child : survivors) {
    EXPECT_EQ(exit_code(child), kExitOk) << "report: " << child.report;
    EXPECT_NE(child.report.find("rank(s) " + std::to_string(victim)), std::string::npos)
        << child.report;
  }
  EXPECT_LT(seconds, 10.0);
  EXPECT_TRUE(leftover_segments(children).empty());
}

TEST(ShmFault, KilledPeerIsNamedBySurvivors) { kill_peer_test(3, 2); }

TEST(ShmFault, KilledSegmentCreatorIsNamedBySurvivors) { kill_peer_test(3, 0); }

TEST(ShmFault, KilledPeerWithMoreRanksThanCores) { kill_peer_test(4, 1); }

// Every rank must get the same ContractError; afterwards the communicator works.
void mismatch_test(const std::function<void(int, Communicator&)>& call,
                   const std::string& expected) {
  TempDir dir("kolo-shm-fault");
  WorldSpec spec;
  spec.size = 3;
  spec.store_dir = dir.path();
  auto children = spawn(spec, [&](int rank, Communicator& comm, const auto& report) {
    try {
      call(rank, comm);
      report("no error");
      return kExitNoError;
    } catch (const ContractError& error) {
      report(std::string("contract: ") + error.what());
    }
    float x = 1.0f;
    comm.allreduce(&x, &x, 1, DType::kF32, {});
    return x == 3.0f ? kExitOk : kExitWrongError;
  });
  EXPECT_TRUE(reap(children, milliseconds(15000))) << "children hung";
  for (const Child& child : children) {
    EXPECT_EQ(exit_code(child), kExitOk) << child.report;
    EXPECT_NE(child.report.find(expected), std::string::npos) << child.report;
    EXPECT_EQ(child.report, children[0].report);
  }
}

TEST(ShmFault, CountMismatchIsContractErrorOnEveryRank) {
  mismatch_test(
      [](int rank, Communicator& comm) {
        std::vector<float> data(1000, 1.0f);
        comm.allreduce(data.data(), data.data(), rank == 1 ? 999 : 1000, DType::kF32, {});
      },
      "count differs across ranks: rank 0 passed 1000, rank 1 passed 999");
}

TEST(ShmFault, DtypeMismatchIsContractErrorOnEveryRank) {
  mismatch_test(
      [](int rank, Communicator& comm) {
        std::vector<double> data(100, 1.0);
        comm.allgather(data.data(), data.data(), 10, rank == 2 ? DType::kF64 : DType::kF32, {});
      },
      "dtype differs across ranks");
}

TEST(ShmFault, MoreRanksThanCoresComplete) {
  TempDir dir("kolo-shm-fault");
  WorldSpec spec;
  spec.size = 4;
  spec.store_dir = dir.path();
  auto children = spawn(spec, [](int rank, Communicator& comm, const auto& report) {
    std::vector<int32_t> data(100000);
    for (int iteration = 0; iteration < 200; ++iteration) {
      const size_t count = iteration % 2 == 0 ? 10 : data.size();
      std::fill(data.begin(), data.begin() + count, rank + iteration);
      comm.allreduce(data.data(), data.data(), count, DType::kI32, {});
      for (size_t i = 0; i < count; ++i) {
        if (data[i] != 6 + 4 * iteration) {
          report("wrong value at iteration " + std::to_string(iteration));
          return kExitWrongError;
        }
      }
    }
    return kExitOk;
  });
  EXPECT_TRUE(reap(children, milliseconds(60000))) << "children hung";
  for (const Child& child : children) EXPECT_EQ(exit_code(child), kExitOk) << child.report;
  EXPECT_TRUE(leftover_segments(children).empty());
}

}  // namespace
}  // namespace kolo

// Elastic test worker (tests/integration/elastic_test.cc): trains a linear
// regression on deterministic data through kolo::elastic::run, core only (no
// libtorch, so each process starts in milliseconds).
//
// The global batch (--batch samples) is fixed whatever the world size: step s
// of an epoch takes positions [s*B, (s+1)*B) of that epoch's permutation and
// rank r of n takes B/n of them, so the model does not depend on how many
// workers took part (up to the rounding of the sum). Each worker writes a
// journal, <--journal>/worker<id>.log:
//   pid <pid>
//   start <epoch> <batch> <round> <size> <rank>   each time train() begins
//   step <epoch> <batch> <round> <size> <rank> <i,j,...>   a step done here
//   commit <epoch> <batch>
// Rank 0 prints "final_w=<w0>,<w1>,..." (%.17g) when training ends.
//
// Fault injection: --kill ID@STEP (worker ID SIGKILLs itself before global step
// STEP), --fail-on-host HOST (exit 1 at start on that host), --grow
// FILE@STEP@TEXT (rank 0 writes TEXT into FILE before global step STEP: a
// discovery script can cat it), --rogue-at STEP (rank 0 tries to write the
// rendezvous without the job's secret and prints what happened), --die-on-join
// ID@ROUND (worker ID SIGKILLs itself right after joining ROUND, before its init:
// a member that dies between a round's publication and its communicators),
// --stuck-before-join ID (worker ID ignores SIGTERM, stops itself with SIGSTOP
// and, once continued, blocks forever in pause(): it never joins), --stop-at
// ID@STEP (worker ID stops itself with SIGSTOP before global step STEP: a
// frozen member), --hang-at ID@STEP (worker ID blocks forever in pause()
// before global step STEP: a member stuck in a system call). --init-first 1
// calls kolo::elastic::init() before run() (Horovod's hvd.init() at the top of
// an elastic script), so that run() trains in the round init() joined.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/elastic.h"
#include "kolo/core/runtime.h"
#include "kolo/core/store.h"

namespace {

constexpr int kDim = 8;
constexpr double kLearningRate = 0.05;

struct Args {
  int epochs = 4;
  int samples = 96;
  int batch = 12;
  int commit_every = 3;
  int step_ms = 20;
  std::string journal = ".";
  std::vector<std::pair<long, int>> kills;  // worker id, global step
  std::string fail_on_host;
  std::string grow_file, grow_text;
  int grow_step = -1;
  int rogue_step = -1;
  std::vector<std::pair<long, int64_t>> die_on_join;  // worker id, round
  std::vector<long> stuck_before_join;                // worker ids
  std::vector<std::pair<long, int>> stops;            // worker id, global step
  std::vector<std::pair<long, int>> hangs;            // worker id, global step
  bool init_first = false;
};

std::pair<long, int> id_at_step(const std::string& flag, const std::string& value);

[[noreturn]] void usage(const std::string& what) {
  std::fprintf(stderr, "elastic_worker: %s\n", what.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) usage("missing value after " + flag);
    std::string value = argv[++i];
    if (flag == "--epochs") {
      a.epochs = std::stoi(value);
    } else if (flag == "--samples") {
      a.samples = std::stoi(value);
    } else if (flag == "--batch") {
      a.batch = std::stoi(value);
    } else if (flag == "--commit-every") {
      a.commit_every = std::stoi(value);
    } else if (flag == "--step-ms") {
      a.step_ms = std::stoi(value);
    } else if (flag == "--journal") {
      a.journal = value;
    } else if (flag == "--kill") {
      a.kills.push_back(id_at_step(flag, value));
    } else if (flag == "--fail-on-host") {
      a.fail_on_host = value;
    } else if (flag == "--grow") {
      size_t first = value.find('@'), second = value.find('@', first + 1);
      if (first == std::string::npos || second == std::string::npos) usage("--grow FILE@STEP@TEXT");
      a.grow_file = value.substr(0, first);
      a.grow_step = std::stoi(value.substr(first + 1, second - first - 1));
      a.grow_text = value.substr(second + 1);
    } else if (flag == "--die-on-join") {
      size_t at = value.find('@');
      if (at == std::string::npos) usage("--die-on-join ID@ROUND");
      a.die_on_join.emplace_back(std::stol(value.substr(0, at)), std::stoll(value.substr(at + 1)));
    } else if (flag == "--stuck-before-join") {
      a.stuck_before_join.push_back(std::stol(value));
    } else if (flag == "--stop-at") {
      a.stops.push_back(id_at_step(flag, value));
    } else if (flag == "--hang-at") {
      a.hangs.push_back(id_at_step(flag, value));
    } else if (flag == "--init-first") {
      a.init_first = value == "1";
    } else if (flag == "--rogue-at") {
      a.rogue_step = std::stoi(value);
    } else {
      usage("unknown flag " + flag);
    }
  }
  if (a.batch % 12 != 0 && a.batch % 6 != 0) usage("--batch must be divisible by 1, 2 and 3");
  if (a.samples % a.batch != 0) usage("--samples must be a multiple of --batch");
  return a;
}

std::pair<long, int> id_at_step(const std::string& flag, const std::string& value) {
  const size_t at = value.find('@');
  if (at == std::string::npos) usage(flag + " ID@STEP");
  return {std::stol(value.substr(0, at)), std::stoi(value.substr(at + 1))};
}

double feature(int sample, int j) { return std::sin(sample * (j + 1) * 0.37 + j); }
double target(int sample) {
  double y = 0.01 * std::cos(sample);
  for (int j = 0; j < kDim; ++j) y += (j + 1) * 0.1 * feature(sample, j);
  return y;
}

// The epoch's order of the samples: a seeded Fisher-Yates shuffle.
std::vector<int> permutation(int samples, int64_t epoch) {
  std::vector<int> order(static_cast<size_t>(samples));
  for (int i = 0; i < samples; ++i) order[static_cast<size_t>(i)] = i;
  uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(epoch + 1);
  for (int i = samples - 1; i > 0; --i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int j = static_cast<int>((state >> 33) % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

// Connects to the rendezvous without the secret, reads the server's nonce and
// sends an unsigned set of "elastic/latest" (what an intruder would try).
// Returns "rejected" when the server closed the connection without answering.
std::string rogue_attempt(const std::string& host, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &address.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return "connect-failed";
  }
  timeval limit{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  char nonce[4 + 16];
  size_t got = 0;
  while (got < sizeof(nonce)) {
    ssize_t n = recv(fd, nonce + got, sizeof(nonce) - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  std::string body;
  body += static_cast<char>(1);  // kSet
  const std::string key = "elastic/latest", value = "999";
  put_u32(body, static_cast<uint32_t>(key.size()));
  body += key;
  put_u32(body, static_cast<uint32_t>(value.size()));
  body += value;
  std::string frame;
  put_u32(frame, static_cast<uint32_t>(body.size()));
  frame += body;
  send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);  // all it had to say (the server waits for no more)
  char reply[64];
  ssize_t n = recv(fd, reply, sizeof(reply), 0);
  close(fd);
  return n == 0 ? "rejected" : (n < 0 ? "no-answer" : "ANSWERED");
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  const char* id_text = std::getenv("KOLO_WORKER_ID");
  const long worker_id = id_text ? std::atol(id_text) : 0;
  const char* host = std::getenv("KOLO_ELASTIC_HOST");
  if (!args.fail_on_host.empty() && host != nullptr && args.fail_on_host == host) {
    std::fprintf(stderr, "elastic_worker: failing on host %s on purpose\n", host);
    return 1;
  }
  std::ofstream journal(args.journal + "/worker" + std::to_string(worker_id) + ".log",
                        std::ios::app);
  journal << "pid " << getpid() << std::endl;
  for (long id : args.stuck_before_join) {
    if (id != worker_id) continue;
    signal(SIGTERM, SIG_IGN);
    raise(SIGSTOP);
    for (;;) pause();
  }

  std::vector<double> w(kDim, 0.0);
  kolo::elastic::BufferState state;
  state.add("w", w.data(), w.size() * sizeof(double));
  const int steps_per_epoch = args.samples / args.batch;
  bool rogue_done = false;

  kolo::elastic::RunOptions run_options;
  run_options.on_join = [&](const kolo::elastic::Membership& m) {
    for (const auto& [id, round] : args.die_on_join) {
      if (id == worker_id && round == m.round) raise(SIGKILL);
    }
  };
  try {
    if (args.init_first) kolo::elastic::init(run_options);
    kolo::elastic::run(
        state,
        [&] {
          const int rank = kolo::rank(), size = kolo::size();
          const std::string where = std::to_string(state.round()) + " " + std::to_string(size) +
                                    " " + std::to_string(rank);
          journal << "start " << state.epoch << " " << state.batch << " " << where << std::endl;
          while (state.epoch < args.epochs) {
            const std::vector<int> order = permutation(args.samples, state.epoch);
            while (state.batch < steps_per_epoch) {
              const int64_t global = state.epoch * steps_per_epoch + state.batch;
              for (const auto& [id, step] : args.kills) {
                if (id == worker_id && step == global) raise(SIGKILL);
              }
              for (const auto& [id, step] : args.stops) {
                if (id == worker_id && step == global) raise(SIGSTOP);
              }
              for (const auto& [id, step] : args.hangs) {
                if (id == worker_id && step == global) {
                  for (;;) pause();
                }
              }
              if (rank == 0 && global == args.grow_step) {
                std::ofstream(args.grow_file) << args.grow_text << "\n";
              }
              if (rank == 0 && global >= args.rogue_step && args.rogue_step >= 0 && !rogue_done) {
                rogue_done = true;
                const std::string outcome = rogue_attempt(
                    std::getenv("KOLO_STORE_ADDR"), std::atoi(std::getenv("KOLO_STORE_PORT")));
                std::string wrong_secret = "refused";
                try {
                  auto store = kolo::connect_tcp_store(std::getenv("KOLO_STORE_ADDR"),
                                                       std::atoi(std::getenv("KOLO_STORE_PORT")),
                                                       std::chrono::seconds(5), "not-the-secret");
                  store->set("elastic/latest", kolo::to_bytes("999"));
                  wrong_secret = "ACCEPTED";
                } catch (const kolo::RuntimeFault&) {
                }
                std::printf("rogue_unsigned=%s rogue_wrong_secret=%s\n", outcome.c_str(),
                            wrong_secret.c_str());
                std::fflush(stdout);
              }
              // This rank's share of the step's samples.
              const int share = args.batch / size;
              const int first = static_cast<int>(state.batch) * args.batch + rank * share;
              std::vector<double> grad(kDim, 0.0);
              std::string list;
              for (int k = 0; k < share; ++k) {
                const int sample = order[static_cast<size_t>(first + k)];
                list += (k == 0 ? "" : ",") + std::to_string(sample);
                double error = -target(sample);
                for (int j = 0; j < kDim; ++j) error += w[j] * feature(sample, j);
                for (int j = 0; j < kDim; ++j) grad[j] += 2.0 * error * feature(sample, j);
              }
              kolo::AllreduceOptions sum;
              kolo::runtime().world().allreduce(grad.data(), grad.data(), grad.size(),
                                                kolo::DType::kF64, sum);
              for (int j = 0; j < kDim; ++j) w[j] -= kLearningRate * grad[j] / args.batch;
              if (args.step_ms > 0)
                std::this_thread::sleep_for(std::chrono::milliseconds(args.step_ms));
              journal << "step " << state.epoch << " " << state.batch << " " << where << " " << list
                      << std::endl;
              ++state.batch;
              if (state.batch % args.commit_every == 0) {
                journal << "commit " << state.epoch << " " << state.batch << std::endl;
                state.commit();
              }
            }
            ++state.epoch;
            state.batch = 0;
            journal << "commit " << state.epoch << " " << state.batch << std::endl;
            state.commit();
          }
        },
        run_options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "elastic_worker %ld: %s\n", worker_id, e.what());
    journal << "error " << e.what() << std::endl;
    return 1;
  }
  if (kolo::rank() == 0) {
    std::string text;
    for (int j = 0; j < kDim; ++j) {
      char buffer[40];
      std::snprintf(buffer, sizeof(buffer), "%s%.17g", j == 0 ? "" : ",", w[j]);
      text += buffer;
    }
    std::printf("final_w=%s\n", text.c_str());
  }
  journal << "done" << std::endl;
  kolo::shutdown();
  return 0;
}

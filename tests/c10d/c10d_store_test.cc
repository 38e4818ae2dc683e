// kolo under a launcher that serves a c10d TCPStore (torchrun >= 2.4's agent
// store). The test process plays torchrun's agent: it serves a c10d::TCPStore
// on a free port and forks 2 and 3 workers that set torchrun's variables
// (RANK, WORLD_SIZE, LOCAL_RANK, ..., MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_USE_AGENT_STORE=True) and call kolo::init_torch(): they must
// join the agent's store (their keys appear in it; rank 0 could not serve on
// that port anyway), run collectives and train with DistributedOptimizer to
// the parameters of one process on the whole batch. Without the variable the
// same workers keep today's behaviour (rank 0 serves kolo's own store).
#include "kolo/torch/c10d_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "forked_ranks.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/core/store.h"
#include "kolo/torch/optimizer.h"
#include "kolo/torch/tensor.h"

namespace kolo {
namespace {

using kolo::testing::RankOutcome;
using kolo::testing::run_forked_ranks;
using kolo::testing::SharedState;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kSamplesPerRank = 8;
constexpr int kSteps = 3;

// The agent's store: a c10d TCPStore server on a free port (port 0).
std::unique_ptr<c10d::TCPStore> serve_agent_store() {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = seconds(60);
  return std::make_unique<c10d::TCPStore>("127.0.0.1", options);
}

// A port nobody listens on now (bound, read, closed), for the run without
// the agent store, where rank 0 serves kolo's store on MASTER_PORT.
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(address.sin_port);
}

// Samples of rank r: rows [r * kSamplesPerRank, (r + 1) * kSamplesPerRank).
torch::Tensor inputs_of(int size) {
  torch::manual_seed(7);
  return torch::randn({size * kSamplesPerRank, 4});
}
torch::Tensor targets_of(const torch::Tensor& x) {
  return x.matmul(torch::tensor({1.0f, -2.0f, 0.5f, 3.0f}).reshape({4, 1})) + 0.25;
}

// Three SGD steps of Linear(4, 1) on rows [begin, end) of the batch, with a
// DistributedOptimizer when `distributed`; returns weight and bias, flat.
torch::Tensor train(int size, int64_t begin, int64_t end, bool distributed) {
  torch::manual_seed(1);
  torch::nn::Linear model(4, 1);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  std::unique_ptr<DistributedOptimizer> optimizer;
  if (distributed)
    optimizer = std::make_unique<DistributedOptimizer>(sgd, model->named_parameters());
  const torch::Tensor x = inputs_of(size).slice(0, begin, end);
  const torch::Tensor y = targets_of(x);
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    if (optimizer) {
      optimizer->step();
    } else {
      sgd.step();
    }
  }
  return torch::cat({model->weight.detach().flatten(), model->bias.detach()});
}

// One worker as torchrun starts it. Returns "" when everything held.
std::string torchrun_worker(int rank, int size, int port, bool agent_store) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(size).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(size).c_str(), 1);
  setenv("GROUP_RANK", "0", 1);
  setenv("ROLE_RANK", std::to_string(rank).c_str(), 1);
  setenv("ROLE_WORLD_SIZE", std::to_string(size).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("TORCHELASTIC_RUN_ID", "c10d-store-test", 1);
  if (agent_store) {
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  } else {
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
  }
  setenv("KOLO_TIMEOUT_SECONDS", "60", 1);
  torch::set_num_threads(1);

  init_torch();
  if (kolo::rank() != rank || kolo::size() != size) {
    return "kolo says rank " + std::to_string(kolo::rank()) + " of " + std::to_string(kolo::size());
  }
  // A collective: the sum of 1..size.
  TensorOpOptions sum_options;
  sum_options.op = ReduceOp::kSum;
  const torch::Tensor sum = allreduce(torch::full({5}, rank + 1.0f), "c10d/sum", sum_options);
  const float expected_sum = size * (size + 1) / 2.0f;
  if (!torch::equal(sum, torch::full({5}, expected_sum))) return "allreduce sum is wrong";

  // DistributedOptimizer on this rank's shard equals one process on the whole batch.
  const torch::Tensor mine =
      train(size, rank * kSamplesPerRank, (rank + 1) * kSamplesPerRank, /*distributed=*/true);
  const torch::Tensor whole = train(size, 0, size * kSamplesPerRank, /*distributed=*/false);
  if (!torch::allclose(mine, whole, 1e-5, 1e-6)) {
    return "parameters differ from one process on the whole batch by " +
           std::to_string((mine - whole).abs().max().item<double>());
  }
  shutdown();
  return "";
}

void expect_all_passed(const std::vector<RankOutcome>& outcomes) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ": " << outcomes[r].result;
    EXPECT_EQ(outcomes[r].result, "") << "rank " << r;
  }
}

class AgentStore : public ::testing::TestWithParam<int> {};

TEST_P(AgentStore, WorkersJoinTheAgentsStoreAndTrain) {
  const int size = GetParam();
  const auto agent = serve_agent_store();
  const int port = agent->getPort();
  ASSERT_GT(port, 0);
  const auto outcomes = run_forked_ranks(
      size, [&](int rank, SharedState&) { return torchrun_worker(rank, size, port, true); },
      nullptr, milliseconds(180000));
  expect_all_passed(outcomes);
  // The workers rendezvoused in the agent's store.
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(agent->check({"kolo/inits/" + std::to_string(r)})) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, AgentStore, ::testing::Values(2, 3));

TEST(NoAgentStore, RankZeroServesKolosStoreAsBefore) {
  const int size = 2;
  const int port = free_port();
  ASSERT_GT(port, 0);
  const auto outcomes = run_forked_ranks(
      size, [&](int rank, SharedState&) { return torchrun_worker(rank, size, port, false); },
      nullptr, milliseconds(180000));
  expect_all_passed(outcomes);
}

// kolo::init() (the core alone) cannot join a c10d store: it says what to call.
TEST(CoreInit, UnderAnAgentStoreNamesInitTorch) {
  const auto agent = serve_agent_store();
  InitOptions options;
  options.env = map_env({{"RANK", "0"},
                         {"WORLD_SIZE", "2"},
                         {"LOCAL_RANK", "0"},
                         {"LOCAL_WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "127.0.0.1"},
                         {"MASTER_PORT", std::to_string(agent->getPort())},
                         {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  try {
    init(options);
    shutdown();
    ADD_FAILURE() << "kolo::init() joined a c10d store without libtorch";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("kolo::init_torch()"), std::string::npos) << e.what();
  }
}

// A wait on the c10d store names the keys nobody set when it times out.
TEST(C10dStore, WaitTimesOutNamingTheMissingKeys) {
  const auto agent = serve_agent_store();
  auto store = connect_c10d_store("127.0.0.1", agent->getPort(), seconds(10));
  store->set("present", to_bytes("1"));
  EXPECT_EQ(to_string(store->get("present", seconds(1))), "1");
  EXPECT_EQ(store->add("counter", 2), 2);
  EXPECT_EQ(store->add("counter", 3), 5);
  EXPECT_TRUE(store->erase("present"));
  EXPECT_FALSE(store->check({"present"}));
  try {
    store->wait({"counter", "absent"}, milliseconds(200));
    ADD_FAILURE() << "wait returned without the key";
  } catch (const TimeoutError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("absent"), std::string::npos) << message;
    EXPECT_EQ(message.find("counter"), std::string::npos) << message;
  }
}

// A TCP server that is not a c10d store: it accepts connections, then
// either sends `reply` over and over, or (empty) reads and never answers, or
// (close_on_request) closes each connection once a request arrived, as
// kolo's own store does with a frame it cannot authenticate.
class FakeStoreServer {
 public:
  explicit FakeStoreServer(std::string reply, bool close_on_request = false)
      : reply_(std::move(reply)), close_on_request_(close_on_request) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    EXPECT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    EXPECT_EQ(listen(listener_, 8), 0);
    socklen_t length = sizeof address;
    getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeStoreServer() {
    stop_ = true;
    shutdown(listener_, SHUT_RDWR);
    close(listener_);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  void serve() {
    std::vector<int> clients;
    while (!stop_) {
      const int client = accept(listener_, nullptr, nullptr);
      if (client < 0) break;
      char buffer[4096];
      if (close_on_request_) {
        (void)!recv(client, buffer, sizeof buffer, 0);
        close(client);
        continue;
      }
      clients.push_back(client);
      if (reply_.empty()) continue;  // holds the connection, answers nothing
      timeval short_wait{0, 100000};
      setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &short_wait, sizeof short_wait);
      for (int i = 0; i < 50 && !stop_; ++i) {
        (void)!recv(client, buffer, sizeof buffer, 0);
        if (send(client, reply_.data(), reply_.size(), MSG_NOSIGNAL) < 0) break;
      }
    }
    for (int client : clients) close(client);
  }

  std::string reply_;
  bool close_on_request_ = false;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Every store operation either works or throws kolo's error: `work` must
// throw RuntimeFault (TimeoutError is one), within `limit`.
void expect_a_fault_within(const std::function<void()>& work, milliseconds limit,
                           const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  try {
    work();
    ADD_FAILURE() << what << ": no error";
  } catch (const RuntimeFault& e) {
    EXPECT_NE(std::string(e.what()).find("c10d store"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": not a kolo::RuntimeFault: " << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, limit) << what;
}

// A server that answers garbage (huge lengths, wrong types) fails the store
// with kolo's RuntimeFault on every operation, never an uncaught
// std::length_error; one that accepts and never answers fails it after the
// store's timeout, never blocks forever.
TEST(C10dStore, AServerThatIsNotAStoreFailsWithinTheTimeout) {
  for (const std::string& reply : {std::string(64, '\xff'), std::string("garbage\n")}) {
    FakeStoreServer server(reply);
    expect_a_fault_within(
        [&] {
          auto store = connect_c10d_store("127.0.0.1", server.port(), seconds(2));
          store->add("counter", 1);
          store->get("counter", seconds(1));
        },
        seconds(20), "garbage");
  }
  FakeStoreServer silent("");
  expect_a_fault_within(
      [&] {
        auto store = connect_c10d_store("127.0.0.1", silent.port(), seconds(2));
        store->add("counter", 1);
      },
      seconds(20), "silent");
}

// KOLO_STORE=c10d pointed at a store of another protocol (kolorun's own,
// which closes a connection whose frames it cannot authenticate): the error
// says what the server probably is and what to do, not only "Connection
// reset by peer".
TEST(C10dStore, AServerThatClosesOnARequestIsNamedAsAnotherProtocol) {
  FakeStoreServer closing("", /*close_on_request=*/true);
  std::string message;
  try {
    auto store = connect_c10d_store("127.0.0.1", closing.port(), seconds(2));
    store->add("counter", 1);
    ADD_FAILURE() << "a server that closes every connection answered";
  } catch (const RuntimeFault& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("is it a c10d TCPStore"), std::string::npos) << message;
  EXPECT_NE(message.find("leave KOLO_STORE unset"), std::string::npos) << message;
}

// The case itself: KOLO_STORE=c10d under kolorun, whose store is kolo's own
// (libtorch 2.x's ping gets an answer it does not expect; 1.13's first
// request gets none): the error names the likely mistake, at the store's
// timeout.
TEST(C10dStore, KolosOwnStoreIsNamedAsAnotherProtocol) {
  TcpStoreServer kolos_store({});
  std::string message;
  try {
    connect_c10d_store("127.0.0.1", kolos_store.port(), seconds(2))->add("counter", 1);
    ADD_FAILURE() << "a c10d client worked against kolo's store";
  } catch (const RuntimeFault& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("is it a c10d TCPStore"), std::string::npos) << message;
  EXPECT_NE(message.find("leave KOLO_STORE unset"), std::string::npos) << message;
}

}  // namespace
}  // namespace kolo

#include "baselines.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#if KOLO_HAVE_MPI
#include <mpi.h>
#endif
#if KOLO_HAVE_GLOO
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace kolo::bench {

#if KOLO_HAVE_MPI
namespace {
class MpiRawAllreduce : public RawOp {
 public:
  explicit MpiRawAllreduce(size_t count) : in_(count, 1.0f), out_(count) {}
  void run() override {
    MPI_Allreduce(in_.data(), out_.data(), static_cast<int>(in_.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  }

 private:
  std::vector<float> in_, out_;
};
}  // namespace

std::function<std::unique_ptr<RawOp>(size_t)> mpi_raw_allreduce_factory() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return nullptr;
  return [](size_t count) { return std::make_unique<MpiRawAllreduce>(count); };
}

namespace {
class MpiRawPingPong : public RawOp {
 public:
  explicit MpiRawPingPong(size_t bytes) : buffer_(bytes, 1) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  }
  void run() override {
    const int count = static_cast<int>(buffer_.size());
    if (rank_ == 0) {
      MPI_Send(buffer_.data(), count, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(buffer_.data(), count, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank_ == 1) {
      MPI_Recv(buffer_.data(), count, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buffer_.data(), count, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
  }

 private:
  std::vector<char> buffer_;
  int rank_ = 0;
};
}  // namespace

std::function<std::unique_ptr<RawOp>(size_t)> mpi_raw_pingpong_factory() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return nullptr;
  return [](size_t bytes) { return std::make_unique<MpiRawPingPong>(bytes); };
}
#else
std::function<std::unique_ptr<RawOp>(size_t)> mpi_raw_allreduce_factory() { return nullptr; }
std::function<std::unique_ptr<RawOp>(size_t)> mpi_raw_pingpong_factory() { return nullptr; }
#endif

#if KOLO_HAVE_GLOO
namespace {
// gloo's rendezvous store interface over kolo's Store.
class GlooStore : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<kolo::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const Bytes value = store_->get(key, std::chrono::seconds(60));
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override {
    store_->wait(keys, std::chrono::seconds(60));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<kolo::Store> store_;
};

class GlooRawAllreduce : public RawOp {
 public:
  GlooRawAllreduce(const std::shared_ptr<gloo::Context>& context, size_t count)
      : buffer_(count, 1.0f),
        algorithm_(std::make_unique<gloo::AllreduceRingChunked<float>>(
            context, std::vector<float*>{buffer_.data()}, static_cast<int>(count))) {}
  void run() override { algorithm_->run(); }

 private:
  std::vector<float> buffer_;
  // Held by pointer: gloo's algorithm destructors are noexcept(false).
  std::unique_ptr<gloo::AllreduceRingChunked<float>> algorithm_;
};
}  // namespace

std::function<std::unique_ptr<RawOp>(size_t)> gloo_raw_allreduce_factory(
    std::shared_ptr<Store> store, int rank, int size, const std::string& address) {
  gloo::transport::tcp::attr attr;
  attr.hostname = address;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  GlooStore gloo_store(std::move(store));
  context->connectFullMesh(gloo_store, device);
  return [context](size_t count) { return std::make_unique<GlooRawAllreduce>(context, count); };
}
#else
std::function<std::unique_ptr<RawOp>(size_t)> gloo_raw_allreduce_factory(std::shared_ptr<Store>,
                                                                         int, int,
                                                                         const std::string&) {
  return nullptr;
}
#endif

double memcpy_bandwidth_gbps(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::vector<double> gbps;
  for (int rep = 0; rep < 7; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    gbps.push_back(2.0 * bytes / seconds / 1e9);
  }
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

}  // namespace kolo::bench

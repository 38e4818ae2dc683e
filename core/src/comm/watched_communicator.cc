// WatchedCommunicator (watched_communicator.h).
#include "comm/watched_communicator.h"

#include <utility>

#include "comm/p2p.h"

namespace kolo::detail {

namespace {

// The inner transfer, with its wait() registered in the watch.
class WatchedP2POp final : public P2POp {
 public:
  WatchedP2POp(P2PHandle inner, std::shared_ptr<P2PWatch> watch, P2PKind kind, int peer,
               const P2POptions& options)
      : inner_(std::move(inner)),
        watch_(std::move(watch)),
        kind_(kind),
        peer_(peer),
        tag_(options.tag),
        timeout_(options.timeout) {}

  bool test() override { return inner_.test(); }
  void wait() override {
    struct Leave {
      P2PWatch& watch;
      uint64_t id;
      ~Leave() { watch.leave(id); }
    } leave{*watch_, watch_->enter(kind_, peer_, tag_, timeout_)};
    inner_.wait();
  }

 private:
  P2PHandle inner_;
  std::shared_ptr<P2PWatch> watch_;
  P2PKind kind_;
  int peer_;
  int tag_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

WatchedCommunicator::WatchedCommunicator(std::unique_ptr<Communicator> inner,
                                         P2PWatch::Options options, Logger logger)
    : inner_(std::move(inner)), watch_(std::make_shared<P2PWatch>(inner_.get(), options, logger)) {}

WatchedCommunicator::~WatchedCommunicator() { watch_->detach(); }

P2PHandle WatchedCommunicator::isend(const void* data, size_t count, DType dtype, int peer,
                                     const P2POptions& options) {
  return P2PHandle(std::make_shared<WatchedP2POp>(inner_->isend(data, count, dtype, peer, options),
                                                  watch_, P2PKind::kSend, peer, options));
}

P2PHandle WatchedCommunicator::irecv(void* data, size_t count, DType dtype, int peer,
                                     const P2POptions& options) {
  return P2PHandle(std::make_shared<WatchedP2POp>(inner_->irecv(data, count, dtype, peer, options),
                                                  watch_, P2PKind::kRecv, peer, options));
}

}  // namespace kolo::detail

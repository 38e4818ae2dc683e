// Parameter server, libtorch side: the servers' slices and optimizer, the
// workers' pull and push (messages and clocks: ps_protocol.h; links:
// kolo/core/parameter_server.h).
#include "kolo/torch/parameter_server.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>
#include <utility>

#include "kolo/core/errors.h"
#include "kolo/torch/ps_embedding.h"
#include "kolo/torch/tensor.h"
#include "ps_checkpoint.h"
#include "ps_protocol.h"

namespace kolo::ps {
namespace {

// The specs of the model's parameters, all of one floating dtype.
std::vector<VariableSpec> specs_of(const NamedParameters& parameters, const std::string& who,
                                   c10::ScalarType* dtype) {
  std::vector<VariableSpec> specs;
  if (parameters.is_empty()) throw ContractError(who + ": the model has no parameters");
  *dtype = parameters[0].value().scalar_type();
  for (const auto& item : parameters) {
    const torch::Tensor& p = item.value();
    if (!p.defined() || !p.device().is_cpu() || !p.is_floating_point()) {
      throw ContractError(who + ": parameter '" + item.key() +
                          "' must be a defined floating-point CPU tensor");
    }
    if (p.scalar_type() != *dtype) {
      throw ContractError(who + ": parameter '" + item.key() + "' is " +
                          std::string(c10::toString(p.scalar_type())) + " but '" +
                          parameters[0].key() + "' is " + c10::toString(*dtype) +
                          "; the parameter server moves one dtype: convert the model first");
    }
    specs.push_back({item.key(), p.sizes().vec(), to_kolo_dtype(p.scalar_type(), who, item.key())});
  }
  return specs;
}

void send_header(Communicator& link, int peer, const Header& header,
                 std::chrono::milliseconds timeout) {
  const std::vector<int64_t> words = header.encode();
  P2POptions o;
  o.tag = header.kind == Kind::kReply ? kReplyTag : kRequestTag;
  o.timeout = timeout;
  link.send(words.data(), words.size(), DType::kI64, peer, o);
}

Header recv_header(Communicator& link, int peer, int tag, std::chrono::milliseconds timeout,
                   const std::string& source) {
  int64_t words[kHeaderWords];
  P2POptions o;
  o.tag = tag;
  o.timeout = timeout;
  link.recv(words, kHeaderWords, DType::kI64, peer, o);
  return Header::decode(words, source);
}

void send_tensor(Communicator& link, int peer, int tag, const torch::Tensor& t,
                 std::chrono::milliseconds timeout) {
  P2POptions o;
  o.tag = tag;
  o.timeout = timeout;
  link.send(t.data_ptr(), static_cast<size_t>(t.numel()), to_kolo_dtype(t.scalar_type(), "ps", "t"),
            peer, o);
}

void recv_tensor(Communicator& link, int peer, int tag, const torch::Tensor& t,
                 std::chrono::milliseconds timeout) {
  P2POptions o;
  o.tag = tag;
  o.timeout = timeout;
  link.recv(t.data_ptr(), static_cast<size_t>(t.numel()), to_kolo_dtype(t.scalar_type(), "ps", "t"),
            peer, o);
}

// Hello's value: the mode and the bound, as the worker sees them.
int64_t mode_word(const PsOptions& o) {
  return static_cast<int64_t>(o.mode) | (static_cast<int64_t>(o.max_staleness) << 8);
}
std::string describe_mode(int64_t word) {
  const Mode mode = static_cast<Mode>(word & 0xff);
  std::string text = mode_name(mode);
  if (mode == Mode::kSsp) text += " (max_staleness " + std::to_string(word >> 8) + ")";
  return text;
}

constexpr int64_t kRefusedModel = 1;
constexpr int64_t kRefusedMode = 2;
constexpr int64_t kRefusedRejoin = 3;  // a restarted worker, but the server runs sync

}  // namespace

// ---- Server ----

struct Server::Impl {
  PsOptions options;
  Links links;
  std::vector<VariableSpec> specs;
  int64_t fingerprint = 0;
  Partition partition;
  int server = 0;
  std::vector<torch::Tensor> slices;  // this server's parameters (1-D leaves)
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  c10::ScalarType dtype = torch::kFloat;
  int64_t numel = 0;

  mutable std::mutex mutex;  // guards everything below, the slices and the optimizer
  std::condition_variable changed;
  ServerClocks clocks;
  torch::Tensor round_sum;     // sync: the sum of this round's pushes
  std::exception_ptr failure;  // set when a sync server stops
  std::vector<std::string> lost;
  int64_t resumed_step = 0;     // the step of the checkpoint resumed from (0: none)
  bool resume_pending = false;  // resume_from: loaded by run(), once every table is added
  int64_t saved_step = 0;       // the last step saved (or resumed from)
  std::vector<std::shared_ptr<EmbeddingTable>> tables;  // sparse tables (ps_embedding.h)
  // Per worker: a restarted worker's new link is up but its kRejoin has not
  // come yet (the server must not end while one is on its way back).
  std::vector<bool> rejoining;
  // Per worker: when its last request came (or its link came up).
  std::vector<std::chrono::steady_clock::time_point> heard;
  // Per worker: this server evicted it (evict_silent) and its link has not
  // come back; the link's failure that follows is not a second loss.
  std::vector<bool> evicted;
  // Per worker: the restart generation of its current link (0: first start).
  std::vector<int64_t> generations;

  Impl(int workers, const PsOptions& o)
      : options(o),
        clocks(workers, o.mode, o.max_staleness),
        rejoining(workers, false),
        heard(workers, std::chrono::steady_clock::now()),
        evicted(workers, false),
        generations(workers, 0) {}

  // PsOptions::evict_after, its 0 resolved against the workers' timeout.
  std::chrono::milliseconds evict_after() const {
    if (options.evict_after.count() > 0) return options.evict_after;
    const std::chrono::milliseconds timeout =
        options.timeout.count() > 0 ? options.timeout : links.timeout;
    return timeout * 9 / 10;
  }

  std::string name() const {
    return "kolo::ps::Server " + std::to_string(server) + " (rank " +
           std::to_string(links.roles.rank) + ")";
  }

  // Sets the slices' grads to consecutive pieces of `flat` and steps.
  void apply(const torch::Tensor& flat) {
    int64_t offset = 0;
    for (torch::Tensor& p : slices) {
      p.mutable_grad() = flat.slice(0, offset, offset + p.numel());
      offset += p.numel();
    }
    optimizer->step();
  }

  // After an update, under the lock: saves the shard once the slowest live
  // worker has pushed checkpoint_every more steps than at the last save (in
  // sync mode: after that round's update), so every server saves the same
  // steps. A failed save stops the server (every worker gets the error).
  void maybe_save() {
    if (options.checkpoint_every <= 0) return;
    const int64_t step = clocks.slowest_live_clock();
    if (step == INT64_MAX || step < saved_step + options.checkpoint_every) return;
    if (options.mode == Mode::kSync && clocks.rounds_applied() < step) return;
    saved_step = step;
    try {
      detail::save_shard(options.checkpoint_dir, identity(), step, shard_tensors(), *optimizer);
    } catch (const std::exception& e) {
      const std::string reason = name() + ": saving its checkpoint at step " +
                                 std::to_string(step) + " failed: " + e.what();
      failure = std::make_exception_ptr(ContractError(reason));
      for (auto& link : links.peers) link->abort(reason, {});
    }
  }

  detail::ShardIdentity identity() const {
    return {server, links.roles.servers, fingerprint, options.mode, options.checkpoint_every};
  }

  // What a checkpoint of this server holds: the slices and every table.
  detail::ShardTensors shard_tensors() const {
    detail::ShardTensors tensors;
    tensors.slices = slices;
    for (const auto& table : tables) tensors.tables.push_back({table->identity(), table->state()});
    return tensors;
  }

  // resume_from, at the start of run(): the shard (slices, tables, optimizer)
  // and the step every worker continues from. A shard that does not load
  // aborts every link, so that the workers get the error instead of waiting.
  void resume() {
    try {
      torch::NoGradGuard no_grad;
      resumed_step =
          detail::load_shard(options.resume_from, identity(), shard_tensors(), *optimizer);
    } catch (const std::exception& e) {
      for (auto& link : links.peers) link->abort(name() + ": " + e.what(), {});
      throw;
    }
    saved_step = resumed_step;
    clocks.resume(resumed_step);
    resume_pending = false;
  }

  // Sync: applies the round's average (dense and every table's rows) once.
  void complete_round() {
    const int pushes = clocks.round_pushes();
    round_sum.div_(pushes);
    apply(round_sum);
    round_sum.zero_();
    for (const auto& table : tables) table->apply_round(pushes);
    clocks.round_applied();
  }

  void serve(int worker);
  // Serves one link of `worker` until it finishes (true) or fails (false).
  bool serve_link(int worker);
  // Async and ssp with a rejoin channel: waits for `worker` to come back
  // (true: links.peers[worker] is its new link) or for the server to have
  // no one left to serve (false).
  bool await_rejoin(int worker, int64_t* generation);
  void handle_hello(int worker, const Header& h);
  void handle_rejoin(int worker, const Header& h);
  void serve_pull(int worker, const Header& h, int64_t count,
                  const std::function<torch::Tensor()>& read);
  void handle_pull(int worker, const Header& h);
  void handle_push(int worker, const Header& h, torch::Tensor& buffer);
  // The table a sparse request names, or null and why not.
  EmbeddingTable* table_of(int worker, const Header& h, std::string* why);
  torch::Tensor recv_rows(int worker, const Header& h, const EmbeddingTable& table);
  void handle_sparse_pull(int worker, const Header& h);
  void handle_sparse_push(int worker, const Header& h);
  void lose(int worker, const std::string& why);
  void lose_locked(int worker, const std::string& why);
  // Under `lock`, while `waiting`'s pull for step `clock` cannot be served:
  // evicts the workers it waits for that have sent nothing for
  // evict_after() (PsOptions::evict_after), and asks the launcher to stop
  // them (with the lock released for the store's round trip).
  void evict_silent(int waiting, int64_t clock, std::unique_lock<std::mutex>& lock);
};

void Server::Impl::handle_hello(int worker, const Header& h) {
  Header reply;
  reply.kind = Kind::kReply;
  reply.value = mode_word(options);
  reply.clock = resumed_step;  // where the worker continues
  if (h.fingerprint != fingerprint) {
    reply.status = kRefusedModel;
  } else if (h.value != mode_word(options)) {
    reply.status = kRefusedMode;
  } else if (h.clock > 0 && options.mode == Mode::kSync) {
    reply.status = kRefusedRejoin;
  } else if (h.clock > 0) {
    std::lock_guard<std::mutex> lock(mutex);
    reply.clock = clocks.rejoin_clock(worker);  // the worker takes the servers' largest
  }
  send_header(*links.peers[worker], kWorkerPeer, reply, options.timeout);
  if (reply.status != 0) {
    throw ContractError(name() + " refused worker " + std::to_string(worker) +
                        (reply.status == kRefusedModel
                             ? ": its model's parameters (names, shapes, dtypes) differ from "
                               "the server's; build the same model on every rank"
                         : reply.status == kRefusedMode
                             ? ": it runs mode " + describe_mode(h.value) + ", the server " +
                                   describe_mode(mode_word(options))
                             : ": a restarted worker cannot rejoin a sync job"));
  }
}

void Server::Impl::handle_rejoin(int worker, const Header& h) {
  std::lock_guard<std::mutex> lock(mutex);
  if (!rejoining[worker]) {
    throw ContractError(name() + ": worker " + std::to_string(worker) +
                        " sent a rejoin without being restarted (kolorun --restart-workers)");
  }
  rejoining[worker] = false;
  clocks.rejoined(worker, h.clock);
  changed.notify_all();
}

// Waits until a pull for step h.clock may be served, records it, takes the
// data `read` returns (`count` elements or rows, under the lock) and sends
// the reply and the data.
void Server::Impl::serve_pull(int worker, const Header& h, int64_t count,
                              const std::function<torch::Tensor()>& read) {
  torch::Tensor data;
  Header reply;
  reply.kind = Kind::kReply;
  {
    std::unique_lock<std::mutex> lock(mutex);
    // Checked 8 times per evict_after(), at least every 250 ms: the
    // eviction comes within 1/8 of it late, before the waiting worker's
    // own timeout (the default evict_after is 9/10 of it).
    const auto check = std::max(std::chrono::milliseconds(10),
                                std::min(std::chrono::milliseconds(250), evict_after() / 8));
    while (!failure && !clocks.may_serve_pull(h.clock)) {
      changed.wait_for(lock, check);
      if (!failure && !clocks.may_serve_pull(h.clock)) evict_silent(worker, h.clock, lock);
    }
    if (failure) std::rethrow_exception(failure);
    reply.value = clocks.served_pull(worker, h.clock);
    reply.clock = h.clock;
    reply.count = count;
    data = read();
  }
  Communicator& link = *links.peers[worker];
  send_header(link, kWorkerPeer, reply, options.timeout);
  send_tensor(link, kWorkerPeer, kParamsTag, data, options.timeout);
}

void Server::Impl::handle_pull(int worker, const Header& h) {
  serve_pull(worker, h, numel,
             [&] { return slices.empty() ? torch::empty({0}, dtype) : torch::cat(slices); });
}

void Server::Impl::handle_push(int worker, const Header& h, torch::Tensor& buffer) {
  if (h.count != numel) {
    throw ContractError(name() + ": worker " + std::to_string(worker) + " pushed " +
                        std::to_string(h.count) + " elements, the shard holds " +
                        std::to_string(numel));
  }
  recv_tensor(*links.peers[worker], kWorkerPeer, kPushTag, buffer, options.timeout);
  std::lock_guard<std::mutex> lock(mutex);
  if (failure) std::rethrow_exception(failure);
  torch::NoGradGuard no_grad;
  const bool round_complete = clocks.pushed(worker, h.clock);
  if (options.mode != Mode::kSync) {
    apply(buffer);
  } else {
    round_sum.add_(buffer);
    if (round_complete) complete_round();
  }
  maybe_save();
  changed.notify_all();
}

EmbeddingTable* Server::Impl::table_of(int worker, const Header& h, std::string* why) {
  const bool known = h.value >= 0 && h.value < static_cast<int64_t>(tables.size());
  if (known && tables[h.value]->options().fingerprint() == h.fingerprint &&
      h.count <= tables[h.value]->rows()) {
    return tables[h.value].get();
  }
  *why = name() + " refused worker " + std::to_string(worker) + "'s rows of table " +
         std::to_string(h.value) +
         (!known ? ": the server holds " + std::to_string(tables.size()) +
                       " table(s); add the same tables, in the same order, on every server"
          : tables[h.value]->options().fingerprint() != h.fingerprint
              ? ": the table's name, rows or dim differ from the server's '" +
                    tables[h.value]->options().name + "'"
              : ": " + std::to_string(h.count) + " rows, more than the " +
                    std::to_string(tables[h.value]->rows()) + " this server holds");
  return nullptr;
}

// The row ids of a sparse request, checked against the table's range.
torch::Tensor Server::Impl::recv_rows(int worker, const Header& h, const EmbeddingTable& table) {
  torch::Tensor rows = torch::empty({h.count}, torch::kLong);
  recv_tensor(*links.peers[worker], kWorkerPeer, kPushTag, rows, options.timeout);
  if (h.count > 0) {
    const int64_t lo = rows.min().item<int64_t>();
    const int64_t hi = rows.max().item<int64_t>();
    if (lo < 0 || hi >= table.rows()) {
      throw ContractError(name() + ": worker " + std::to_string(worker) + " named row " +
                          std::to_string(lo < 0 ? lo : hi) + " of table '" + table.options().name +
                          "', outside the server's " + std::to_string(table.rows()) + " rows");
    }
  }
  return rows;
}

void Server::Impl::handle_sparse_pull(int worker, const Header& h) {
  std::string why;
  EmbeddingTable* table = table_of(worker, h, &why);
  if (h.count == 0) {
    // A greeting (Worker::check_table): the verdict, nothing follows, and
    // the link stays in step (the refused worker throws, then leaves).
    Header reply;
    reply.kind = Kind::kReply;
    reply.status = table ? 0 : kRefusedModel;
    send_header(*links.peers[worker], kWorkerPeer, reply, options.timeout);
    return;
  }
  if (!table) throw ContractError(why);  // the worker's greeting was accepted: a broken peer
  const torch::Tensor rows = recv_rows(worker, h, *table);
  serve_pull(worker, h, h.count, [&] { return table->gather(rows); });
}

void Server::Impl::handle_sparse_push(int worker, const Header& h) {
  std::string why;
  EmbeddingTable* found = table_of(worker, h, &why);
  if (!found) throw ContractError(why);
  EmbeddingTable& table = *found;
  const torch::Tensor rows = recv_rows(worker, h, table);
  torch::Tensor grads = torch::empty({h.count, table.options().dim}, torch::kFloat);
  recv_tensor(*links.peers[worker], kWorkerPeer, kPushTag, grads, options.timeout);
  std::lock_guard<std::mutex> lock(mutex);
  if (failure) std::rethrow_exception(failure);
  if (h.clock != clocks.next_step(worker)) {
    throw ContractError(name() + ": worker " + std::to_string(worker) + " pushed rows of table '" +
                        table.options().name + "' for step " + std::to_string(h.clock) +
                        " but its next step is " + std::to_string(clocks.next_step(worker)) +
                        "; call Embedding::push() before Worker::push()");
  }
  torch::NoGradGuard no_grad;
  if (options.mode == Mode::kSync) {
    table.accumulate(rows, grads);
  } else {
    table.apply(rows, grads);
  }
}

void Server::Impl::evict_silent(int waiting, int64_t clock, std::unique_lock<std::mutex>& lock) {
  const auto now = std::chrono::steady_clock::now();
  const std::chrono::milliseconds limit = evict_after();
  struct Eviction {
    int worker;
    int64_t generation;
    std::string why;
  };
  std::vector<Eviction> evictions;
  for (int w : clocks.holding_back(clock)) {
    if (now - heard[w] < limit) continue;
    const double silent = std::chrono::duration<double>(now - heard[w]).count();
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.1f", silent);
    std::string why =
        "it sent nothing for " + std::string(seconds) + " s (PsOptions::evict_after " +
        std::to_string(limit.count()) + " ms) while worker " + std::to_string(waiting) +
        "'s pull for step " + std::to_string(clock) + " waited for its step " +
        std::to_string(clocks.next_step(w)) + ", in mode " + describe_mode(mode_word(options)) +
        ": a frozen process (stopped, swapped out)?";
    const std::string reason = name() + " evicted worker " + std::to_string(w) + " (world rank " +
                               std::to_string(w) + "): " + why;
    lose_locked(w, "evicted: " + why);
    evicted[w] = true;
    links.peers[w]->abort(reason, {kWorkerPeer});
    evictions.push_back(
        {w, generations[w], "parameter server " + std::to_string(server) + " evicted it: " + why});
  }
  if (evictions.empty() || !links.rejoin || !links.rejoin->evict) return;
  lock.unlock();
  for (const Eviction& e : evictions) {
    std::string failed;
    try {
      links.rejoin->evict(e.worker, e.generation, e.why);
    } catch (const std::exception& error) {
      failed = std::string("asking the launcher to stop it: ") + error.what();
    }
    if (!failed.empty()) {
      std::lock_guard<std::mutex> relock(mutex);
      lost.push_back("worker " + std::to_string(e.worker) + ": " + failed);
    }
  }
  lock.lock();
}

void Server::Impl::lose(int worker, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex);
  lose_locked(worker, why);
}

void Server::Impl::lose_locked(int worker, const std::string& why) {
  if (evicted[worker]) return;  // its link's failure after the eviction: lost already
  clocks.left(worker);
  rejoining[worker] = false;
  if (!why.empty()) lost.push_back("worker " + std::to_string(worker) + ": " + why);
  if (!why.empty() && options.mode == Mode::kSync && !failure) {
    // Every step needs every worker: stop, and tell the others at once.
    const std::string reason = name() + " (mode sync) lost worker " + std::to_string(worker) +
                               " (world rank " + std::to_string(worker) + "): " + why;
    failure = std::make_exception_ptr(RuntimeFault(reason, {worker}));
    for (size_t w = 0; w < links.peers.size(); ++w) {
      if (static_cast<int>(w) != worker) links.peers[w]->abort(reason, {});
    }
  }
  // A round may now be complete without this worker (it left after pushing
  // nothing more); apply it so that the others go on.
  if (!failure && clocks.round_complete()) {
    torch::NoGradGuard no_grad;
    complete_round();
  }
  changed.notify_all();
}

void Server::Impl::serve(int worker) {
  int64_t generation = 0;  // of the worker's current link
  while (!serve_link(worker) && await_rejoin(worker, &generation)) {
  }
}

bool Server::Impl::await_rejoin(int worker, int64_t* generation) {
  if (options.mode == Mode::kSync || !links.rejoin) return false;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      // Nobody left to serve, and nobody on the way back: the job is over.
      if (failure || (clocks.all_left() &&
                      std::none_of(rejoining.begin(), rejoining.end(), [](bool b) { return b; }))) {
        return false;
      }
      changed.wait_for(lock, std::chrono::milliseconds(20));
    }
    int64_t announced = 0;
    try {
      announced = links.rejoin->announced(worker);  // a store round trip: not under the lock
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex);
      lost.push_back("worker " + std::to_string(worker) + ": the rendezvous store: " + e.what());
      return false;
    }
    if (announced <= *generation) continue;
    *generation = announced;
    {
      std::lock_guard<std::mutex> lock(mutex);
      rejoining[worker] = true;
    }
    try {
      std::unique_ptr<Communicator> link = links.rejoin->accept(worker, announced);
      std::lock_guard<std::mutex> lock(mutex);
      links.peers[worker] = std::move(link);
      evicted[worker] = false;
      heard[worker] = std::chrono::steady_clock::now();
      generations[worker] = announced;
      return true;
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex);
      rejoining[worker] = false;
      lost.push_back("worker " + std::to_string(worker) + " (restart " + std::to_string(announced) +
                     "): " + e.what());
    }
  }
}

bool Server::Impl::serve_link(int worker) {
  Communicator& link = *links.peers[worker];
  const std::string source = name() + ", request from worker " + std::to_string(worker);
  torch::Tensor buffer = torch::empty({numel}, dtype);
  try {
    for (;;) {
      const Header h = recv_header(link, kWorkerPeer, kRequestTag, options.idle_timeout, source);
      {
        std::lock_guard<std::mutex> lock(mutex);
        heard[worker] = std::chrono::steady_clock::now();
      }
      switch (h.kind) {
        case Kind::kHello:
          handle_hello(worker, h);
          break;
        case Kind::kPull:
          handle_pull(worker, h);
          break;
        case Kind::kPush:
          handle_push(worker, h, buffer);
          break;
        case Kind::kSparsePull:
          handle_sparse_pull(worker, h);
          break;
        case Kind::kSparsePush:
          handle_sparse_push(worker, h);
          break;
        case Kind::kRejoin:
          handle_rejoin(worker, h);
          break;
        case Kind::kDone:
          lose(worker, "");
          return true;
        case Kind::kReply:
          throw ContractError(source + ": a reply where a request was expected");
      }
    }
  } catch (const std::exception& e) {
    lose(worker, e.what());
  }
  return false;
}

Server::Server(const NamedParameters& parameters, const OptimizerFactory& make_optimizer,
               Links links, const PsOptions& options)
    : impl_(std::make_unique<Impl>(links.roles.workers, options)) {
  Impl& s = *impl_;
  s.links = std::move(links);
  s.server = s.links.roles.server_index();
  if (!s.links.roles.is_server() ||
      s.links.peers.size() != static_cast<size_t>(s.links.roles.workers)) {
    throw ContractError("kolo::ps::Server: rank " + std::to_string(s.links.roles.rank) +
                        " is not a server (servers are the last KOLO_PS_SERVERS ranks)");
  }
  s.specs = specs_of(parameters, s.name(), &s.dtype);
  s.fingerprint = fingerprint(s.specs);
  s.partition = Partition::by_bytes(s.specs, s.links.roles.servers);
  s.numel = s.partition.shard_numel[s.server];
  torch::NoGradGuard no_grad;
  for (const Slice& slice : s.partition.slices[s.server]) {
    torch::Tensor piece =
        parameters[slice.variable].value().detach().reshape({-1}).slice(0, slice.begin, slice.end);
    s.slices.push_back(piece.clone().set_requires_grad(true));
  }
  s.optimizer = make_optimizer(s.slices);
  if (!s.optimizer) throw ContractError(s.name() + ": the optimizer factory returned null");
  if (options.checkpoint_every < 0 ||
      (options.checkpoint_every > 0 && options.checkpoint_dir.empty())) {
    throw ContractError(s.name() + ": checkpoint_every is " +
                        std::to_string(options.checkpoint_every) +
                        "; give checkpoint_dir and checkpoint_every > 0, or 0 for no checkpoints");
  }
  if (!options.resume_from.empty()) {
    // Here the shard must exist; run() loads it, once add_table() has given
    // every table it holds.
    detail::resume_step(options.resume_from, s.identity());
    s.resume_pending = true;
  }
  s.round_sum = torch::zeros({s.numel}, s.dtype);
}

Server::~Server() = default;

void Server::add_table(std::shared_ptr<EmbeddingTable> table) {
  if (!table) throw ContractError(impl_->name() + ": add_table(nullptr)");
  impl_->tables.push_back(std::move(table));
}

void Server::run() {
  if (impl_->resume_pending) impl_->resume();
  // Silence counts from here (evict_after): nobody was served before.
  std::fill(impl_->heard.begin(), impl_->heard.end(), std::chrono::steady_clock::now());
  std::vector<std::thread> threads;
  for (int w = 0; w < impl_->links.roles.workers; ++w) {
    threads.emplace_back([this, w] { impl_->serve(w); });
  }
  for (std::thread& t : threads) t.join();
  if (impl_->links.rejoin) {
    try {
      impl_->links.rejoin->close();  // a worker restarted from now on is refused, not left waiting
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(impl_->mutex);
      impl_->lost.push_back(std::string("closing the rejoin channel: ") + e.what());
    }
  }
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->failure) std::rethrow_exception(impl_->failure);
}

Server::Stats Server::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  Stats stats;
  stats.staleness = impl_->clocks.stats();
  stats.rounds = impl_->clocks.rounds_applied();
  stats.lost = impl_->lost;
  return stats;
}

std::vector<torch::Tensor> Server::shard() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->slices;
}

const std::vector<Slice>& Server::slices() const { return impl_->partition.slices[impl_->server]; }

// ---- Worker ----

struct Worker::Impl {
  PsOptions options;
  Links links;
  std::vector<torch::Tensor> parameters;  // the model's, in spec order
  std::vector<VariableSpec> specs;
  Partition partition;
  c10::ScalarType dtype = torch::kFloat;
  std::vector<torch::Tensor> buffers;  // per server: its shard's elements
  int64_t clock = 0;
  bool finished = false;
  Stats stats;

  std::string name() const {
    return "kolo::ps::Worker " + std::to_string(links.roles.worker_index());
  }
  std::string server_name(int s) const {
    return "parameter server " + std::to_string(s) + " (world rank " +
           std::to_string(links.roles.server_rank(s)) + ")";
  }

  // Runs fn on server s's link; a failed link is a RuntimeFault naming the server.
  template <typename Fn>
  void on_server(int s, const char* what, Fn&& fn) {
    try {
      fn(*links.peers[s]);
    } catch (const ContractError&) {
      throw;
    } catch (const TimeoutError& e) {
      throw TimeoutError(name() + " " + what + ": " + server_name(s) +
                             " did not answer in time (PsOptions::timeout): " + e.what(),
                         {links.roles.server_rank(s)});
    } catch (const RuntimeFault& e) {
      throw RuntimeFault(name() + " " + what + ": " + server_name(s) + " is gone: " + e.what(),
                         {links.roles.server_rank(s)});
    }
  }
};

Worker::Worker(const NamedParameters& parameters, Links links, const PsOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& w = *impl_;
  w.options = options;
  w.links = std::move(links);
  if (w.links.roles.is_server() ||
      w.links.peers.size() != static_cast<size_t>(w.links.roles.servers)) {
    throw ContractError("kolo::ps::Worker: rank " + std::to_string(w.links.roles.rank) +
                        " is a server (servers are the last KOLO_PS_SERVERS ranks)");
  }
  if (options.max_staleness < 0) {
    throw ContractError(w.name() + ": max_staleness must be >= 0, got " +
                        std::to_string(options.max_staleness));
  }
  w.specs = specs_of(parameters, w.name(), &w.dtype);
  for (const auto& item : parameters) w.parameters.push_back(item.value());
  w.partition = Partition::by_bytes(w.specs, w.links.roles.servers);
  for (int64_t n : w.partition.shard_numel) w.buffers.push_back(torch::empty({n}, w.dtype));
  Header hello;
  hello.kind = Kind::kHello;
  hello.fingerprint = fingerprint(w.specs);
  hello.value = mode_word(options);
  hello.clock = w.links.generation;
  const bool rejoining = w.links.generation > 0;
  int64_t start = -1;  // the step the servers continue from (a resumed checkpoint's)
  for (int s = 0; s < w.links.roles.servers; ++s) {
    w.on_server(s, "hello", [&](Communicator& link) {
      send_header(link, kServerPeer, hello, options.timeout);
      const Header reply = recv_header(link, kServerPeer, kReplyTag, options.timeout, w.name());
      if (reply.status == kRefusedModel) {
        throw ContractError(w.name() + ": " + w.server_name(s) +
                            " holds a different model (parameter names, shapes or dtypes "
                            "differ); build the same model on every rank");
      }
      if (reply.status == kRefusedRejoin) {
        throw ContractError(w.name() + ": restarted (KOLO_PS_REJOIN " +
                            std::to_string(w.links.generation) + ") but " + w.server_name(s) +
                            " runs mode sync, where every step needs every worker: a worker that "
                            "dies stops a sync job; use mode async or ssp to restart workers");
      }
      if (reply.status == kRefusedMode) {
        throw ContractError(w.name() + ": runs mode " + describe_mode(hello.value) + " but " +
                            w.server_name(s) + " runs " + describe_mode(reply.value) +
                            "; pass the same PsOptions on every rank");
      }
      if (rejoining) {
        start = std::max(start, reply.clock);
        return;
      }
      if (s > 0 && reply.clock != start) {
        throw ContractError(
            w.name() + ": " + w.server_name(0) + " continues from step " + std::to_string(start) +
            " but " + w.server_name(s) + " from step " + std::to_string(reply.clock) +
            ": the servers resumed from a mix of two checkpoints (PsOptions::resume_from holds "
            "shards of different saves); resume from one complete save");
      }
      start = reply.clock;
    });
  }
  w.clock = start;
  if (rejoining) {
    // Every server continues this worker's clock from the same step.
    Header joined;
    joined.kind = Kind::kRejoin;
    joined.clock = start;
    for (int s = 0; s < w.links.roles.servers; ++s) {
      w.on_server(s, "rejoin", [&](Communicator& link) {
        send_header(link, kServerPeer, joined, options.timeout);
      });
    }
  }
}

Worker::~Worker() {
  if (impl_ && !impl_->finished) {
    try {
      finish();
    } catch (...) {
      // Leaving anyway: the servers count a broken link as a worker gone.
    }
  }
}

void Worker::pull() {
  Impl& w = *impl_;
  if (w.finished) throw ContractError(w.name() + ": pull() after finish()");
  Header request;
  request.kind = Kind::kPull;
  request.clock = w.clock;
  const int servers = w.links.roles.servers;
  for (int s = 0; s < servers; ++s) {
    w.on_server(s, "pull", [&](Communicator& link) {
      send_header(link, kServerPeer, request, w.options.timeout);
    });
  }
  torch::NoGradGuard no_grad;
  for (int s = 0; s < servers; ++s) {
    w.on_server(s, "pull", [&](Communicator& link) {
      const Header reply = recv_header(link, kServerPeer, kReplyTag, w.options.timeout, w.name());
      if (reply.count != w.buffers[s].numel() || reply.clock != w.clock) {
        throw ContractError(w.name() + ": " + w.server_name(s) + " answered step " +
                            std::to_string(reply.clock) + " with " + std::to_string(reply.count) +
                            " elements; expected step " + std::to_string(w.clock) + " with " +
                            std::to_string(w.buffers[s].numel()));
      }
      recv_tensor(link, kServerPeer, kParamsTag, w.buffers[s], w.options.timeout);
      w.stats.max_staleness_seen = std::max(w.stats.max_staleness_seen, reply.value);
    });
    int64_t offset = 0;
    for (const Slice& slice : w.partition.slices[s]) {
      w.parameters[slice.variable]
          .view({-1})
          .slice(0, slice.begin, slice.end)
          .copy_(w.buffers[s].slice(0, offset, offset + slice.numel()));
      offset += slice.numel();
    }
    w.stats.bytes_pulled += w.buffers[s].numel() * w.buffers[s].element_size();
  }
}

void Worker::push() {
  Impl& w = *impl_;
  if (w.finished) throw ContractError(w.name() + ": push() after finish()");
  torch::NoGradGuard no_grad;
  for (int s = 0; s < w.links.roles.servers; ++s) {
    int64_t offset = 0;
    for (const Slice& slice : w.partition.slices[s]) {
      torch::Tensor piece = w.buffers[s].slice(0, offset, offset + slice.numel());
      const torch::Tensor& grad = w.parameters[slice.variable].grad();
      if (grad.defined()) {
        piece.copy_(grad.reshape({-1}).slice(0, slice.begin, slice.end));
      } else {
        piece.zero_();
      }
      offset += slice.numel();
    }
    Header request;
    request.kind = Kind::kPush;
    request.clock = w.clock;
    request.count = w.buffers[s].numel();
    w.on_server(s, "push", [&](Communicator& link) {
      send_header(link, kServerPeer, request, w.options.timeout);
      send_tensor(link, kServerPeer, kPushTag, w.buffers[s], w.options.timeout);
    });
    w.stats.bytes_pushed += w.buffers[s].numel() * w.buffers[s].element_size();
  }
  w.clock += 1;
}

void Worker::finish() {
  Impl& w = *impl_;
  if (w.finished) return;
  w.finished = true;
  Header done;
  done.kind = Kind::kDone;
  done.clock = w.clock;
  for (int s = 0; s < w.links.roles.servers; ++s) {
    w.on_server(s, "finish", [&](Communicator& link) {
      send_header(link, kServerPeer, done, w.options.timeout);
    });
  }
}

int64_t Worker::clock() const { return impl_->clock; }

const Roles& Worker::roles() const { return impl_->links.roles; }

const PsOptions& Worker::options() const { return impl_->options; }

namespace {
// The header of a sparse request (count: set per server).
Header row_header(Kind kind, int64_t clock, const Worker::RowRequest& r) {
  Header h;
  h.kind = kind;
  h.clock = clock;
  h.fingerprint = r.fingerprint;
  h.value = r.table;
  return h;
}
}  // namespace

void Worker::check_table(const RowRequest& r) {
  Impl& w = *impl_;
  const Header greeting = row_header(Kind::kSparsePull, w.clock, r);
  for (int s = 0; s < w.links.roles.servers; ++s) {
    w.on_server(s, "check_table", [&](Communicator& link) {
      send_header(link, kServerPeer, greeting, w.options.timeout);
      const Header reply = recv_header(link, kServerPeer, kReplyTag, w.options.timeout, w.name());
      if (reply.status != 0) {
        throw ContractError(w.name() + ": " + w.server_name(s) + " holds no table " +
                            std::to_string(r.table) +
                            " with this name, rows and dim; add the same tables, in the same "
                            "order, on every server and worker");
      }
    });
  }
}

void Worker::pull_rows(const RowRequest& r, const std::vector<torch::Tensor>& rows,
                       std::vector<torch::Tensor>* values) {
  Impl& w = *impl_;
  if (w.finished) throw ContractError(w.name() + ": pull_rows() after finish()");
  Header request = row_header(Kind::kSparsePull, w.clock, r);
  const int servers = w.links.roles.servers;
  values->assign(servers, torch::Tensor());
  for (int s = 0; s < servers; ++s) {
    if (rows[s].numel() == 0) continue;
    request.count = rows[s].numel();
    w.on_server(s, "pull_rows", [&](Communicator& link) {
      send_header(link, kServerPeer, request, w.options.timeout);
      send_tensor(link, kServerPeer, kPushTag, rows[s], w.options.timeout);
    });
  }
  for (int s = 0; s < servers; ++s) {
    const int64_t n = rows[s].numel();
    (*values)[s] = torch::empty({n, r.dim}, torch::kFloat);
    if (n == 0) continue;
    w.on_server(s, "pull_rows", [&](Communicator& link) {
      const Header reply = recv_header(link, kServerPeer, kReplyTag, w.options.timeout, w.name());
      if (reply.count != n || reply.clock != w.clock) {
        throw ContractError(w.name() + ": " + w.server_name(s) + " answered step " +
                            std::to_string(reply.clock) + " with " + std::to_string(reply.count) +
                            " rows; expected step " + std::to_string(w.clock) + " with " +
                            std::to_string(n));
      }
      recv_tensor(link, kServerPeer, kParamsTag, (*values)[s], w.options.timeout);
      w.stats.max_staleness_seen = std::max(w.stats.max_staleness_seen, reply.value);
    });
  }
}

void Worker::push_rows(const RowRequest& r, const std::vector<torch::Tensor>& rows,
                       const std::vector<torch::Tensor>& grads) {
  Impl& w = *impl_;
  if (w.finished) throw ContractError(w.name() + ": push_rows() after finish()");
  Header request = row_header(Kind::kSparsePush, w.clock, r);
  for (int s = 0; s < w.links.roles.servers; ++s) {
    if (rows[s].numel() == 0) continue;
    request.count = rows[s].numel();
    w.on_server(s, "push_rows", [&](Communicator& link) {
      send_header(link, kServerPeer, request, w.options.timeout);
      send_tensor(link, kServerPeer, kPushTag, rows[s], w.options.timeout);
      send_tensor(link, kServerPeer, kPushTag, grads[s], w.options.timeout);
    });
  }
}

Worker::Stats Worker::stats() const { return impl_->stats; }

}  // namespace kolo::ps

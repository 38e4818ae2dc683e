// Elastic training, worker side (docs/elastic.md).
//
// Under `kolorun --min-np/--max-np/--host-discovery-script` (elastic mode)
// kolorun serves a rendezvous and decides the membership: it numbers each world
// it forms (a "round"), publishes it in its store, and forms a new one when a
// member dies, when a member reports a fault, or when new workers wait to join.
// A worker:
//   1. announces itself and waits for a round that contains it (Rendezvous);
//   2. builds the default runtime (kolo::init) with that round's rank and size;
//   3. restores its last commit and receives rank 0's state (State::sync);
//   4. trains until it finishes, a RuntimeFault arrives (a peer died), or a
//      commit finds that a newer round waits (MembershipChanged);
//   5. on a fault or a change: shuts the runtime down and goes back to 1.
// run() does all of this around a training function. Everything here is
// torch-free; kolo/torch/elastic.h adds a State for a model and optimizer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/communicator.h"
#include "kolo/core/config.h"
#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/core/store.h"

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo::detail {
struct ElasticStateAccess;  // core/src/elastic/state_access.h
}

namespace kolo::elastic {

// Thrown by State::commit() on every member at the same commit when kolorun
// has formed a newer round (workers waiting to join). run() catches it; the
// state just committed is what the new round starts from.
class MembershipChanged : public Error {
 public:
  MembershipChanged(const std::string& message, int64_t round) : Error(message), round_(round) {}
  int64_t round() const { return round_; }

 private:
  int64_t round_;
};

// One round: who is in the world and where this worker sits.
struct Membership {
  int64_t round = 0;
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // among the members on this worker's machine
  int local_size = 1;
  int cross_rank = 0;  // index of this worker's machine among the members' machines
  int cross_size = 1;
  std::vector<int64_t> worker_ids;  // by rank
  std::vector<std::string> hosts;   // by rank, as named by -H / discovery
  // Parses kolorun's round text (see rendezvous.cc) for worker `worker_id`;
  // throws RuntimeFault when the text is malformed, ContractError when the
  // worker is not a member (callers check contains() first).
  static Membership parse(const std::string& text, int64_t worker_id);
  static bool contains(const std::string& text, int64_t worker_id);
};

// The worker's side of kolorun's rendezvous, through the job's store.
class Rendezvous {
 public:
  struct Options {
    std::string store_host;  // KOLO_STORE_ADDR
    int store_port = 0;      // KOLO_STORE_PORT
    std::string secret;      // KOLO_JOB_SECRET (hex; "" = unauthenticated store)
    int64_t worker_id = 0;   // KOLO_WORKER_ID
    std::string host;        // KOLO_ELASTIC_HOST: the host kolorun started us on
    // How long join() waits for a round containing this worker
    // (KOLO_ELASTIC_TIMEOUT_SECONDS); kolorun stops the job before that when
    // too few workers remain, so this only bounds a lost kolorun.
    std::chrono::milliseconds timeout{std::chrono::seconds(600)};
  };
  // Reads the options from kolorun's variables; ContractError naming the
  // missing variable when the process was not started by `kolorun` in elastic mode.
  static Options from_env(const EnvLookup& env);
  // True when KOLO_ELASTIC=1 (kolorun started this worker in elastic mode).
  static bool enabled(const EnvLookup& env);

  explicit Rendezvous(const Options& options);

  // Announces that this worker waits for a round newer than `after_round`
  // (0 = never been a member) and why (`reason`, logged by kolorun), then
  // blocks until kolorun publishes a round that contains it. `suspects`: the
  // worker ids the fault named (dead or unresponsive members of
  // `after_round`); kolorun evicts those that do not come back. Throws
  // TimeoutError after options.timeout, RuntimeFault when kolorun is gone.
  Membership join(int64_t after_round, const std::string& reason,
                  const std::vector<int64_t>& suspects = {});
  // The newest round kolorun published (0 = none yet); one store round trip.
  int64_t latest_round();
  const Options& options() const { return options_; }

 private:
  Options options_;
  std::shared_ptr<Store> store_;
};

// The training state that survives a membership change: committed in memory
// (and optionally on disk), restored after a fault, broadcast to newcomers.
// Subclasses serialize what they hold; the base holds the position in the data
// (epoch and batch) and the reset callbacks.
class State {
 public:
  struct Options {
    // When set, rank 0 also writes every commit to this file: a checked file
    // (kolo/core/checked_file.h, magic "KOLOCMIT", with a format version and
    // a checksum), written atomically. "" = memory only. load_commit_file()
    // reads it back.
    std::string commit_path;
    // The world sync() and commit() talk to. nullptr = the default runtime's
    // (what run() builds for every round). Ranks as threads (tests) give each
    // rank's State its own communicator; see set_world().
    Communicator* world = nullptr;
  };
  State();
  explicit State(Options options);
  virtual ~State();
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Position in the data; the training function advances these itself.
  int64_t epoch = 0;
  int64_t batch = 0;  // batches (steps) done in the current epoch

  // Snapshots the state (serialize()) as the point to return to after a
  // fault. Inside run() with a world of more than one it then asks kolorun
  // whether a newer round waits (rank 0 asks, the answer is broadcast, so every
  // member decides alike) and throws MembershipChanged if so. Collective
  // inside run(): every member must commit at the same step.
  void commit();
  // Returns to the last commit (nothing happens before the first commit).
  void restore();
  // Broadcasts rank `root`'s current state to every rank of the default
  // runtime's world, and every rank, the root and a world of one included,
  // loads it (deserialize), as Horovod's sync does. Collective.
  void sync(int root = 0);
  // Called by run() after the world was re-formed and the state synced, e.g.
  // to rescale the learning rate or re-shard the sampler: in every world
  // after the job's first, on every member (a newcomer too, since the state
  // it received is rank 0's from before rank 0's callbacks ran).
  void on_reset(std::function<void()> callback);
  // Makes `bytes` (what committed() returned, or the file commit_path holds)
  // the last commit and restores it: to resume from a commit on disk.
  // ContractError when the bytes do not fit this state.
  void load_commit(const Bytes& bytes);
  // load_commit() of the commit file at `path` (Options::commit_path of the
  // committing run), verified first: a missing, truncated or corrupt file, a
  // file of another kind or format, or a commit that does not fit this state
  // is a ContractError naming the file.
  void load_commit_file(const std::string& path);
  // load_commit_file() after the file's container: `payload` is what
  // read_checked_file(path, kElasticCommitFile) returned; `source` names it.
  void load_commit_payload(const std::string& payload, const std::string& source);
  // Commits so far in this process.
  int64_t commit_count() const { return commit_count_; }
  // The last committed bytes (empty before the first commit).
  const Bytes& committed() const { return snapshot_; }
  // Writes committed() to `path` as a commit file (what commit_path holds;
  // load_commit_file() reads it), atomically. ContractError naming the file
  // on an I/O error.
  void write_commit_file(const std::string& path) const;

  // Points this state at another world (Options::world; nullptr = the
  // default runtime's), e.g. a ranks-as-threads world after a simulated
  // membership change.
  void set_world(Communicator* world) { options_.world = world; }
  // This rank and the size of the state's world: Options::world's, else the
  // default runtime's, else (not initialised) rank 0 of 1.
  int world_rank() const;
  int world_size() const;

  // The round of the world this state trains in (0 outside run()).
  int64_t round() const { return round_; }

 protected:
  // The subclass's part of the state as bytes, and back. deserialize() gets
  // exactly what serialize() produced (on this rank or on the sync root).
  virtual Bytes serialize() = 0;
  virtual void deserialize(const Bytes& bytes) = 0;

 private:
  // run()'s side of the state (core/src/elastic/state_access.h): it attaches
  // the round's rendezvous, where commit() asks about newer rounds, and runs
  // the reset callbacks after a re-formation. Not for users.
  friend struct kolo::detail::ElasticStateAccess;
  void attach(Rendezvous* rendezvous, int64_t round);
  void run_reset_callbacks();

  Bytes serialize_all();
  Communicator& world();  // Options::world or the default runtime's (initialised)
  void deserialize_all(const Bytes& bytes);

  Options options_;
  Bytes snapshot_;
  int64_t commit_count_ = 0;
  std::vector<std::function<void()>> reset_callbacks_;
  Rendezvous* rendezvous_ = nullptr;
  int64_t round_ = 0;
};

// A State made of caller-owned raw buffers (plain C++ tensors, counters): each
// add() registers `bytes` bytes at `data`, saved and restored in place.
class BufferState : public State {
 public:
  using State::State;
  void add(const std::string& name, void* data, size_t bytes);

 protected:
  Bytes serialize() override;
  void deserialize(const Bytes& bytes) override;

 private:
  struct Buffer {
    std::string name;
    void* data;
    size_t bytes;
  };
  std::vector<Buffer> buffers_;
};

struct RunOptions {
  // Passed to every kolo::init of a round (backend, timeout). Its env, when
  // set, replaces the process environment.
  InitOptions init;
  // Called with each round's membership right after joining it, before
  // kolo::init (e.g. to pick a device by local_rank). An exception from it
  // propagates like one from `train`.
  std::function<void(const Membership&)> on_join;
};

// Joins kolorun's first round and initialises the default runtime for it,
// as run() would first: so that a program can ask kolo::rank()/size(),
// broadcast and build its optimizer before run(), as Horovod's hvd.init()
// allows under `horovodrun --min-np`. run() then trains in that round
// first, without joining again (pass it the same options). Outside elastic
// mode it is kolo::init(options.init). ContractError if the default runtime
// is already initialised.
void init(const RunOptions& options = {});

// Runs `train` elastically. Outside elastic mode (no KOLO_ELASTIC=1) it
// initialises the default runtime if needed and calls `train` once. In elastic
// mode it joins kolorun's rendezvous, initialises the default runtime for the
// round, restores and syncs `state`, and calls `train`; on RuntimeFault or
// MembershipChanged it shuts the runtime down, joins the next round, restores
// the last commit, syncs, runs the reset callbacks and calls `train` again.
// Returns when `train` returns (the default runtime is still initialised:
// the caller shuts it down). ContractErrors propagate (a bug is not a fault).
// In elastic mode the default runtime must not be initialised when run() is
// called, unless elastic::init() initialised it (ContractError otherwise).
void run(State& state, const std::function<void()>& train, const RunOptions& options = {});

}  // namespace kolo::elastic
#pragma GCC visibility pop

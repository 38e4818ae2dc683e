// Elastic State: commit / restore / sync, and BufferState (elastic.h).
//
// Committed bytes: i64 epoch, i64 batch, then the subclass's serialize().
// The commit file (Options::commit_path) is a checked file (kElasticCommitFile)
// whose payload is u32 commit format (kCommitFormat), then those bytes.
#include <cstring>

#include "kolo/core/checked_file.h"
#include "kolo/core/elastic.h"

namespace kolo::elastic {
namespace {

void put_u64(Bytes& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>((v >> (8 * i)) & 0xff));
}

// The layout of a commit file's payload after its format number.
constexpr uint32_t kCommitFormat = 1;

uint64_t get_u64(const Bytes& in, size_t& pos, const char* what) {
  if (in.size() - pos < 8) {
    throw ContractError(std::string("kolo elastic state: truncated bytes reading ") + what);
  }
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(in[pos + i]) << (8 * i);
  pos += 8;
  return v;
}

}  // namespace

State::State() = default;
State::State(Options options) : options_(std::move(options)) {}
State::~State() = default;

int State::world_rank() const {
  if (options_.world != nullptr) return options_.world->rank();
  return is_initialized() ? kolo::rank() : 0;
}

int State::world_size() const {
  if (options_.world != nullptr) return options_.world->size();
  return is_initialized() ? kolo::size() : 1;
}

void State::attach(Rendezvous* rendezvous, int64_t round) {
  rendezvous_ = rendezvous;
  round_ = round;
}

Communicator& State::world() {
  return options_.world != nullptr ? *options_.world : runtime().world();
}

void State::on_reset(std::function<void()> callback) {
  reset_callbacks_.push_back(std::move(callback));
}

void State::run_reset_callbacks() {
  for (auto& callback : reset_callbacks_) callback();
}

Bytes State::serialize_all() {
  Bytes out;
  put_u64(out, static_cast<uint64_t>(epoch));
  put_u64(out, static_cast<uint64_t>(batch));
  Bytes rest = serialize();
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

void State::deserialize_all(const Bytes& bytes) {
  size_t pos = 0;
  const int64_t e = static_cast<int64_t>(get_u64(bytes, pos, "the epoch"));
  const int64_t b = static_cast<int64_t>(get_u64(bytes, pos, "the batch"));
  deserialize(Bytes(bytes.begin() + static_cast<long>(pos), bytes.end()));
  epoch = e;
  batch = b;
}

void State::commit() {
  snapshot_ = serialize_all();
  ++commit_count_;
  const bool rank0 = world_rank() == 0;
  if (!options_.commit_path.empty() && rank0) {
    try {
      write_commit_file(options_.commit_path);
    } catch (const ContractError& e) {
      throw ContractError(std::string(e.what()) +
                          " (State::Options::commit_path; check the directory exists and is "
                          "writable)");
    }
  }
  if (rendezvous_ == nullptr || (options_.world == nullptr && !is_initialized())) return;
  // Every member must decide alike: rank 0 asks kolorun, the others follow.
  int64_t latest = world_rank() == 0 ? rendezvous_->latest_round() : 0;
  if (world_size() > 1) {
    BroadcastOptions options;
    options.root = 0;
    world().broadcast(&latest, 1, DType::kI64, options);
  }
  if (latest > round_) {
    throw MembershipChanged("kolorun formed round " + std::to_string(latest) +
                                " (workers waiting to join) while this world is round " +
                                std::to_string(round_),
                            latest);
  }
}

void State::write_commit_file(const std::string& path) const {
  // Not fsynced (commits come every few steps): the rename is atomic and the
  // checksum catches a file torn by a power loss; nothing torn is loaded.
  std::string payload(4, '\0');
  for (int i = 0; i < 4; ++i) payload[i] = static_cast<char>((kCommitFormat >> (8 * i)) & 0xff);
  payload.append(reinterpret_cast<const char*>(snapshot_.data()), snapshot_.size());
  CheckedWriteOptions write_options;
  write_options.durable = false;
  write_checked_file(path, kElasticCommitFile, payload, write_options);
}

void State::restore() {
  if (snapshot_.empty()) return;
  deserialize_all(snapshot_);
}

void State::load_commit(const Bytes& bytes) {
  deserialize_all(bytes);
  snapshot_ = bytes;
}

void State::load_commit_file(const std::string& path) {
  load_commit_payload(read_checked_file(path, kElasticCommitFile), path);
}

void State::load_commit_payload(const std::string& payload, const std::string& source) {
  const auto fail = [&](const std::string& what) {
    throw ContractError(std::string(kElasticCommitFile.what) + " '" + source + "': " + what);
  };
  if (payload.size() < 4) fail("truncated: no commit format");
  uint32_t format = 0;
  for (int i = 0; i < 4; ++i) format |= uint32_t(static_cast<uint8_t>(payload[i])) << (8 * i);
  if (format != kCommitFormat) {
    fail("commit format " + std::to_string(format) + " is not supported (this build reads " +
         std::to_string(kCommitFormat) + ")");
  }
  try {
    load_commit(Bytes(payload.begin() + 4, payload.end()));
  } catch (const std::exception& e) {
    fail(std::string("does not fit this state: ") + e.what());
  }
}

void State::sync(int root) {
  const int size_of_world = world_size();
  if (root < 0 || root >= size_of_world) {
    throw ContractError("kolo elastic State::sync: root " + std::to_string(root) +
                        " is not a rank of the world of " + std::to_string(size_of_world));
  }
  Bytes bytes;
  if (world_rank() == root) bytes = serialize_all();
  if (size_of_world > 1) {
    Communicator& world = this->world();
    uint64_t size = bytes.size();
    BroadcastOptions options;
    options.root = root;
    world.broadcast(&size, 1, DType::kI64, options);
    bytes.resize(size);
    if (size > 0) world.broadcast(bytes.data(), size, DType::kU8, options);
  }
  // Every rank loads what it received, the root and a world of one included
  // (as Horovod does): loading is where state that depends on the world, an
  // elastic sampler's shard for one, is rebuilt.
  deserialize_all(bytes);
  // Everyone now holds the same state; it is also the point to return to.
  snapshot_ = std::move(bytes);
}

void BufferState::add(const std::string& name, void* data, size_t bytes) {
  if (data == nullptr && bytes > 0) {
    throw ContractError("kolo elastic BufferState::add('" + name + "'): null data for " +
                        std::to_string(bytes) + " bytes");
  }
  for (const auto& b : buffers_) {
    if (b.name == name) {
      throw ContractError("kolo elastic BufferState::add: '" + name +
                          "' is already registered; give each buffer its own name");
    }
  }
  buffers_.push_back({name, data, bytes});
}

Bytes BufferState::serialize() {
  Bytes out;
  for (const auto& b : buffers_) {
    put_u64(out, b.name.size());
    out.insert(out.end(), b.name.begin(), b.name.end());
    put_u64(out, b.bytes);
    const auto* p = static_cast<const uint8_t*>(b.data);
    out.insert(out.end(), p, p + b.bytes);
  }
  return out;
}

void BufferState::deserialize(const Bytes& bytes) {
  size_t pos = 0;
  for (const auto& b : buffers_) {
    const uint64_t name_bytes = get_u64(bytes, pos, "a buffer name");
    if (bytes.size() - pos < name_bytes) throw ContractError("kolo elastic state: truncated name");
    const std::string name(bytes.begin() + static_cast<long>(pos),
                           bytes.begin() + static_cast<long>(pos + name_bytes));
    pos += name_bytes;
    const uint64_t size = get_u64(bytes, pos, "a buffer size");
    if (name != b.name || size != b.bytes || bytes.size() - pos < size) {
      throw ContractError("kolo elastic BufferState: the saved state has buffer '" + name + "' (" +
                          std::to_string(size) + " bytes) where this rank registered '" + b.name +
                          "' (" + std::to_string(b.bytes) +
                          " bytes); every rank must add() the same buffers in the same order");
    }
    std::memcpy(b.data, bytes.data() + pos, size);
    pos += size;
  }
  if (pos != bytes.size()) {
    throw ContractError("kolo elastic BufferState: the saved state holds " +
                        std::to_string(bytes.size() - pos) +
                        " bytes more than the registered buffers; every rank must add() the "
                        "same buffers");
  }
}

}  // namespace kolo::elastic

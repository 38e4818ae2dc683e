// Checkpoints (kolo/torch/checkpoint.h).
#include "kolo/torch/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "common.h"
#include "kolo/core/errors.h"

namespace kolo {

// --- CRC-32 -----------------------------------------------------------------

namespace {

// Slicing-by-8 tables for the reflected IEEE polynomial, built at compile time.
struct CrcTables {
  uint32_t t[8][256];
};

constexpr CrcTables make_crc_tables() {
  CrcTables tables{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    tables.t[0][i] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t i = 0; i < 256; ++i) {
      const uint32_t prev = tables.t[k - 1][i];
      tables.t[k][i] = (prev >> 8) ^ tables.t[0][prev & 0xFF];
    }
  }
  return tables;
}

constexpr CrcTables kCrc = make_crc_tables();

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  while (size >= 8) {
    uint32_t one;
    uint32_t two;
    std::memcpy(&one, p, 4);
    std::memcpy(&two, p + 4, 4);
    one ^= crc;
    crc = kCrc.t[7][one & 0xFF] ^ kCrc.t[6][(one >> 8) & 0xFF] ^ kCrc.t[5][(one >> 16) & 0xFF] ^
          kCrc.t[4][one >> 24] ^ kCrc.t[3][two & 0xFF] ^ kCrc.t[2][(two >> 8) & 0xFF] ^
          kCrc.t[1][(two >> 16) & 0xFF] ^ kCrc.t[0][two >> 24];
    p += 8;
    size -= 8;
  }
#endif
  while (size-- > 0) crc = (crc >> 8) ^ kCrc.t[0][(crc ^ *p++) & 0xFF];
  return ~crc;
}

// --- The file ---------------------------------------------------------------

namespace {

constexpr char kMagic[8] = {'K', 'O', 'L', 'O', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 32;

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string hex32(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", v);
  return text;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw ContractError("kolo checkpoint '" + path + "': " + what);
}

[[noreturn]] void fail_errno(const std::string& path, const std::string& call, int error) {
  fail(path, call + " failed: " + std::strerror(error));
}

void write_all(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(path, "write", errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

std::string directory_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Closes a descriptor on scope exit.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void write_checkpoint_file(const std::string& path, const std::string& payload) {
  if (path.empty()) fail(path, "the path is empty");
  unsigned char header[kHeaderBytes];
  std::memcpy(header, kMagic, 8);
  put_u32(header + 8, kVersion);
  put_u32(header + 12, static_cast<uint32_t>(kHeaderBytes));
  put_u64(header + 16, payload.size());
  put_u32(header + 24, crc32(payload.data(), payload.size()));
  put_u32(header + 28, crc32(header, 28));

  // A temporary name unique to this process and thread, in the same
  // directory so that the rename is atomic.
  const std::string temp =
      path + ".tmp." + std::to_string(::getpid()) + "." +
      std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()) % 1000000007u);
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(path, "creating the temporary file '" + temp + "'", errno);
  try {
    FdGuard guard{fd};
    write_all(fd, reinterpret_cast<const char*>(header), kHeaderBytes, path);
    write_all(fd, payload.data(), payload.size(), path);
    if (::fsync(fd) != 0) fail_errno(path, "fsync", errno);
    guard.fd = -1;
    if (::close(fd) != 0) fail_errno(path, "close", errno);
    if (::rename(temp.c_str(), path.c_str()) != 0) {
      fail_errno(path, "renaming '" + temp + "' over it", errno);
    }
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  // Make the rename itself durable.
  const std::string dir = directory_of(path);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) fail_errno(path, "opening its directory '" + dir + "' for fsync", errno);
  FdGuard dir_guard{dir_fd};
  if (::fsync(dir_fd) != 0 && errno != EINVAL) {
    fail_errno(path, "fsync of its directory '" + dir + "'", errno);
  }
}

std::string read_checkpoint_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) fail(path, "the file does not exist (check the path or resume flag)");
    fail_errno(path, "open", errno);
  }
  FdGuard guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_errno(path, "fstat", errno);
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, &bytes[done], bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(path, "read", errno);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);

  const auto* h = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < kHeaderBytes) {
    fail(path, "truncated: the file has " + std::to_string(bytes.size()) +
                   " bytes, less than the " + std::to_string(kHeaderBytes) + "-byte header");
  }
  if (std::memcmp(h, kMagic, 8) != 0) {
    fail(path, "not a kolo checkpoint (bad magic: the file does not start with \"KOLOCKPT\")");
  }
  const uint32_t version = get_u32(h + 8);
  const uint32_t header_crc = get_u32(h + 28);
  if (crc32(h, 28) != header_crc) {
    fail(path, "corrupt header (header checksum " + hex32(crc32(h, 28)) + ", stored " +
                   hex32(header_crc) + ")");
  }
  if (version != kVersion) {
    fail(path, "format version " + std::to_string(version) +
                   " is not supported (this build reads " + std::to_string(kVersion) + ")");
  }
  if (get_u32(h + 12) != kHeaderBytes) {
    fail(path, "unexpected header size " + std::to_string(get_u32(h + 12)));
  }
  const uint64_t payload_size = get_u64(h + 16);
  const uint64_t actual = bytes.size() - kHeaderBytes;
  if (actual < payload_size) {
    fail(path, "truncated: the header announces a payload of " + std::to_string(payload_size) +
                   " bytes, the file holds " + std::to_string(actual));
  }
  if (actual > payload_size) {
    fail(path, "wrong size: the header announces a payload of " + std::to_string(payload_size) +
                   " bytes, the file holds " + std::to_string(actual) + " (trailing bytes)");
  }
  const uint32_t stored = get_u32(h + 24);
  const uint32_t computed = crc32(bytes.data() + kHeaderBytes, payload_size);
  if (stored != computed) {
    fail(path, "corrupt: payload checksum mismatch (stored " + hex32(stored) + ", computed " +
                   hex32(computed) + ")");
  }
  return bytes.substr(kHeaderBytes);
}

// --- Generator state --------------------------------------------------------

std::string default_generator_state() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  const at::Tensor state = generator.get_state().contiguous();
  return std::string(static_cast<const char*>(state.data_ptr()),
                     static_cast<size_t>(state.numel()));
}

void set_default_generator_state(const std::string& state) {
  at::Tensor tensor = torch::empty({static_cast<int64_t>(state.size())}, torch::kByte);
  if (!state.empty()) std::memcpy(tensor.data_ptr(), state.data(), state.size());
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  try {
    generator.set_state(tensor);
  } catch (const std::exception& e) {
    throw ContractError("kolo::set_default_generator_state: torch rejected the state (" +
                        std::to_string(state.size()) + " bytes): " + e.what());
  }
}

// --- The payload ------------------------------------------------------------

namespace {

using detail::bytes_tensor;
using detail::tensor_bytes;

constexpr int64_t kPayloadFormat = 1;

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key,
                 const std::string& source) {
  c10::IValue value;
  if (!archive.try_read(key, value) || !value.isInt()) {
    fail(source, "the payload has no integer '" + key + "'");
  }
  return value.toInt();
}

std::string read_string(torch::serialize::InputArchive& archive, const std::string& key,
                        const std::string& source) {
  c10::IValue value;
  if (!archive.try_read(key, value) || !value.isString()) {
    fail(source, "the payload has no string '" + key + "'");
  }
  return value.toStringRef();
}

std::string read_bytes(torch::serialize::InputArchive& archive, const std::string& key,
                       const std::string& source) {
  torch::Tensor t;
  if (!archive.try_read(key, t, /*is_buffer=*/true)) {
    fail(source, "the payload has no tensor '" + key + "'");
  }
  return tensor_bytes(t);
}

}  // namespace

std::string encode_checkpoint(const torch::nn::Module& model,
                              const torch::optim::Optimizer* optimizer,
                              const CheckpointState& state,
                              const std::vector<std::string>& rng_states) {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(kPayloadFormat));
  archive.write("epoch", c10::IValue(state.epoch));
  archive.write("step", c10::IValue(state.step));
  archive.write("seed", c10::IValue(static_cast<int64_t>(state.seed)));
  archive.write("sampler/epoch", c10::IValue(state.sampler.epoch));
  archive.write("sampler/next_index", c10::IValue(state.sampler.next_index));

  archive.write("model/manifest",
                c10::IValue(detail::tensor_manifest(detail::module_tensors(model))));
  torch::serialize::OutputArchive model_archive(archive.compilation_unit());
  model.save(model_archive);
  archive.write("model/tensors", model_archive);

  archive.write("optimizer/present", c10::IValue(static_cast<int64_t>(optimizer != nullptr)));
  if (optimizer != nullptr) {
    torch::serialize::OutputArchive optimizer_archive(archive.compilation_unit());
    detail::save_optimizer(*optimizer, optimizer_archive);
    archive.write("optimizer/state", optimizer_archive);
  }

  archive.write("rng/count", c10::IValue(static_cast<int64_t>(rng_states.size())));
  for (size_t r = 0; r < rng_states.size(); ++r) {
    archive.write("rng/" + std::to_string(r), bytes_tensor(rng_states[r]), /*is_buffer=*/true);
  }

  archive.write("extras/count", c10::IValue(static_cast<int64_t>(state.extras.size())));
  size_t i = 0;
  for (const auto& [key, value] : state.extras) {
    const std::string prefix = "extras/" + std::to_string(i++);
    archive.write(prefix + "/key", bytes_tensor(key), /*is_buffer=*/true);
    archive.write(prefix + "/value", bytes_tensor(value), /*is_buffer=*/true);
  }
  return detail::archive_to_bytes(archive);
}

CheckpointState decode_checkpoint(const std::string& payload, torch::nn::Module& model,
                                  torch::optim::Optimizer* optimizer, const std::string& source,
                                  std::vector<std::string>* rng_states) {
  torch::serialize::InputArchive archive;
  try {
    detail::archive_from_bytes(payload, archive);
  } catch (const std::exception& e) {
    fail(source, std::string("the payload is not a readable archive: ") + e.what());
  }
  const int64_t format = read_int(archive, "format", source);
  if (format != kPayloadFormat) {
    fail(source, "payload format " + std::to_string(format) +
                     " is not supported (this build reads " + std::to_string(kPayloadFormat) + ")");
  }
  CheckpointState state;
  state.epoch = read_int(archive, "epoch", source);
  state.step = read_int(archive, "step", source);
  state.seed = static_cast<uint64_t>(read_int(archive, "seed", source));
  state.sampler.epoch = read_int(archive, "sampler/epoch", source);
  state.sampler.next_index = read_int(archive, "sampler/next_index", source);

  // Check the whole structure before touching the model or the optimizer.
  const std::string saved = read_string(archive, "model/manifest", source);
  const std::string difference =
      detail::manifest_difference(saved, detail::tensor_manifest(detail::module_tensors(model)));
  if (!difference.empty()) {
    fail(source, "the checkpoint does not fit the model: " + difference);
  }
  const bool has_optimizer = read_int(archive, "optimizer/present", source) != 0;
  if (optimizer != nullptr && !has_optimizer) {
    fail(source,
         "the checkpoint holds no optimizer state (saved without an optimizer); pass "
         "nullptr for the optimizer to load only the model");
  }
  std::vector<std::string> rng;
  const int64_t rng_count = read_int(archive, "rng/count", source);
  for (int64_t r = 0; r < rng_count; ++r) {
    rng.push_back(read_bytes(archive, "rng/" + std::to_string(r), source));
  }
  const int64_t extras = read_int(archive, "extras/count", source);
  for (int64_t i = 0; i < extras; ++i) {
    const std::string prefix = "extras/" + std::to_string(i);
    std::string key = read_bytes(archive, prefix + "/key", source);
    state.extras[key] = read_bytes(archive, prefix + "/value", source);
  }

  try {
    torch::serialize::InputArchive model_archive;
    archive.read("model/tensors", model_archive);
    model.load(model_archive);
  } catch (const ContractError&) {
    throw;
  } catch (const std::exception& e) {
    fail(source, std::string("loading the model failed: ") + e.what());
  }
  if (optimizer != nullptr) {
    try {
      torch::serialize::InputArchive optimizer_archive;
      archive.read("optimizer/state", optimizer_archive);
      detail::load_optimizer(*optimizer, optimizer_archive, "kolo checkpoint '" + source + "'");
    } catch (const ContractError&) {
      throw;
    } catch (const std::exception& e) {
      fail(source, std::string("loading the optimizer failed: ") + e.what());
    }
  }
  if (rng_states) *rng_states = std::move(rng);
  return state;
}

// --- Collective save and load -----------------------------------------------

void save_checkpoint(const std::string& path, const torch::nn::Module& model,
                     const torch::optim::Optimizer* optimizer, const CheckpointState& state,
                     const CheckpointOptions& options) {
  Engine& engine = engine_of(options);
  CallOptions o = options;
  o.engine = &engine;
  const detail::SetPosition position =
      detail::set_position(engine, options.process_set, "save_checkpoint", o);
  if (options.root < 0 || options.root >= position.size) {
    throw ContractError("kolo::save_checkpoint: root " + std::to_string(options.root) +
                        " is not a rank of the process set (size " + std::to_string(position.size) +
                        ")");
  }
  std::vector<std::string> rng_states;
  if (options.rng) {
    TensorOpOptions t;
    static_cast<CallOptions&>(t) = o;
    TensorHandle handle =
        allgather_async(bytes_tensor(default_generator_state()), "save_checkpoint.rng", t);
    const torch::Tensor all = handle.wait(options.timeout);
    const char* data = static_cast<const char*>(all.data_ptr());
    for (int64_t rows : handle.received_splits()) {
      rng_states.emplace_back(data, static_cast<size_t>(rows));
      data += rows;
    }
  }
  std::string error;
  if (position.rank == options.root) {
    try {
      write_checkpoint_file(path, encode_checkpoint(model, optimizer, state, rng_states));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  detail::agree_on_outcome(error, "kolo::save_checkpoint", "save_checkpoint.check", o);
}

CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& model,
                                torch::optim::Optimizer* optimizer,
                                const CheckpointOptions& options) {
  Engine& engine = engine_of(options);
  CallOptions o = options;
  o.engine = &engine;
  const detail::SetPosition position =
      detail::set_position(engine, options.process_set, "load_checkpoint", o);
  const std::string payload = detail::broadcast_from_root(
      [&] { return read_checkpoint_file(path); }, options.root, position, "load_checkpoint", o);
  CheckpointState state;
  std::string error;
  try {
    std::vector<std::string> rng_states;
    state = decode_checkpoint(payload, model, optimizer, path, &rng_states);
    if (options.rng && static_cast<int>(rng_states.size()) == position.size) {
      set_default_generator_state(rng_states[static_cast<size_t>(position.rank)]);
      state.rng_restored = true;
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  detail::agree_on_outcome(error, "kolo::load_checkpoint", "load_checkpoint.check", o);
  return state;
}

}  // namespace kolo

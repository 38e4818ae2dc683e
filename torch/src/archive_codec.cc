// kolo's encoding of a torch archive (archive_codec.h).
#include "archive_codec.h"

#include <torch/serialize/archive.h>

#include <cctype>
#include <cstring>
#include <limits>
#include <unordered_set>
#include <vector>

#include "common.h"
#include "kolo/core/errors.h"

namespace kolo::detail {

namespace {

constexpr char kMagic[8] = {'K', 'O', 'L', 'O', 'A', 'R', 'C', 'H'};
constexpr const char* kTrainingKey = "training";  // every archive module's own attribute

enum Kind : uint8_t { kTensorEntry = 1, kValueEntry = 2, kNodeEntry = 3 };
enum Tag : uint8_t {
  kNone = 0,
  kBool = 1,
  kInt = 2,
  kDouble = 3,
  kString = 4,
  kTensor = 5,
  kList = 6,
  kTuple = 7,
};

struct Dtype {
  uint8_t code;
  c10::ScalarType type;
};
constexpr Dtype kDtypes[] = {
    {1, c10::kByte},   {2, c10::kChar},  {3, c10::kShort},         {4, c10::kInt},
    {5, c10::kLong},   {6, c10::kHalf},  {7, c10::kBFloat16},      {8, c10::kFloat},
    {9, c10::kDouble}, {10, c10::kBool}, {11, c10::kComplexFloat}, {12, c10::kComplexDouble},
};

// A key libtorch writes and reads back as it was: libtorch declares each
// entry as an attribute in generated TorchScript source, which its reader
// parses, so keys are limited to [A-Za-z0-9_/-], not a Python keyword, not
// starting with "__", not "training" (the archive module's own attribute).
bool valid_key(const std::string& key) {
  static const char* const kKeywords[] = {
      "False", "None",     "True",  "and",    "as",   "assert", "async",  "await",    "break",
      "class", "continue", "def",   "del",    "elif", "else",   "except", "finally",  "for",
      "from",  "global",   "if",    "import", "in",   "is",     "lambda", "nonlocal", "not",
      "or",    "pass",     "raise", "return", "try",  "while",  "with",   "yield",    kTrainingKey};
  if (key.empty() || key.size() > kArchiveMaxKeyBytes || key.compare(0, 2, "__") == 0) return false;
  for (char c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '/' && c != '-') {
      return false;
    }
  }
  for (const char* k : kKeywords) {
    if (key == k) return false;
  }
  return true;
}

[[noreturn]] void encode_error(const std::string& key, const std::string& what) {
  throw ContractError("kolo archive: key '" + key + "': " + what +
                      " (kolo stores tensors, None, bool, int, double, string and lists or "
                      "tuples of these)");
}

// --- Encoding -----------------------------------------------------------------

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { put(v); }
  void i64(int64_t v) { put(v); }
  void f64(double v) { put(v); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  void raw(const void* data, size_t n) { out_.append(static_cast<const char*>(data), n); }
  std::string take() { return std::move(out_); }

 private:
  // The host is little-endian (x86-64, aarch64): the bytes as they are.
  template <typename T>
  void put(T v) {
    raw(&v, sizeof v);
  }
  std::string out_;
};

void write_tensor(Writer& w, const torch::Tensor& t, const std::string& key) {
  if (!t.defined()) encode_error(key, "an undefined tensor");
  if (!t.device().is_cpu() || t.layout() != c10::kStrided || t.is_quantized()) {
    encode_error(key, "a tensor that is not a dense CPU tensor");
  }
  const Dtype* dtype = nullptr;
  for (const Dtype& d : kDtypes) {
    if (d.type == t.scalar_type()) dtype = &d;
  }
  if (dtype == nullptr)
    encode_error(key, std::string("a tensor of dtype ") + c10::toString(t.scalar_type()));
  if (t.dim() > kArchiveMaxRank) encode_error(key, "a tensor of rank " + std::to_string(t.dim()));
  const torch::Tensor c = t.resolve_conj().resolve_neg().contiguous();
  w.u8(dtype->code);
  w.u8(t.requires_grad() ? 1 : 0);
  w.u8(static_cast<uint8_t>(t.dim()));
  for (int64_t d : t.sizes()) w.i64(d);
  if (c.nbytes() > 0) w.raw(c.data_ptr(), c.nbytes());
}

// The tag of a value (list elements: the element's).
uint8_t tag_of(const c10::IValue& v, const std::string& key) {
  if (v.isNone()) return kNone;
  if (v.isBool()) return kBool;
  if (v.isInt()) return kInt;
  if (v.isDouble()) return kDouble;
  if (v.isString()) return kString;
  if (v.isTensor()) return kTensor;
  if (v.isList()) return kList;
  if (v.isTuple()) return kTuple;
  encode_error(key, "a value of type " + v.type()->str());
}

uint8_t element_tag(const c10::TypePtr& type, const std::string& key) {
  switch (type->kind()) {
    case c10::TypeKind::BoolType:
      return kBool;
    case c10::TypeKind::IntType:
      return kInt;
    case c10::TypeKind::FloatType:
      return kDouble;
    case c10::TypeKind::StringType:
      return kString;
    case c10::TypeKind::TensorType:
      return kTensor;
    default:
      encode_error(key, "a list of " + type->str());
  }
}

void write_value(Writer& w, const c10::IValue& v, uint8_t tag, const std::string& key, int depth) {
  if (depth > kArchiveMaxDepth) encode_error(key, "values nested deeper than the codec's bound");
  switch (tag) {
    case kNone:
      return;
    case kBool:
      return w.u8(v.toBool() ? 1 : 0);
    case kInt:
      return w.i64(v.toInt());
    case kDouble:
      return w.f64(v.toDouble());
    case kString:
      return w.str(v.toStringRef());
    case kTensor:
      return write_tensor(w, v.toTensor(), key);
    case kList: {
      const c10::List<c10::IValue> list = v.toList();
      const uint8_t element = element_tag(list.elementType(), key);
      w.u8(element);
      w.u32(static_cast<uint32_t>(list.size()));
      for (const c10::IValue& e : list.vec()) write_value(w, e, element, key, depth + 1);
      return;
    }
    case kTuple: {
      const auto& elements = v.toTupleRef().elements();
      w.u32(static_cast<uint32_t>(elements.size()));
      for (const c10::IValue& e : elements) {
        const uint8_t t = tag_of(e, key);
        w.u8(t);
        write_value(w, e, t, key, depth + 1);
      }
      return;
    }
  }
}

void write_node(Writer& w, torch::serialize::InputArchive& archive, const std::string& path,
                int depth) {
  if (depth > kArchiveMaxDepth) encode_error(path, "archives nested deeper than the codec's bound");
  std::vector<std::string> keys;
  for (const std::string& key : archive.keys()) {
    if (key != kTrainingKey) keys.push_back(key);
  }
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const std::string& key : keys) {
    const std::string name = path.empty() ? key : path + "/" + key;
    if (!valid_key(key)) {
      encode_error(name, "a key outside [A-Za-z0-9_/-], a Python keyword or longer than " +
                             std::to_string(kArchiveMaxKeyBytes) + " bytes");
    }
    w.str(key);
    c10::IValue value;
    archive.read(key, value);
    if (value.isTensor()) {
      w.u8(kTensorEntry);
      write_tensor(w, value.toTensor(), name);
    } else if (value.isModule()) {
      torch::serialize::InputArchive nested;
      archive.read(key, nested);
      w.u8(kNodeEntry);
      write_node(w, nested, name, depth + 1);
    } else {
      w.u8(kValueEntry);
      const uint8_t tag = tag_of(value, name);
      w.u8(tag);
      write_value(w, value, tag, name, depth + 1);
    }
  }
}

// --- Decoding -----------------------------------------------------------------

[[noreturn]] void decode_error(const std::string& what, size_t at) {
  throw ContractError("kolo archive: " + what + " (at byte " + std::to_string(at) + ")");
}

class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}
  size_t pos() const { return pos_; }
  size_t left() const { return bytes_.size() - pos_; }
  void need(size_t n, const std::string& what) const {
    if (left() < n) {
      decode_error("truncated: " + what + " needs " + std::to_string(n) + " bytes, " +
                       std::to_string(left()) + " remain",
                   pos_);
    }
  }
  const char* take(size_t n, const std::string& what) {
    need(n, what);
    const char* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }
  uint8_t u8(const std::string& what) { return static_cast<uint8_t>(*take(1, what)); }
  uint32_t u32(const std::string& what) { return get<uint32_t>(what); }
  int64_t i64(const std::string& what) { return get<int64_t>(what); }
  double f64(const std::string& what) { return get<double>(what); }
  // A length-prefixed string of at most `max` bytes.
  std::string str(size_t max, const std::string& what) {
    const size_t at = pos_;
    const uint32_t n = u32(what);
    if (n > max)
      decode_error(
          what + " of " + std::to_string(n) + " bytes (at most " + std::to_string(max) + ")", at);
    return std::string(take(n, what), n);
  }
  // A count of items each at least `min_bytes` long: never more than the
  // remaining bytes can hold, so no loop or allocation runs past the input.
  uint32_t count(size_t min_bytes, const std::string& what) {
    const size_t at = pos_;
    const uint32_t n = u32(what);
    if (n > left() / min_bytes) {
      decode_error(what + " declares " + std::to_string(n) + " items, more than the " +
                       std::to_string(left()) + " remaining bytes hold",
                   at);
    }
    return n;
  }

 private:
  template <typename T>
  T get(const std::string& what) {
    T v;
    std::memcpy(&v, take(sizeof v, what), sizeof v);
    return v;
  }
  const std::string& bytes_;
  size_t pos_ = 0;
};

// A tensor (or, with `build` false, only its checks).
torch::Tensor read_tensor(Reader& r, const std::string& key, bool build) {
  const size_t at = r.pos();
  const uint8_t code = r.u8("a tensor's dtype");
  const Dtype* dtype = nullptr;
  for (const Dtype& d : kDtypes) {
    if (d.code == code) dtype = &d;
  }
  if (dtype == nullptr)
    decode_error("tensor '" + key + "' has unknown dtype " + std::to_string(code), at);
  const uint8_t grad = r.u8("a tensor's requires_grad");
  if (grad > 1 ||
      (grad == 1 && !c10::isFloatingType(dtype->type) && !c10::isComplexType(dtype->type))) {
    decode_error("tensor '" + key + "' has requires_grad " + std::to_string(grad) + " for dtype " +
                     c10::toString(dtype->type),
                 at + 1);
  }
  const uint8_t rank = r.u8("a tensor's rank");
  if (rank > kArchiveMaxRank) {
    decode_error("tensor '" + key + "' has rank " + std::to_string(rank) + " (at most " +
                     std::to_string(kArchiveMaxRank) + ")",
                 at + 2);
  }
  const size_t item = c10::elementSize(dtype->type);
  std::vector<int64_t> sizes;
  // The product of the non-zero sizes stays within what the remaining bytes
  // hold (also for a tensor with a zero size: its strides must not overflow).
  uint64_t extent = 1;
  bool empty = false;
  for (int d = 0; d < rank; ++d) {
    const size_t dim_at = r.pos();
    const int64_t size = r.i64("a tensor's size");
    const uint64_t max_elements = r.left() / item;
    if (size < 0 || (size > 0 && extent > max_elements / static_cast<uint64_t>(size))) {
      decode_error("tensor '" + key + "' has size " + std::to_string(size) + " in dimension " +
                       std::to_string(d) + ": more elements than the " + std::to_string(r.left()) +
                       " remaining bytes hold",
                   dim_at);
    }
    if (size == 0) empty = true;
    if (size > 0) extent *= static_cast<uint64_t>(size);
    sizes.push_back(size);
  }
  const uint64_t numel = empty ? 0 : extent;
  const size_t nbytes = static_cast<size_t>(numel) * item;
  const size_t data_at = r.pos();
  const char* data = r.take(nbytes, "tensor '" + key + "''s data");
  if (dtype->type == c10::kBool) {
    for (size_t i = 0; i < nbytes; ++i) {
      if (static_cast<uint8_t>(data[i]) > 1) {
        decode_error(
            "bool tensor '" + key + "' holds byte " + std::to_string(static_cast<uint8_t>(data[i])),
            data_at + i);
      }
    }
  }
  if (!build) return {};
  torch::Tensor t = torch::empty(sizes, torch::TensorOptions().dtype(dtype->type));
  if (nbytes > 0) std::memcpy(t.data_ptr(), data, nbytes);
  if (grad == 1) t.set_requires_grad(true);
  return t;
}

c10::IValue read_value(Reader& r, uint8_t tag, const std::string& key, int depth, bool build) {
  if (depth > kArchiveMaxDepth) {
    decode_error("value '" + key + "' nests deeper than " + std::to_string(kArchiveMaxDepth),
                 r.pos());
  }
  switch (tag) {
    case kNone:
      return {};
    case kBool: {
      const size_t at = r.pos();
      const uint8_t b = r.u8("a bool");
      if (b > 1) decode_error("bool '" + key + "' is " + std::to_string(b), at);
      return c10::IValue(b == 1);
    }
    case kInt:
      return c10::IValue(r.i64("an int"));
    case kDouble:
      return c10::IValue(r.f64("a double"));
    case kString: {
      std::string s = r.str(r.left(), "a string");
      return build ? c10::IValue(std::move(s)) : c10::IValue();
    }
    case kTensor: {
      torch::Tensor t = read_tensor(r, key, build);
      return build ? c10::IValue(std::move(t)) : c10::IValue();
    }
    case kList: {
      const size_t at = r.pos();
      const uint8_t element = r.u8("a list's element type");
      if (element < kBool || element > kTensor) {
        decode_error("list '" + key + "' has element type " + std::to_string(element), at);
      }
      // Elements take at least 1 byte (a bool); a tensor at least 3.
      const uint32_t n = r.count(element == kTensor ? 3 : 1, "list '" + key + "'");
      c10::TypePtr type;
      switch (element) {
        case kBool:
          type = c10::BoolType::get();
          break;
        case kInt:
          type = c10::IntType::get();
          break;
        case kDouble:
          type = c10::FloatType::get();
          break;
        case kString:
          type = c10::StringType::get();
          break;
        default:
          type = c10::TensorType::get();
      }
      c10::impl::GenericList list(type);
      for (uint32_t i = 0; i < n; ++i) {
        c10::IValue e = read_value(r, element, key, depth + 1, build);
        if (build) list.push_back(std::move(e));
      }
      return build ? c10::IValue(std::move(list)) : c10::IValue();
    }
    case kTuple: {
      const uint32_t n = r.count(1, "tuple '" + key + "'");
      std::vector<c10::IValue> elements;
      for (uint32_t i = 0; i < n; ++i) {
        const size_t at = r.pos();
        const uint8_t t = r.u8("a tuple element's tag");
        if (t > kTuple)
          decode_error("tuple '" + key + "' has an element of tag " + std::to_string(t), at);
        c10::IValue e = read_value(r, t, key, depth + 1, build);
        if (build) elements.push_back(std::move(e));
      }
      return build ? c10::IValue(c10::ivalue::Tuple::create(std::move(elements))) : c10::IValue();
    }
    default:
      decode_error("value '" + key + "' has unknown tag " + std::to_string(tag), r.pos() - 1);
  }
}

// One node into `archive` (nullptr: checks only).
void read_node(Reader& r, torch::serialize::OutputArchive* archive, const std::string& path,
               int depth) {
  if (depth > kArchiveMaxDepth) {
    decode_error("archive '" + path + "' nests deeper than " + std::to_string(kArchiveMaxDepth),
                 r.pos());
  }
  // An entry is at least a 4-byte length, a 1-byte key and a kind.
  const uint32_t n = r.count(6, "archive '" + path + "'");
  std::unordered_set<std::string> seen;
  for (uint32_t i = 0; i < n; ++i) {
    const size_t at = r.pos();
    const std::string key = r.str(kArchiveMaxKeyBytes, "a key");
    const std::string name = path.empty() ? key : path + "/" + key;
    if (!valid_key(key)) {
      decode_error("archive '" + path + "' has the key '" + key + "', which is not a valid name",
                   at);
    }
    if (!seen.insert(key).second) {
      decode_error("archive '" + path + "' has the key '" + key + "' twice", at);
    }
    const size_t kind_at = r.pos();
    switch (r.u8("an entry's kind")) {
      case kTensorEntry: {
        torch::Tensor t = read_tensor(r, name, archive != nullptr);
        if (archive) archive->write(key, t);
        break;
      }
      case kValueEntry: {
        const uint8_t tag = r.u8("a value's tag");
        c10::IValue v = read_value(r, tag, name, depth + 1, archive != nullptr);
        if (archive) archive->write(key, v);
        break;
      }
      case kNodeEntry: {
        if (archive) {
          torch::serialize::OutputArchive nested(archive->compilation_unit());
          read_node(r, &nested, name, depth + 1);
          archive->write(key, nested);
        } else {
          read_node(r, nullptr, name, depth + 1);
        }
        break;
      }
      default:
        decode_error("entry '" + name + "' has an unknown kind", kind_at);
    }
  }
}

void read_header(Reader& r, const std::string& bytes) {
  if (bytes.size() >= 4 && bytes.compare(0, 4, std::string("PK\x03\x04", 4)) == 0) {
    throw ContractError(
        "kolo archive: the payload is a libtorch zip archive, written by an older kolo (before "
        "checkpoint format 3 and ZeRO checkpoint format 3); this kolo does not read those "
        "(libtorch's reader is unsafe on damaged input): load it with the kolo that wrote it, "
        "or start the run afresh");
  }
  const char* magic = r.take(sizeof kMagic, "the header");
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0) decode_error("not a kolo archive", 0);
  const uint32_t version = r.u32("the version");
  if (version != kArchiveCodecVersion) {
    decode_error("encoding version " + std::to_string(version) + " (this kolo reads " +
                     std::to_string(kArchiveCodecVersion) + ")",
                 sizeof kMagic);
  }
}

void decode(const std::string& bytes, torch::serialize::OutputArchive* archive) {
  Reader r(bytes);
  read_header(r, bytes);
  read_node(r, archive, "", 0);
  if (r.left() != 0) decode_error(std::to_string(r.left()) + " bytes after the archive", r.pos());
}

}  // namespace

std::string encode_archive(torch::serialize::OutputArchive& archive) {
  // libtorch writes and reads its own archive (trusted bytes) so that its
  // entries can be walked: OutputArchive has no accessors.
  torch::serialize::InputArchive in;
  archive_from_bytes(archive_to_bytes(archive), in);
  Writer w;
  w.raw(kMagic, sizeof kMagic);
  w.u32(kArchiveCodecVersion);
  write_node(w, in, "", 0);
  return w.take();
}

void decode_archive(const std::string& bytes, torch::serialize::InputArchive& archive) {
  // The decoded tensors are released once libtorch has serialised them: at
  // most three copies of the payload's size are alive at once.
  std::string zip;
  {
    torch::serialize::OutputArchive out;
    decode(bytes, &out);
    zip = archive_to_bytes(out);
  }
  try {
    archive_from_bytes(zip, archive);
  } catch (const std::exception& e) {
    throw ContractError("kolo archive: libtorch refused the decoded archive: " + what_of(e));
  }
}

void check_archive(const std::string& bytes) { decode(bytes, nullptr); }

}  // namespace kolo::detail

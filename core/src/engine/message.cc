// Wire format of RequestList: little-endian host layout (all ranks of a job run
// the same binary on the same architecture), length-prefixed vectors/strings.
#include "engine/message.h"

#include <cstring>

#include "kolo/core/errors.h"

namespace kolo::detail {

const char* request_kind_name(RequestKind kind) {
  switch (kind) {
    case RequestKind::kAllreduce:
      return "ALLREDUCE";
    case RequestKind::kAllgather:
      return "ALLGATHER";
    case RequestKind::kBroadcast:
      return "BROADCAST";
    case RequestKind::kReducescatter:
      return "REDUCESCATTER";
    case RequestKind::kAlltoall:
      return "ALLTOALL";
    case RequestKind::kJoin:
      return "JOIN";
    case RequestKind::kAddProcessSet:
      return "ADD_PROCESS_SET";
    case RequestKind::kRemoveProcessSet:
      return "REMOVE_PROCESS_SET";
  }
  return "UNKNOWN";
}

bool is_data_kind(RequestKind kind) {
  return kind == RequestKind::kAllreduce || kind == RequestKind::kAllgather ||
         kind == RequestKind::kBroadcast || kind == RequestKind::kReducescatter ||
         kind == RequestKind::kAlltoall;
}

bool RequestInfo::operator==(const RequestInfo& o) const {
  return same_except_name(o) && name == o.name;
}

bool RequestInfo::same_except_name(const RequestInfo& o) const {
  return kind == o.kind && dtype == o.dtype && device == o.device && op == o.op && root == o.root &&
         prescale == o.prescale && postscale == o.postscale && shape == o.shape &&
         splits == o.splits;
}

int64_t Response::row_elements() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

int64_t Response::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

namespace {

class Writer {
 public:
  template <typename T>
  void pod(T value) {
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void string(const std::string& s) {
    pod<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  template <typename T>
  void vector(const std::vector<T>& v) {
    pod<uint32_t>(static_cast<uint32_t>(v.size()));
    if (!v.empty()) out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  T pod() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string string() {
    const uint32_t n = pod<uint32_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> vector() {
    const uint32_t n = pod<uint32_t>();
    need(static_cast<size_t>(n) * sizeof(T));
    std::vector<T> v(n);
    if (n > 0) std::memcpy(v.data(), data_ + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return v;
  }
  bool at_end() const { return pos_ == size_; }
  size_t remaining() const { return size_ - pos_; }

 private:
  void need(size_t n) {
    if (size_ - pos_ < n) {
      throw RuntimeFault("kolo engine: a negotiation message is truncated (" +
                         std::to_string(size_) +
                         " bytes); the ranks run different kolo builds "
                         "or the exchange was corrupted");
    }
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

constexpr uint32_t kMagic = 0x6b6f6c32;  // "kol2"

}  // namespace

std::string serialize(const RequestList& list) {
  Writer w;
  w.pod<uint32_t>(kMagic);
  w.pod<uint32_t>(static_cast<uint32_t>(list.requests.size()));
  for (const RequestInfo& r : list.requests) {
    w.pod<uint8_t>(static_cast<uint8_t>(r.kind));
    w.pod<uint8_t>(static_cast<uint8_t>(r.dtype));
    w.pod<uint8_t>(static_cast<uint8_t>(r.device));
    w.pod<uint8_t>(static_cast<uint8_t>(r.op));
    w.pod<int32_t>(r.root);
    w.pod<double>(r.prescale);
    w.pod<double>(r.postscale);
    w.string(r.name);
    w.vector(r.shape);
    w.vector(r.splits);
  }
  w.pod<uint32_t>(static_cast<uint32_t>(list.verdicts.size()));
  for (const StallVerdict& v : list.verdicts) {
    w.string(v.name);
    w.vector(v.missing);
    w.pod<double>(v.waited_seconds);
  }
  w.pod<uint8_t>(list.has_params ? 1 : 0);
  if (list.has_params) {
    w.pod<double>(list.cycle_time_ms);
    w.pod<int64_t>(list.fusion_threshold_bytes);
  }
  return w.take();
}

RequestList deserialize(const uint8_t* data, size_t size) {
  Reader r(data, size);
  if (r.pod<uint32_t>() != kMagic) {
    throw RuntimeFault(
        "kolo engine: a negotiation message has a bad header; the ranks run "
        "different kolo builds or the exchange was corrupted");
  }
  RequestList list;
  const uint32_t n = r.pod<uint32_t>();
  // A request takes at least 36 bytes (kind, dtype, device, op, root, two
  // scales, three lengths): a count the rest cannot hold must not size an
  // allocation.
  if (n > r.remaining() / 36) {
    throw RuntimeFault("kolo engine: a negotiation message announces " + std::to_string(n) +
                       " requests in " + std::to_string(size) +
                       " bytes; the ranks run different kolo builds or the exchange was "
                       "corrupted");
  }
  list.requests.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    RequestInfo info;
    const uint8_t kind = r.pod<uint8_t>();
    const uint8_t dtype = r.pod<uint8_t>();
    const uint8_t device = r.pod<uint8_t>();
    const uint8_t op = r.pod<uint8_t>();
    if (kind >= kNumRequestKinds || dtype >= kNumDTypes || device >= kNumDeviceTypes ||
        op >= kNumReduceOps) {
      throw RuntimeFault(
          "kolo engine: a negotiation message holds an unknown request kind, "
          "dtype, device or op; the ranks run different kolo builds");
    }
    info.kind = static_cast<RequestKind>(kind);
    info.dtype = static_cast<DType>(dtype);
    info.device = static_cast<DeviceType>(device);
    info.op = static_cast<ReduceOp>(op);
    info.root = r.pod<int32_t>();
    info.prescale = r.pod<double>();
    info.postscale = r.pod<double>();
    info.name = r.string();
    info.shape = r.vector<int64_t>();
    info.splits = r.vector<int64_t>();
    list.requests.push_back(std::move(info));
  }
  const uint32_t verdicts = r.pod<uint32_t>();
  for (uint32_t i = 0; i < verdicts; ++i) {
    StallVerdict v;
    v.name = r.string();
    v.missing = r.vector<int32_t>();
    v.waited_seconds = r.pod<double>();
    list.verdicts.push_back(std::move(v));
  }
  const uint8_t has_params = r.pod<uint8_t>();
  if (has_params > 1) {
    throw RuntimeFault(
        "kolo engine: a negotiation message has a malformed flag; the ranks run different kolo "
        "builds or the exchange was corrupted");
  }
  list.has_params = has_params == 1;
  if (list.has_params) {
    list.cycle_time_ms = r.pod<double>();
    list.fusion_threshold_bytes = r.pod<int64_t>();
  }
  if (!r.at_end()) {
    throw RuntimeFault(
        "kolo engine: a negotiation message has trailing bytes; the ranks run "
        "different kolo builds");
  }
  return list;
}

}  // namespace kolo::detail

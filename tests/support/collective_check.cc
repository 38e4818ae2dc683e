// The collective correctness matrix (collective_check.h).
//
// Inputs. Every element is a deterministic function of (seed, rank, index,
// dtype, kind of value); each rank regenerates the other ranks' inputs to
// compute its expected output locally. Values are chosen so that the reference
// is exact and backends with different reduction orders agree:
//  - sum / average (and every scaled op): small values. Integers in [-1000,
//    1000] (i8 [-7,7], u8 [0,15]: a sum of 8 ranks times prescale 2 fits);
//    floats are multiples of 1/4 in [-1,1], so every partial sum is exact even
//    in bf16 and only the final scaling rounds.
//  - unscaled min / max: the full range of the type (i64: +-2^49, exact in
//    double), floats rounded to the dtype first.
//  - product: floats from {1, -1, 2, 0.5}; integers from {1, -1, 2} with 2
//    only on ranks < 6 (at most 2^6 = 64: fits i8, never wraps), u8 from {1, 2}.
// Data-movement collectives (allgather(v), broadcast, alltoall(v)) move hashed
// bit patterns and are compared bit for bit.
//
// Reference. Computed in double in rank order, then stored with the documented
// semantics (core/src/reduce.h): integers unscaled wrap (never reached with
// these inputs), integers scaled truncate each prescaled input, compute
// postscale * R / n in double and truncate toward zero with saturation
// (exact comparison); floats compare with
// a relative tolerance of a few units in the last place of the dtype, since
// partial sums are exact and only the scaling and the final store round:
//   f64 1e-12, f32 2e-6, f16 2^-9, bf16 2^-6 (bf16 keeps 8 significant bits).
// min / max are exact for every dtype (the scales used, 0.5 and 3, keep the
// values exact).
#include "collective_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>

#include "kolo/core/dtype.h"

namespace kolo::testing {

namespace {

// Mismatch lines reported per case; the rest are counted.
constexpr int kMaxLinesPerCase = 5;

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element i of a stream is mix(base + i): one splitmix64 step per element.
uint64_t stream_base(unsigned seed, int rank, uint64_t salt) {
  return mix(mix(mix(seed) ^ static_cast<uint64_t>(rank)) ^ salt);
}

// ---- dtype codecs: storage <-> double ---------------------------------------

template <typename T>
struct IntCodec {
  using Storage = T;
  static constexpr bool kFloat = false;
  static double decode(T v) { return static_cast<double>(v); }
  static T encode(double v) { return static_cast<T>(v); }  // exact by construction
};
template <typename T>
struct FloatCodec {
  using Storage = T;
  static constexpr bool kFloat = true;
  static double decode(T v) { return v; }
  static T encode(double v) { return static_cast<T>(v); }
};
struct F16Codec {
  using Storage = uint16_t;
  static constexpr bool kFloat = true;
  static double decode(uint16_t v) { return f16_to_float(v); }
  static uint16_t encode(double v) { return float_to_f16(static_cast<float>(v)); }
};
struct BF16Codec {
  using Storage = uint16_t;
  static constexpr bool kFloat = true;
  static double decode(uint16_t v) { return bf16_to_float(v); }
  static uint16_t encode(double v) { return float_to_bf16(static_cast<float>(v)); }
};

template <typename Fn>
void visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kU8:
      return fn(IntCodec<uint8_t>{});
    case DType::kI8:
      return fn(IntCodec<int8_t>{});
    case DType::kI16:
      return fn(IntCodec<int16_t>{});
    case DType::kI32:
      return fn(IntCodec<int32_t>{});
    case DType::kI64:
      return fn(IntCodec<int64_t>{});
    case DType::kF16:
      return fn(F16Codec{});
    case DType::kBF16:
      return fn(BF16Codec{});
    case DType::kF32:
      return fn(FloatCodec<float>{});
    case DType::kF64:
      return fn(FloatCodec<double>{});
  }
}

// Truncates toward zero and saturates to T (reduce.h, scaled integers).
template <typename T>
T truncate_saturate(double v) {
  const double r = std::trunc(v);
  if (!(r == r)) return 0;
  if (r >= static_cast<double>(std::numeric_limits<T>::max()) + 1.0) {
    return std::numeric_limits<T>::max();
  }
  if (r <= static_cast<double>(std::numeric_limits<T>::min())) {
    return std::numeric_limits<T>::min();
  }
  return static_cast<T>(r);
}

// Wraps an exact integer value modulo 2^bits (reduce.h, unscaled integers).
template <typename T>
T wrap(double v) {
  return static_cast<T>(static_cast<uint64_t>(static_cast<int64_t>(v)));
}

// ---- input values ------------------------------------------------------------

enum class ValueKind { kSmall, kWide, kProduct };

ValueKind value_kind(ReduceOp op, bool scaled) {
  if (op == ReduceOp::kProduct) return ValueKind::kProduct;
  if (!scaled && (op == ReduceOp::kMin || op == ReduceOp::kMax)) return ValueKind::kWide;
  return ValueKind::kSmall;
}

// Raw value before it is stored in the dtype (see the file comment).
uint64_t value_stream(ValueKind kind, unsigned seed, int rank) {
  return stream_base(seed, rank, static_cast<uint64_t>(kind) * 16 + 1);
}

// `h` is element i of value_stream(kind, seed, rank).
double raw_value(ValueKind kind, DType dtype, bool floating, int rank, uint64_t h) {
  switch (kind) {
    case ValueKind::kSmall:
      if (floating) return static_cast<double>(static_cast<int>(h % 9) - 4) / 4.0;
      if (dtype == DType::kU8) return static_cast<double>(h % 16);
      if (dtype == DType::kI8) return static_cast<double>(static_cast<int>(h % 15) - 7);
      return static_cast<double>(static_cast<int>(h % 2001) - 1000);
    case ValueKind::kWide:
      switch (dtype) {
        case DType::kU8:
          return static_cast<double>(h & 0xff);
        case DType::kI8:
          return static_cast<double>(static_cast<int8_t>(h & 0xff));
        case DType::kI16:
          return static_cast<double>(static_cast<int16_t>(h & 0xffff));
        case DType::kI32:
          return static_cast<double>(static_cast<int32_t>(h & 0xffffffffu));
        case DType::kI64:
          return static_cast<double>(static_cast<int64_t>(h) >> 14);  // +-2^49
        default:
          return static_cast<double>(static_cast<int64_t>(h % 20001) - 10000) / 16.0;
      }
    case ValueKind::kProduct: {
      if (floating) {
        static constexpr double kFactors[8] = {1, -1, 2, 0.5, 1, -1, 1, 2};
        return kFactors[h % 8];
      }
      if (dtype == DType::kU8) return rank < 6 ? static_cast<double>(1 + h % 2) : 1.0;
      static constexpr double kIntFactors[4] = {1, -1, 2, 1};
      return rank < 6 ? kIntFactors[h % 4] : (h % 2 ? -1.0 : 1.0);
    }
  }
  return 0;
}

// Scale factors of the "scaled" variant (file comment: keeps results exact
// where the comparison is exact).
void scaled_options(DType dtype, ReduceOp op, AllreduceOptions& options) {
  if (is_floating(dtype)) {
    options.prescale = 0.5;
    options.postscale = 3.0;
  } else if (op == ReduceOp::kProduct) {
    options.prescale = 1.0;
    options.postscale = 3.0;  // 64 * 3 saturates i8: checks saturation too
  } else {
    options.prescale = 2.0;    // integral, so a ring that prescales each input agrees
    options.postscale = 0.75;  // sums not divisible by 4 land between integers: checks truncation
  }
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return 1e-12;
    case DType::kF32:
      return 2e-6;
    case DType::kF16:
      return 1.0 / 512;
    case DType::kBF16:
      return 1.0 / 64;
    default:
      return 0;
  }
}

std::string format_value(double v) {
  std::ostringstream text;
  text.precision(17);
  text << v;
  return text.str();
}

// Moved elements: element i of pattern_stream(...) is mix(base + i), truncated
// to the element size.
uint64_t pattern_stream(unsigned seed, int rank, uint64_t salt) {
  return stream_base(seed, rank, 0x5a5a0000 + salt);
}

// Calls fn(UintOfElementSize{}).
template <typename Fn>
void visit_element_size(size_t element, Fn&& fn) {
  switch (element) {
    case 1:
      return fn(uint8_t{});
    case 2:
      return fn(uint16_t{});
    case 4:
      return fn(uint32_t{});
    default:
      return fn(uint64_t{});
  }
}

// An 8-byte-aligned byte buffer that only grows.
class Buffer {
 public:
  uint8_t* get(size_t bytes) {
    if (words_.size() * 8 < bytes + 8) words_.resize(bytes / 8 + 2);
    return reinterpret_cast<uint8_t*>(words_.data());
  }

 private:
  std::vector<uint64_t> words_;
};

class Checker {
 public:
  Checker(Communicator& comm, const CheckMatrix& matrix)
      : comm_(comm), matrix_(matrix), rank_(comm.rank()), size_(comm.size()) {}

  std::vector<std::string> run() {
    for (size_t count : matrix_.counts) {
      const bool full = count <= matrix_.full_matrix_max_count;
      std::vector<DType> dtypes;
      for (DType dtype : matrix_.dtypes) {
        if (full || dtype == DType::kF32 || dtype == DType::kF16) dtypes.push_back(dtype);
      }
      std::vector<ReduceOp> ops;
      for (ReduceOp op : matrix_.ops) {
        if (full || op == ReduceOp::kSum) ops.push_back(op);
      }
      std::vector<bool> placements = {false};
      if (matrix_.in_place) placements.push_back(true);
      std::vector<bool> scalings = {false};
      if (matrix_.scale_factors && full) scalings.push_back(true);

      for (const std::string& name : matrix_.collectives) {
        if (name == "barrier") {
          comm_.barrier({});
          continue;
        }
        for (DType dtype : dtypes) {
          if (name == "allreduce" || name == "reducescatter") {
            for (ReduceOp op : ops) {
              for (bool scaled : scalings)
                check_reduction(name, count, dtype, op, scaled, placements);
            }
          } else if (name == "broadcast") {
            for (int root = 0; root < size_; ++root) check_broadcast(count, dtype, root);
          } else if (name == "alltoallv") {
            check_alltoallv(count, dtype);
          } else {
            for (bool in_place : placements) {
              if (name == "allgather") check_allgather(count, dtype, in_place);
              if (name == "allgatherv") check_allgatherv(count, dtype, in_place);
              if (name == "alltoall") check_alltoall(count, dtype, in_place);
            }
          }
        }
      }
    }
    return failures_;
  }

 private:
  // Collects the mismatches of one case.
  class Case {
   public:
    Case(Checker& checker, std::string label) : checker_(checker), label_(std::move(label)) {}
    ~Case() {
      if (mismatches_ > kMaxLinesPerCase) {
        checker_.failures_.push_back(label_ + ": rank " + std::to_string(checker_.rank_) +
                                     ": ... " + std::to_string(mismatches_ - kMaxLinesPerCase) +
                                     " more mismatches");
      }
    }
    void mismatch(uint64_t index, const std::string& got, const std::string& expected) {
      if (++mismatches_ <= kMaxLinesPerCase) {
        checker_.failures_.push_back(label_ + ": rank " + std::to_string(checker_.rank_) +
                                     " index " + std::to_string(index) + ": got " + got +
                                     " expected " + expected);
      }
    }

   private:
    Checker& checker_;
    std::string label_;
    int mismatches_ = 0;
  };

  static std::string label(const char* name, DType dtype, const char* op, size_t count,
                           const char* variant) {
    std::string text = std::string(name) + " " + dtype_name(dtype);
    if (op != nullptr) text += std::string(" ") + op;
    text += " count=" + std::to_string(count);
    if (variant != nullptr && *variant != '\0') text += std::string(" ") + variant;
    return text;
  }

  // ---- reductions -------------------------------------------------------------

  // Computes the reference once, then runs every placement against it.
  void check_reduction(const std::string& name, size_t count, DType dtype, ReduceOp op, bool scaled,
                       const std::vector<bool>& placements) {
    const bool scatter = name == "reducescatter";
    AllreduceOptions options;
    options.op = op;
    if (scaled) scaled_options(dtype, op, options);
    const ValueKind kind = value_kind(op, scaled);
    const bool floating = is_floating(dtype);
    const size_t element = dtype_size(dtype);
    const size_t in_count = scatter ? count * size_ : count;
    const size_t base = scatter ? static_cast<size_t>(rank_) * count : 0;

    visit_dtype(dtype, [&](auto codec) {
      using C = decltype(codec);
      using S = typename C::Storage;
      // Reference, in double over ranks in rank order, stored as the dtype
      // would store it for integers (file comment).
      std::vector<double> acc(count);
      for (int k = 0; k < size_; ++k) {
        const uint64_t stream = value_stream(kind, matrix_.seed, k) + base;
        for (size_t i = 0; i < count; ++i) {
          double v = options.prescale *
                     C::decode(C::encode(raw_value(kind, dtype, floating, k, mix(stream + i))));
          if constexpr (!C::kFloat) {
            if (!unscaled(options)) v = static_cast<double>(truncate_saturate<S>(v));
          }
          if (k == 0) {
            acc[i] = v;
          } else if (op == ReduceOp::kMin) {
            acc[i] = std::min(acc[i], v);
          } else if (op == ReduceOp::kMax) {
            acc[i] = std::max(acc[i], v);
          } else if (op == ReduceOp::kProduct) {
            acc[i] *= v;
          } else {
            acc[i] += v;
          }
        }
      }
      std::vector<S> expected_int;
      if constexpr (!C::kFloat) {
        expected_int.resize(count);
        for (size_t i = 0; i < count; ++i) {
          if (unscaled(options)) {
            expected_int[i] = wrap<S>(acc[i]);
          } else if (op == ReduceOp::kAverage) {
            expected_int[i] = truncate_saturate<S>(options.postscale * acc[i] / size_);
          } else {
            expected_int[i] = truncate_saturate<S>(options.postscale * acc[i]);
          }
        }
      }

      for (bool in_place : placements) {
        std::string variant = in_place ? "in_place" : "out_of_place";
        if (scaled) {
          variant += " prescale=" + format_value(options.prescale) +
                     " postscale=" + format_value(options.postscale);
        }
        Case result(*this, label(name.c_str(), dtype, reduce_op_name(op), count, variant.c_str()));
        uint8_t* in = in_buffer_.get(in_count * element);
        uint8_t* out = in_place ? in : out_buffer_.get(count * element);
        if (!in_place) std::memset(out, 0xa5, count * element);
        S* input = reinterpret_cast<S*>(in);
        const uint64_t stream = value_stream(kind, matrix_.seed, rank_);
        for (size_t i = 0; i < in_count; ++i) {
          input[i] = C::encode(raw_value(kind, dtype, floating, rank_, mix(stream + i)));
        }
        if (scatter) {
          comm_.reducescatter(in, out, count, dtype, options);
        } else {
          comm_.allreduce(in, out, count, dtype, options);
        }
        const S* output = reinterpret_cast<const S*>(out);
        for (size_t i = 0; i < count; ++i) {
          if constexpr (C::kFloat) {
            double expected = acc[i] * options.postscale;
            if (op == ReduceOp::kAverage) expected /= size_;
            const double got = C::decode(output[i]);
            const bool exact = op == ReduceOp::kMin || op == ReduceOp::kMax;
            const double tol = exact ? 0.0 : tolerance(dtype) * (std::fabs(expected) + 1e-3);
            if (!(std::fabs(got - expected) <= tol)) {
              result.mismatch(i, format_value(got), format_value(expected));
            }
          } else {
            if (output[i] != expected_int[i]) {
              result.mismatch(i, std::to_string(static_cast<int64_t>(output[i])),
                              std::to_string(static_cast<int64_t>(expected_int[i])));
            }
          }
        }
      }
    });
  }

  static bool unscaled(const AllreduceOptions& options) {
    return options.prescale == 1.0 && options.postscale == 1.0 && options.op != ReduceOp::kAverage;
  }

  // ---- data movement ------------------------------------------------------------

  // Writes pattern element (first + i) of (rank, salt) into `count` elements at `dst`.
  void fill(uint8_t* dst, size_t count, size_t element, int rank, uint64_t first,
            uint64_t salt) const {
    const uint64_t base = pattern_stream(matrix_.seed, rank, salt) + first;
    visit_element_size(element, [&](auto zero) {
      using U = decltype(zero);
      U* out = reinterpret_cast<U*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = static_cast<U>(mix(base + i));
    });
  }

  // Compares `count` elements at `got` with the pattern of fill(); `offset` is
  // the reported index of element 0.
  void expect(Case& result, const uint8_t* got, size_t count, size_t element, int rank,
              uint64_t first, uint64_t salt, size_t offset) const {
    const uint64_t base = pattern_stream(matrix_.seed, rank, salt) + first;
    visit_element_size(element, [&](auto zero) {
      using U = decltype(zero);
      const U* values = reinterpret_cast<const U*>(got);
      for (size_t i = 0; i < count; ++i) {
        const U expected = static_cast<U>(mix(base + i));
        if (values[i] != expected) {
          result.mismatch(offset + i, hex(values[i]),
                          hex(expected) + " (from rank " + std::to_string(rank) + ")");
        }
      }
    });
  }

  static std::string hex(uint64_t value) {
    std::ostringstream text;
    text << "0x" << std::hex << value;
    return text.str();
  }

  void check_allgather(size_t count, DType dtype, bool in_place) {
    const size_t element = dtype_size(dtype);
    Case result(*this,
                label("allgather", dtype, nullptr, count, in_place ? "in_place" : "out_of_place"));
    uint8_t* out = out_buffer_.get(size_ * count * element);
    std::memset(out, 0xa5, size_ * count * element);
    uint8_t* in = in_place ? out + rank_ * count * element : in_buffer_.get(count * element);
    fill(in, count, element, rank_, 0, 1);
    comm_.allgather(in, out, count, dtype, {});
    for (int k = 0; k < size_; ++k) {
      expect(result, out + k * count * element, count, element, k, 0, 1, k * count);
    }
  }

  // Rank k contributes 0 elements when k % 3 == 1 (rank 1, 4, 7), otherwise
  // count + k (so blocks differ in size).
  std::vector<size_t> allgatherv_counts(size_t count) const {
    std::vector<size_t> counts(size_);
    for (int k = 0; k < size_; ++k) counts[k] = (k % 3 == 1 || count == 0) ? 0 : count + k;
    return counts;
  }

  void check_allgatherv(size_t count, DType dtype, bool in_place) {
    const size_t element = dtype_size(dtype);
    Case result(*this,
                label("allgatherv", dtype, nullptr, count, in_place ? "in_place" : "out_of_place"));
    const std::vector<size_t> counts = allgatherv_counts(count);
    size_t total = 0, offset = 0;
    for (int k = 0; k < size_; ++k) {
      if (k < rank_) offset += counts[k];
      total += counts[k];
    }
    uint8_t* out = out_buffer_.get(total * element);
    std::memset(out, 0xa5, total * element);
    uint8_t* in = in_place ? out + offset * element : in_buffer_.get(counts[rank_] * element);
    fill(in, counts[rank_], element, rank_, 0, 2);
    comm_.allgatherv(in, out, counts, dtype, {});
    size_t position = 0;
    for (int k = 0; k < size_; ++k) {
      expect(result, out + position * element, counts[k], element, k, 0, 2, position);
      position += counts[k];
    }
  }

  void check_broadcast(size_t count, DType dtype, int root) {
    const size_t element = dtype_size(dtype);
    Case result(
        *this, label("broadcast", dtype, nullptr, count, ("root=" + std::to_string(root)).c_str()));
    uint8_t* buffer = out_buffer_.get(count * element);
    if (rank_ == root) {
      fill(buffer, count, element, root, 0, 3);
    } else {
      std::memset(buffer, 0xa5, count * element);
    }
    BroadcastOptions options;
    options.root = root;
    comm_.broadcast(buffer, count, dtype, options);
    expect(result, buffer, count, element, root, 0, 3, 0);
  }

  void check_alltoall(size_t count, DType dtype, bool in_place) {
    const size_t element = dtype_size(dtype);
    const size_t total = size_ * count;
    Case result(*this,
                label("alltoall", dtype, nullptr, count, in_place ? "in_place" : "out_of_place"));
    // Rank r's element j of block k is pattern(r, k * count + j).
    uint8_t* in = in_buffer_.get(total * element);
    fill(in, total, element, rank_, 0, 4);
    uint8_t* out = in;
    if (!in_place) {
      out = out_buffer_.get(total * element);
      std::memset(out, 0xa5, total * element);
    }
    comm_.alltoall(in, out, count, dtype, {});
    for (int k = 0; k < size_; ++k) {
      expect(result, out + k * count * element, count, element, k, rank_ * count, 4, k * count);
    }
  }

  // Elements rank `from` sends to rank `to`: 0 when (from + 2 * to) % 3 == 0,
  // otherwise count plus a little, so every rank both skips and receives.
  size_t alltoallv_count(size_t count, int from, int to) const {
    if (count == 0 || (from + 2 * to) % 3 == 0) return 0;
    return count + static_cast<size_t>((from * size_ + to) % 4);
  }

  void check_alltoallv(size_t count, DType dtype) {
    const size_t element = dtype_size(dtype);
    Case result(*this, label("alltoallv", dtype, nullptr, count, ""));
    std::vector<size_t> send_counts(size_), recv_counts(size_);
    size_t send_total = 0, recv_total = 0;
    for (int k = 0; k < size_; ++k) {
      send_counts[k] = alltoallv_count(count, rank_, k);
      recv_counts[k] = alltoallv_count(count, k, rank_);
      send_total += send_counts[k];
      recv_total += recv_counts[k];
    }
    // The block for rank k is pattern(rank, j, salt 16 + k).
    uint8_t* in = in_buffer_.get(send_total * element);
    size_t offset = 0;
    for (int k = 0; k < size_; ++k) {
      fill(in + offset * element, send_counts[k], element, rank_, 0, 16 + k);
      offset += send_counts[k];
    }
    uint8_t* out = out_buffer_.get(recv_total * element);
    std::memset(out, 0xa5, recv_total * element);
    comm_.alltoallv(in, send_counts, out, recv_counts, dtype, {});
    offset = 0;
    for (int k = 0; k < size_; ++k) {
      expect(result, out + offset * element, recv_counts[k], element, k, 0, 16 + rank_, offset);
      offset += recv_counts[k];
    }
  }

  Communicator& comm_;
  const CheckMatrix& matrix_;
  const int rank_;
  const int size_;
  Buffer in_buffer_;
  Buffer out_buffer_;
  std::vector<std::string> failures_;
};

}  // namespace

std::vector<std::string> check_collectives(Communicator& comm, const CheckMatrix& matrix) {
  return Checker(comm, matrix).run();
}

}  // namespace kolo::testing

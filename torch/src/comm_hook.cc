// Communication hooks (kolo/torch/comm_hook.h): the future, the built-in
// hooks and PowerSGD.
#include "kolo/torch/comm_hook.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include "archive_codec.h"
#include "common.h"
#include "kolo/core/dtype.h"
#include "kolo/core/errors.h"

namespace kolo {

std::vector<torch::Tensor> CommBucket::gradients() const {
  std::vector<torch::Tensor> out;
  out.reserve(parameters.size());
  for (size_t i = 0; i < parameters.size(); ++i) {
    int64_t numel = 1;
    for (int64_t d : shapes[i]) numel *= d;
    out.push_back(buffer.narrow(0, offsets[i], numel).view(shapes[i]));
  }
  return out;
}

// --- CommFuture -------------------------------------------------------------------

// One of: a value (or error) already there, a request, or a continuation of
// another future. wait() turns the last two into the first.
struct CommFuture::State {
  bool done = false;
  torch::Tensor value;
  std::exception_ptr error;
  TensorHandle handle;
  std::shared_ptr<State> parent;
  std::function<CommFuture(torch::Tensor)> next;
};

CommFuture::CommFuture(TensorHandle handle) : state_(std::make_shared<State>()) {
  state_->handle = std::move(handle);
}

CommFuture CommFuture::ready(torch::Tensor value) {
  CommFuture f;
  f.state_ = std::make_shared<State>();
  f.state_->done = true;
  f.state_->value = std::move(value);
  return f;
}

CommFuture CommFuture::then(std::function<CommFuture(torch::Tensor)> next) const {
  if (!state_) throw ContractError("kolo::CommFuture::then: the future is empty");
  CommFuture f;
  f.state_ = std::make_shared<State>();
  f.state_->parent = state_;
  f.state_->next = std::move(next);
  return f;
}

CommFuture CommFuture::then_value(std::function<torch::Tensor(torch::Tensor)> next) const {
  return then([next = std::move(next)](torch::Tensor value) {
    return CommFuture::ready(next(std::move(value)));
  });
}

torch::Tensor CommFuture::wait(std::chrono::milliseconds timeout) const {
  if (!state_) throw ContractError("kolo::CommFuture::wait: the future is empty");
  State& s = *state_;
  if (!s.done) {
    try {
      if (s.parent) {
        CommFuture parent;
        parent.state_ = s.parent;
        CommFuture following = s.next(parent.wait(timeout));
        if (!following.valid()) {
          throw ContractError("kolo::CommFuture: a continuation returned an empty future");
        }
        s.value = following.wait(timeout);
      } else {
        s.value = s.handle.wait(timeout);
      }
    } catch (...) {
      s.error = std::current_exception();
    }
    s.done = true;
    s.parent.reset();
    s.next = nullptr;
    s.handle = TensorHandle();
  }
  if (s.error) std::rethrow_exception(s.error);
  return s.value;
}

// --- Built-in hooks ----------------------------------------------------------------

namespace {

class FunctionHook : public CommHook {
 public:
  FunctionHook(std::string description, std::function<CommFuture(CommBucket&)> run)
      : description_(std::move(description)), run_(std::move(run)) {}
  std::string describe() const override { return description_; }
  CommFuture run(CommBucket& bucket) override { return run_(bucket); }

 private:
  std::string description_;
  std::function<CommFuture(CommBucket&)> run_;
};

CommFuture allreduce_bucket(CommBucket& bucket) {
  return CommFuture(allreduce_async_(bucket.buffer, bucket.name, bucket.reduce));
}

// Casts between a contiguous float32 tensor and a 16-bit one of the same
// numel through kolo's array conversions (dtype.h: F16C for f16), which take
// a few ms for the MLP's 80 MB of gradients where libtorch 1.13's
// Tensor::to(kHalf) and copy_ take over 100 ms each on one thread here.
// Same values: round to nearest even either way.
void narrow(const torch::Tensor& from, const torch::Tensor& to) {
  const auto* in = from.data_ptr<float>();
  auto* out = static_cast<uint16_t*>(to.data_ptr());
  const auto n = static_cast<size_t>(from.numel());
  if (to.scalar_type() == torch::kHalf) {
    float_to_f16_array(in, out, n);
  } else {
    float_to_bf16_array(in, out, n);
  }
}
void widen(const torch::Tensor& from, const torch::Tensor& to) {
  const auto* in = static_cast<const uint16_t*>(from.data_ptr());
  auto* out = to.data_ptr<float>();
  const auto n = static_cast<size_t>(from.numel());
  if (from.scalar_type() == torch::kHalf) {
    f16_to_float_array(in, out, n);
  } else {
    bf16_to_float_array(in, out, n);
  }
}

// Cast to `type` (kHalf or kBFloat16), allreduce, cast back into the buffer.
//
// The 16-bit copy a bucket is sent in is kept from one step to the next (one
// per bucket name, half the bucket's bytes): a fresh one every step is a
// fresh mmap for the MLP's 67 MB bucket (above glibc's 32 MB mmap ceiling),
// and its page faults cost more here than the cast that fills it (perf: 7%
// of the fp16 run's time in faults under float_to_f16). A buffer still held
// by an unfinished request (the same hook on two optimizers with one name
// prefix, or a bucket launched again before its exchange was waited for) is
// not reused: use_count() > 1 gets a new one.
class CompressionHook : public CommHook {
 public:
  CompressionHook(std::string description, c10::ScalarType type)
      : description_(std::move(description)), type_(type) {}
  std::string describe() const override { return description_; }

  CommFuture run(CommBucket& bucket) override {
    const c10::ScalarType original = bucket.buffer.scalar_type();
    if (original != torch::kFloat && original != torch::kDouble) return allreduce_bucket(bucket);
    torch::Tensor buffer = bucket.buffer;
    const bool fast = original == torch::kFloat && buffer.is_contiguous();
    torch::Tensor sent;
    if (fast) {
      sent = send_buffer(bucket.name, buffer.numel());
      narrow(buffer, sent);
    } else {
      sent = buffer.to(type_);
    }
    return CommFuture(allreduce_async_(sent, bucket.name, bucket.reduce))
        .then_value([buffer, fast](torch::Tensor reduced) {
          if (fast && reduced.is_contiguous()) {
            widen(reduced, buffer);
          } else {
            buffer.copy_(reduced);
          }
          return buffer;
        });
  }

 private:
  torch::Tensor send_buffer(const std::string& name, int64_t numel) {
    std::lock_guard<std::mutex> lock(mutex_);
    torch::Tensor& kept = sent_[name];
    if (!kept.defined() || kept.numel() != numel || kept.use_count() > 1) {
      kept = torch::empty({numel}, torch::TensorOptions().dtype(type_));
    }
    return kept;
  }

  std::string description_;
  c10::ScalarType type_;
  std::mutex mutex_;  // hooks of two optimizers may share this object
  std::map<std::string, torch::Tensor> sent_;
};

}  // namespace

std::shared_ptr<CommHook> make_comm_hook(std::string description,
                                         std::function<CommFuture(CommBucket&)> run) {
  if (!run) throw ContractError("kolo::make_comm_hook: the function is empty");
  return std::make_shared<FunctionHook>(std::move(description), std::move(run));
}

std::shared_ptr<CommHook> allreduce_hook() { return make_comm_hook("allreduce", allreduce_bucket); }

std::shared_ptr<CommHook> fp16_compress_hook() {
  return std::make_shared<CompressionHook>("fp16_compress", torch::kHalf);
}

std::shared_ptr<CommHook> bf16_compress_hook() {
  return std::make_shared<CompressionHook>("bf16_compress", torch::kBFloat16);
}

// --- PowerSGD -----------------------------------------------------------------------

namespace {

// One gradient of a bucket as PowerSGD treats it.
struct Piece {
  int64_t offset = 0;
  int64_t numel = 0;
  int64_t n = 0, m = 0, r = 0;  // compressed: an n x m matrix, rank r; r = 0 = sent as it is
};

}  // namespace

struct PowerSGDHook::Impl {
  PowerSGDOptions options;
  // Per bucket index: the layout it was built for, Q per compressed piece
  // (m x r, identical on every rank), and this rank's error feedback.
  struct Bucket {
    std::string layout;
    std::vector<torch::Tensor> q;
    torch::Tensor error;
  };
  std::mutex mutex;  // stats and the map; buckets themselves are touched by one step at a time
  std::map<int, Bucket> buckets;
  Stats stats;
  int64_t stats_step = -1;

  std::vector<Piece> pieces_of(const CommBucket& bucket) const {
    std::vector<Piece> out;
    for (size_t i = 0; i < bucket.parameters.size(); ++i) {
      Piece p;
      p.offset = bucket.offsets[i];
      p.numel = 1;
      for (int64_t d : bucket.shapes[i]) p.numel *= d;
      if (bucket.shapes[i].size() >= 2 && p.numel > 0) {
        const int64_t n = bucket.shapes[i][0];
        const int64_t m = p.numel / n;
        const int64_t r = std::min<int64_t>({options.rank, n, m});
        if (static_cast<double>(n * m) >= options.min_compression_rate * r * (n + m)) {
          p.n = n;
          p.m = m;
          p.r = r;
        }
      }
      out.push_back(p);
    }
    return out;
  }

  static std::string layout_of(const CommBucket& bucket, const std::vector<Piece>& pieces) {
    std::ostringstream out;
    out << bucket.buffer.numel();
    for (const Piece& p : pieces) out << ' ' << p.offset << ':' << p.n << 'x' << p.m << 'r' << p.r;
    return out.str();
  }

  void count(int64_t step, int64_t sent, int64_t gradients, bool compressed) {
    std::lock_guard<std::mutex> lock(mutex);
    if (step != stats_step) {
      stats_step = step;
      stats.sent_elements = 0;
      stats.gradient_elements = 0;
      if (compressed) ++stats.steps;
    }
    stats.sent_elements += sent;
    stats.gradient_elements += gradients;
  }
};

PowerSGDHook::PowerSGDHook(const PowerSGDOptions& options) : impl_(std::make_shared<Impl>()) {
  std::ostringstream error;
  if (options.rank < 1) {
    error << "options.rank is " << options.rank << "; the approximation's rank must be >= 1";
  } else if (options.start_step < 1) {
    error << "options.start_step is " << options.start_step
          << "; it must be >= 1 (the optimizer lays its buckets out again after step 0)";
  } else if (!(options.min_compression_rate >= 0)) {
    error << "options.min_compression_rate is " << options.min_compression_rate
          << "; it must be >= 0 (0 = compress every matrix)";
  }
  if (!error.str().empty()) throw ContractError("kolo::PowerSGDHook: " + error.str());
  impl_->options = options;
}

PowerSGDHook::~PowerSGDHook() = default;

std::string PowerSGDHook::describe() const {
  const PowerSGDOptions& o = impl_->options;
  std::ostringstream out;
  out << "powersgd rank=" << o.rank << " start_step=" << o.start_step
      << " error_feedback=" << o.error_feedback << " warm_start=" << o.warm_start
      << " min_compression_rate=" << o.min_compression_rate << " seed=" << o.seed;
  return out.str();
}

PowerSGDHook::Stats PowerSGDHook::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->stats;
}

std::shared_ptr<PowerSGDHook> powersgd_hook(const PowerSGDOptions& options) {
  return std::make_shared<PowerSGDHook>(options);
}

CommFuture PowerSGDHook::run(CommBucket& bucket) {
  Impl& impl = *impl_;
  const PowerSGDOptions& o = impl.options;
  const int64_t numel = bucket.buffer.numel();
  if (bucket.step < o.start_step) {
    impl.count(bucket.step, numel, numel, false);
    return allreduce_bucket(bucket);
  }
  // Computed in float32 (float64 buffers in float64).
  const c10::ScalarType original = bucket.buffer.scalar_type();
  const c10::ScalarType work_type = original == torch::kDouble ? torch::kDouble : torch::kFloat;
  torch::Tensor buffer = bucket.buffer;
  torch::Tensor input = original == work_type ? buffer : buffer.to(work_type);

  const std::vector<Piece> pieces = impl.pieces_of(bucket);
  Impl::Bucket* state = nullptr;
  {
    std::lock_guard<std::mutex> lock(impl.mutex);
    state = &impl.buckets[bucket.index];
  }
  const std::string layout = Impl::layout_of(bucket, pieces);
  if (state->layout != layout) {  // first use, or another layout: start afresh
    state->layout = layout;
    state->q.assign(pieces.size(), torch::Tensor());
    state->error = torch::Tensor();
  }
  if (o.error_feedback) {
    if (!state->error.defined()) state->error = torch::zeros({numel}, work_type);
    input.add_(state->error);
  }

  // P = M Q for every compressed piece, into one flat buffer; the rest
  // (1-D gradients, small matrices) into another.
  int64_t p_numel = 0, q_numel = 0, rest_numel = 0;
  for (const Piece& p : pieces) {
    if (p.r > 0) {
      p_numel += p.n * p.r;
      q_numel += p.m * p.r;
    } else {
      rest_numel += p.numel;
    }
  }
  const auto type = torch::TensorOptions().dtype(work_type);
  torch::Tensor p_flat = torch::empty({p_numel}, type);
  torch::Tensor q_flat = torch::empty({q_numel}, type);
  torch::Tensor rest = torch::empty({rest_numel}, type);
  std::vector<torch::Tensor> matrices(pieces.size()), ps(pieces.size()), qs(pieces.size()),
      rests(pieces.size());
  {
    int64_t p_at = 0, q_at = 0, rest_at = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      if (p.r == 0) {
        rests[i] = rest.narrow(0, rest_at, p.numel);
        rests[i].copy_(input.narrow(0, p.offset, p.numel));
        rest_at += p.numel;
        continue;
      }
      matrices[i] = input.narrow(0, p.offset, p.numel).view({p.n, p.m});
      ps[i] = p_flat.narrow(0, p_at, p.n * p.r).view({p.n, p.r});
      qs[i] = q_flat.narrow(0, q_at, p.m * p.r).view({p.m, p.r});
      p_at += p.n * p.r;
      q_at += p.m * p.r;
      torch::Tensor& q = state->q[i];
      if (!q.defined() || !o.warm_start) {
        // The same on every rank: a generator seeded by (seed, bucket, piece,
        // step without warm start).
        auto generator = at::make_generator<at::CPUGeneratorImpl>(
            o.seed * 1000003 + static_cast<uint64_t>(bucket.index) * 1009 + i +
            (o.warm_start ? 0 : static_cast<uint64_t>(bucket.step) * 7919));
        q = torch::randn({p.m, p.r}, generator, type);
      }
      torch::mm_out(ps[i], matrices[i], q);
    }
  }
  impl.count(bucket.step, p_numel + q_numel + rest_numel, numel, true);
  const TensorOpOptions reduce = bucket.reduce;
  const std::string name = bucket.name;
  TensorHandle rest_handle;
  if (rest_numel > 0) rest_handle = allreduce_async_(rest, name + ".rest", reduce);
  CommFuture p_future = p_numel > 0 ? CommFuture(allreduce_async_(p_flat, name + ".p", reduce))
                                    : CommFuture::ready(p_flat);
  const bool error_feedback = o.error_feedback;
  return p_future.then([=, impl = impl_](torch::Tensor) mutable {
    // Orthonormal columns spanning P's (Householder QR: exact even where P
    // is rank-deficient), then Q = M^T P.
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i].r == 0) continue;
      ps[i].copy_(std::get<0>(torch::linalg_qr(ps[i])));
      torch::mm_out(qs[i], matrices[i].t(), ps[i]);
    }
    CommFuture q_future = q_numel > 0 ? CommFuture(allreduce_async_(q_flat, name + ".q", reduce))
                                      : CommFuture::ready(q_flat);
    return q_future.then_value([=](torch::Tensor) mutable {
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (pieces[i].r == 0) continue;
        const torch::Tensor approximation = torch::mm(ps[i], qs[i].t());
        // What this rank's gradient (with the error carried in) lost.
        if (error_feedback) {
          state->error.narrow(0, pieces[i].offset, pieces[i].numel)
              .copy_((matrices[i] - approximation).reshape({-1}));
        }
        matrices[i].copy_(approximation);
        state->q[i] = qs[i].clone();
      }
      if (rest_handle.valid()) rest_handle.wait(reduce.timeout);
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (pieces[i].r == 0) input.narrow(0, pieces[i].offset, pieces[i].numel).copy_(rests[i]);
      }
      // Rest pieces carry no error: they were sent exactly.
      if (error_feedback) {
        for (size_t i = 0; i < pieces.size(); ++i) {
          if (pieces[i].r == 0) state->error.narrow(0, pieces[i].offset, pieces[i].numel).zero_();
        }
      }
      if (!input.is_same(buffer)) buffer.copy_(input);
      return buffer;
    });
  });
}

std::string PowerSGDHook::save_state() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->buckets.empty()) return {};
  torch::serialize::OutputArchive a;
  a.write("count", c10::IValue(static_cast<int64_t>(impl_->buckets.size())));
  int64_t k = 0;
  for (const auto& [index, bucket] : impl_->buckets) {
    const std::string key = "b" + std::to_string(k++);
    a.write(key + "/index", c10::IValue(static_cast<int64_t>(index)));
    a.write(key + "/layout", c10::IValue(bucket.layout));
    // Undefined tensors (no error yet, a Q not drawn yet) are left out.
    if (bucket.error.defined()) a.write(key + "/error", c10::IValue(bucket.error));
    a.write(key + "/q_count", c10::IValue(static_cast<int64_t>(bucket.q.size())));
    for (size_t i = 0; i < bucket.q.size(); ++i) {
      if (bucket.q[i].defined()) a.write(key + "/q/" + std::to_string(i), c10::IValue(bucket.q[i]));
    }
  }
  return detail::encode_archive(a);
}

void PowerSGDHook::load_state(const std::string& bytes) {
  std::map<int, Impl::Bucket> buckets;
  if (!bytes.empty()) {
    torch::serialize::InputArchive a;
    detail::decode_archive(bytes, a);
    c10::IValue v;
    auto integer = [&](const std::string& key) {
      if (!a.try_read(key, v) || !v.isInt()) {
        throw ContractError("kolo::PowerSGDHook::load_state: the state has no integer '" + key +
                            "'");
      }
      return v.toInt();
    };
    // Absent = undefined (see save_state).
    auto tensor = [&](const std::string& key) {
      if (!a.try_read(key, v)) return torch::Tensor();
      if (!v.isTensor()) {
        throw ContractError("kolo::PowerSGDHook::load_state: '" + key + "' is not a tensor");
      }
      return v.toTensor();
    };
    const int64_t count = integer("count");
    for (int64_t k = 0; k < count; ++k) {
      const std::string key = "b" + std::to_string(k);
      Impl::Bucket bucket;
      const int index = static_cast<int>(integer(key + "/index"));
      if (!a.try_read(key + "/layout", v) || !v.isString()) {
        throw ContractError("kolo::PowerSGDHook::load_state: the state has no '" + key +
                            "/layout'");
      }
      bucket.layout = v.toStringRef();
      bucket.error = tensor(key + "/error");
      const int64_t q_count = integer(key + "/q_count");
      for (int64_t i = 0; i < q_count; ++i)
        bucket.q.push_back(tensor(key + "/q/" + std::to_string(i)));
      buckets.emplace(index, std::move(bucket));
    }
  }
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->buckets = std::move(buckets);
}

}  // namespace kolo

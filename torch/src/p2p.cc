// Point-to-point transfers of torch::Tensor (kolo/torch/p2p.h).
#include "kolo/torch/p2p.h"

#include <string>
#include <vector>

#include "kolo/core/errors.h"
#include "kolo/core/runtime.h"
#include "kolo/torch/tensor.h"

namespace kolo {

namespace {

// Header: magic, dtype, ndim, then the dimensions (zeros past ndim).
constexpr size_t kHeaderLength = 3 + kMaxP2PDims;
constexpr int64_t kHeaderMagic = 0x7470326f6c6f6bLL;  // "kolo2pt"

using Header = std::vector<int64_t>;

// `operation` names the call in the error before kolo::init().
Communicator& communicator_of(const P2PTensorOptions& options, const char* operation) {
  return options.communicator != nullptr ? *options.communicator
                                         : kolo::runtime_for(operation).world();
}

P2POptions core_options(const P2PTensorOptions& options) {
  P2POptions o;
  o.tag = options.tag;
  o.timeout = options.timeout;
  return o;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::vector<int64_t> shape_of(const torch::Tensor& tensor) {
  return std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end());
}

void check_dims(const torch::Tensor& tensor, const std::string& op) {
  if (tensor.defined() && tensor.dim() > kMaxP2PDims) {
    throw ContractError(op + ": the tensor has " + std::to_string(tensor.dim()) +
                        " dimensions; point-to-point transfers take at most " +
                        std::to_string(kMaxP2PDims) + " (reshape it first)");
  }
}

Header make_header(const torch::Tensor& tensor, DType dtype) {
  Header header(kHeaderLength, 0);
  header[0] = kHeaderMagic;
  header[1] = static_cast<int64_t>(dtype);
  header[2] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) header[3 + d] = tensor.size(d);
  return header;
}

// The sender's shape from a received header; ContractError when it is not a
// header of this protocol (the peer sent something else with this tag).
std::vector<int64_t> header_shape(const Header& header, int src, const std::string& op) {
  const bool valid = header[0] == kHeaderMagic && header[1] >= 0 && header[1] < kNumDTypes &&
                     header[2] >= 0 && header[2] <= kMaxP2PDims;
  std::vector<int64_t> shape;
  for (int64_t d = 0; valid && d < header[2]; ++d) {
    if (header[3 + d] < 0) break;
    shape.push_back(header[3 + d]);
  }
  if (!valid || static_cast<int64_t>(shape.size()) != header[2]) {
    throw ContractError(op + ": what rank " + std::to_string(src) +
                        " sent is not a tensor header; pair kolo::send/isend (torch) with "
                        "kolo::recv/irecv_ (torch), not with the Communicator's raw send");
  }
  return shape;
}

std::string recv_op(int src, int tag) {
  return "kolo recv from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ")";
}

}  // namespace

struct TensorP2PHandle::State {
  torch::Tensor tensor;  // sent (contiguous) or received into
  Header header;         // ours (send) or the sender's (receive)
  P2PHandle header_handle;
  P2PHandle data_handle;
  bool receive = false;
  int peer = 0;
  std::string op;  // for messages
  bool checked = false;
};

bool TensorP2PHandle::test() {
  if (!state_) throw ContractError("kolo TensorP2PHandle::test: the handle is empty");
  const bool header_done = state_->header_handle.test();
  const bool data_done = state_->data_handle.test();
  return header_done && data_done;
}

torch::Tensor TensorP2PHandle::wait() {
  if (!state_) throw ContractError("kolo TensorP2PHandle::wait: the handle is empty");
  State& s = *state_;
  s.header_handle.wait();
  s.data_handle.wait();
  if (s.receive && !s.checked) {
    const std::vector<int64_t> sent = header_shape(s.header, s.peer, s.op);
    const std::vector<int64_t> mine = shape_of(s.tensor);
    if (sent != mine) {
      throw ContractError(s.op + ": the sender's tensor has shape " + shape_text(sent) +
                          ", the receiving tensor " + shape_text(mine) +
                          " (same number of elements, so the data arrived; reshape one side)");
    }
    s.checked = true;
  }
  return s.tensor;
}

TensorP2PHandle isend(const torch::Tensor& tensor, int dst, const P2PTensorOptions& options) {
  const std::string op =
      "kolo send to rank " + std::to_string(dst) + " (tag " + std::to_string(options.tag) + ")";
  check_dims(tensor, op);
  if (tensor.defined() && tensor.device().is_cpu() && !tensor.is_contiguous()) {
    return isend(tensor.contiguous(), dst, options);
  }
  const TensorView view = tensor_view(tensor, op, "tensor");
  Communicator& comm = communicator_of(options, "kolo::isend");
  auto state = std::make_shared<TensorP2PHandle::State>();
  state->tensor = tensor;
  state->header = make_header(tensor, view.dtype);
  state->op = op;
  const P2POptions o = core_options(options);
  state->header_handle = comm.isend(state->header.data(), kHeaderLength, DType::kI64, dst, o);
  state->data_handle = comm.isend(view.data, static_cast<size_t>(view.numel()), view.dtype, dst, o);
  return TensorP2PHandle(state);
}

TensorP2PHandle irecv_(const torch::Tensor& tensor, int src, const P2PTensorOptions& options) {
  const std::string op = recv_op(src, options.tag);
  check_dims(tensor, op);
  const TensorView view = tensor_view(tensor, op, "tensor");
  Communicator& comm = communicator_of(options, "kolo::irecv_");
  auto state = std::make_shared<TensorP2PHandle::State>();
  state->tensor = tensor;
  state->header.assign(kHeaderLength, 0);
  state->receive = true;
  state->peer = src;
  state->op = op;
  const P2POptions o = core_options(options);
  state->header_handle = comm.irecv(state->header.data(), kHeaderLength, DType::kI64, src, o);
  state->data_handle = comm.irecv(view.data, static_cast<size_t>(view.numel()), view.dtype, src, o);
  return TensorP2PHandle(state);
}

void send(const torch::Tensor& tensor, int dst, const P2PTensorOptions& options) {
  isend(tensor, dst, options).wait();
}

torch::Tensor recv_(const torch::Tensor& tensor, int src, const P2PTensorOptions& options) {
  return irecv_(tensor, src, options).wait();
}

torch::Tensor recv(int src, const P2PTensorOptions& options) {
  const std::string op = recv_op(src, options.tag);
  Communicator& comm = communicator_of(options, "kolo::recv");
  const P2POptions o = core_options(options);
  Header header(kHeaderLength, 0);
  comm.recv(header.data(), kHeaderLength, DType::kI64, src, o);
  const std::vector<int64_t> shape = header_shape(header, src, op);
  torch::Tensor tensor = torch::empty(
      shape, torch::TensorOptions().dtype(to_torch_dtype(static_cast<DType>(header[1]))));
  comm.recv(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), static_cast<DType>(header[1]),
            src, o);
  return tensor;
}

}  // namespace kolo

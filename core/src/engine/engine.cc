// PLACEHOLDER: the engine is being implemented (issue 3); every entry point throws.
#include "kolo/core/engine.h"

#include "kolo/core/errors.h"

namespace kolo {

namespace {
[[noreturn]] void not_yet(const char* what) {
  throw RuntimeFault(std::string("kolo::Engine::") + what + ": not implemented yet");
}
}  // namespace

struct Engine::Impl {};

EngineOptions EngineOptions::from_config(const Config&) { not_yet("EngineOptions::from_config"); }
Engine::Engine(std::unique_ptr<Communicator>, CommunicatorFactory, const EngineOptions&) {
  not_yet("Engine");
}
Engine::~Engine() = default;
int Engine::rank() const { not_yet("rank"); }
int Engine::size() const { not_yet("size"); }
Handle Engine::allreduce_async(const std::string&, const TensorView&, const TensorView&,
                               const RequestOptions&) {
  not_yet("allreduce_async");
}
Handle Engine::allgather_async(const std::string&, const TensorView&, AllocateOutput,
                               const RequestOptions&) {
  not_yet("allgather_async");
}
Handle Engine::broadcast_async(const std::string&, const TensorView&, const RequestOptions&) {
  not_yet("broadcast_async");
}
Handle Engine::reducescatter_async(const std::string&, const TensorView&, const TensorView&,
                                   const RequestOptions&) {
  not_yet("reducescatter_async");
}
Handle Engine::alltoall_async(const std::string&, const TensorView&, const std::vector<int64_t>&,
                              AllocateOutput, const RequestOptions&) {
  not_yet("alltoall_async");
}
void Engine::allreduce(const std::string&, const TensorView&, const TensorView&,
                       const RequestOptions&) {
  not_yet("allreduce");
}
void Engine::broadcast(const std::string&, const TensorView&, const RequestOptions&) {
  not_yet("broadcast");
}
std::vector<int64_t> Engine::reducescatter_shape(const std::vector<int64_t>&, int, int) {
  not_yet("reducescatter_shape");
}
int Engine::join(int) { not_yet("join"); }
int Engine::add_process_set(const std::vector<int>&) { not_yet("add_process_set"); }
void Engine::remove_process_set(int) { not_yet("remove_process_set"); }
double Engine::cycle_time_ms() const { not_yet("cycle_time_ms"); }
int64_t Engine::fusion_threshold_bytes() const { not_yet("fusion_threshold_bytes"); }
Engine::Stats Engine::stats() const { not_yet("stats"); }

}  // namespace kolo

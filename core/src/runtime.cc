// PLACEHOLDER: replaced by the real implementation.
#include "kolo/core/runtime.h"
#include "kolo/core/errors.h"
namespace kolo {
Runtime::Runtime(const InitOptions&) { throw ContractError("not implemented yet"); }
Runtime::Runtime(std::unique_ptr<Communicator>, Config) { throw ContractError("not implemented yet"); }
Runtime::~Runtime() = default;
void init(const InitOptions&) { throw ContractError("not implemented yet"); }
void shutdown() { throw ContractError("not implemented yet"); }
bool is_initialized() { throw ContractError("not implemented yet"); }
Runtime& runtime() { throw ContractError("not implemented yet"); }
int rank() { throw ContractError("not implemented yet"); }
int size() { throw ContractError("not implemented yet"); }
int local_rank() { throw ContractError("not implemented yet"); }
int local_size() { throw ContractError("not implemented yet"); }
int cross_rank() { throw ContractError("not implemented yet"); }
int cross_size() { throw ContractError("not implemented yet"); }
}  // namespace kolo

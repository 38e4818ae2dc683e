// PLACEHOLDER: replaced by the real implementation.
#include "kolo/core/store.h"
#include "kolo/core/errors.h"
namespace kolo {
Bytes to_bytes(const std::string&) { throw ContractError("not implemented yet"); }
std::string to_string(const Bytes&) { throw ContractError("not implemented yet"); }
std::shared_ptr<Store> make_memory_store() { throw ContractError("not implemented yet"); }
std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store>, const std::string&) { throw ContractError("not implemented yet"); }
}  // namespace kolo

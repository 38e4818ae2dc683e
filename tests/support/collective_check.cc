// PLACEHOLDER
#include "collective_check.h"
#include "kolo/core/errors.h"
namespace kolo::testing {
std::vector<std::string> check_collectives(Communicator&, const CheckMatrix&) { throw ContractError("not implemented yet"); }
}

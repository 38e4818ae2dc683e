// PLACEHOLDER: replaced by the real implementation.
#include "kolo/core/store.h"
#include "kolo/core/errors.h"
namespace kolo {
std::shared_ptr<Store> connect_tcp_store(const std::string&, int, std::chrono::milliseconds) { throw ContractError("not implemented yet"); }
struct TcpStoreServer::Impl {};
TcpStoreServer::TcpStoreServer(const Options&) { throw ContractError("not implemented yet"); }
TcpStoreServer::~TcpStoreServer() = default;
int TcpStoreServer::port() const { throw ContractError("not implemented yet"); }
}  // namespace kolo

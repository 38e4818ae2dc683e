// The two kinds of error kolo raises (docs/errors.md).
//
//  - ContractError: the caller broke a contract (bad argument, counts or dtypes
//    that differ across ranks, use before init). Fix the program; retrying the
//    same call fails the same way. Every rank taking part gets the error.
//  - RuntimeFault: the world itself failed (a peer died, a socket closed, a
//    timeout). Recoverable: the elastic layer catches it, rebuilds the
//    communicators with the surviving ranks and continues. The message and
//    failed_ranks() name the ranks that are gone or late, when known.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#pragma GCC visibility push(default)  // the exported API: cmake/kolo_targets.cmake
namespace kolo {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

class ContractError : public Error {
 public:
  explicit ContractError(const std::string& message) : Error(message) {}
};

class RuntimeFault : public Error {
 public:
  explicit RuntimeFault(const std::string& message, std::vector<int> failed_ranks = {})
      : Error(message), failed_ranks_(std::move(failed_ranks)) {}
  // Ranks (in the communicator that raised the fault) known to be dead or
  // unresponsive; empty when the transport cannot tell.
  const std::vector<int>& failed_ranks() const { return failed_ranks_; }

 private:
  std::vector<int> failed_ranks_;
};

// A RuntimeFault raised because an operation did not finish within its timeout.
class TimeoutError : public RuntimeFault {
 public:
  using RuntimeFault::RuntimeFault;
};

}  // namespace kolo
#pragma GCC visibility pop

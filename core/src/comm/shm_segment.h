// POSIX shared-memory segments, futex waits and process liveness for the shm
// backend (internal).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kolo::detail {

// A mapping of a POSIX shared-memory object (/dev/shm/<name>). The mapping
// lives until destruction; the name can be unlinked earlier (unlink()) so that
// nothing is left behind when a process crashes, while every process that
// already mapped it keeps using it.
class ShmSegment {
 public:
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Creates a new zero-filled object of `bytes` (fails if `name` exists) and maps
  // it. Throws RuntimeFault naming the system error.
  static ShmSegment create(const std::string& name, size_t bytes);
  // Maps an existing object; its size must be `bytes`. Throws RuntimeFault.
  static ShmSegment open(const std::string& name, size_t bytes);

  // Removes the name (idempotent); the mapping stays valid.
  void unlink();

  char* data() const { return static_cast<char*>(data_); }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  void release();

  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool linked_ = false;  // this object created the name and has not unlinked it
};

// A name no other segment on this host uses: "/kolo-<pid>-<random hex>".
std::string unique_segment_name();

// A segment's name exists only during its communicator's rendezvous (rank 0
// unlinks it once every rank mapped it). Every way out of that window removes
// it: an exception unwinds into ~ShmSegment; exit() runs an atexit handler
// that unlinks the names this process still holds; a process killed by a
// signal is cleaned up by its launcher (kolorun calls remove_segments_of for
// each local worker it reaps) or, without kolorun, by the next rendezvous on
// the host (remove_stale_segments).

// Unlinks segments named by unique_segment_name() whose creating process is
// gone and that are older than `min_age`: leftovers of jobs killed during a
// rendezvous. Returns how many it removed. Best effort: never throws.
int remove_stale_segments(std::chrono::seconds min_age);

// Unlinks the segments that process `pid` created and left. For a launcher
// reaping a worker: call it while the worker is a zombie (its pid cannot have
// been reused). Returns how many it removed. Best effort: never throws.
int remove_segments_of(pid_t pid);

// Blocks while *word == expected, at most `timeout` (process-shared futex, so
// `word` may live in a segment mapped at different addresses by the waiters).
// Returns early on a wake, a signal or a value change; callers re-check.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout);
// Wakes every waiter blocked on `word`.
void futex_wake_all(std::atomic<uint32_t>* word);

// Start time of a process in clock ticks since boot (/proc/<pid>/stat field
// 22), 0 if unknown. Together with the pid it identifies a process even after
// its pid is reused.
uint64_t process_start_time(pid_t pid);

// False when the process is gone: no such pid, a zombie (killed but not yet
// reaped by its parent), or the pid now belongs to a process started at another
// time. `start_time` 0 skips that last comparison.
bool process_alive(pid_t pid, uint64_t start_time);

}  // namespace kolo::detail

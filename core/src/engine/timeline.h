// Chrome-trace timeline of the engine (KOLO_TIMELINE=path.json) (internal).
//
// The engine thread records events with cheap calls (a mutex-protected append
// of small PODs); a writer thread of the timeline formats them and appends to
// the file, so the hot path does no I/O or formatting. The file is a JSON
// array of trace events ("traceEvents" format accepted by Perfetto and
// chrome://tracing): one row (tid) per tensor name, with duration events for
// the phases below, plus instant events marking cycles. The file is valid JSON
// after a normal shutdown (the destructor writes the closing bracket) and after
// an error shutdown (every flush leaves the file as a valid array: the writer
// rewrites the trailing "]" after each batch). Timestamps ("ts") are in
// microseconds since the Timeline was built; pid is the rank, tid 0 the
// engine's row ("engine"), tids 1.. the tensors in order of first appearance,
// each named by a thread_name metadata event. The writer keeps every row's B/E
// strictly nested: an end closes phases still open inside it, an end with no
// matching begin is dropped.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace kolo::detail {

enum class TimelinePhase : uint8_t {
  kNegotiate,          // submitted here, not yet ready on every rank
  kWaitForOtherRanks,  // (within negotiate) ready here, waiting on others
  kQueue,              // agreed, waiting for its fused batch to start
  kMemcpyInFusionBuffer,
  kCollective,  // the communicator call; named after the op (ALLREDUCE...)
  kMemcpyOutFusionBuffer,
};
const char* timeline_phase_name(TimelinePhase phase);

class Timeline {
 public:
  // Opens `path` (truncating). Throws ContractError naming the path if it
  // cannot be opened. `rank` is recorded as the trace's pid.
  Timeline(const std::string& path, int rank);
  ~Timeline();  // drains the queue, closes the JSON array, joins the writer
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Begin/end of a phase of one tensor. `op` names the collective
  // ("ALLREDUCE", "ALLGATHER"...) and is used for kCollective's label.
  void begin(const std::string& tensor, TimelinePhase phase, const char* op = nullptr);
  void end(const std::string& tensor, TimelinePhase phase);
  // An instant event on the engine's own row ("CYCLE_START"), with optional args.
  void mark(const std::string& label, const std::string& args_json = "");
  // Forces the queued events to the file (tests; the destructor also does it).
  // Throws RuntimeFault naming the path if a write failed (the timeline stops
  // writing after its first failure; recording calls never throw for it).
  void flush();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolo::detail

#include "engine/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kolo/core/errors.h"

namespace kolo::detail {

const char* timeline_phase_name(TimelinePhase phase) {
  switch (phase) {
    case TimelinePhase::kNegotiate:
      return "NEGOTIATE";
    case TimelinePhase::kWaitForOtherRanks:
      return "WAIT_FOR_OTHER_RANKS";
    case TimelinePhase::kQueue:
      return "QUEUE";
    case TimelinePhase::kMemcpyInFusionBuffer:
      return "MEMCPY_IN_FUSION_BUFFER";
    case TimelinePhase::kCollective:
      return "COLLECTIVE";
    case TimelinePhase::kMemcpyOutFusionBuffer:
      return "MEMCPY_OUT_FUSION_BUFFER";
  }
  return "UNKNOWN";
}

namespace {

// Row 0 is the engine's own (cycle markers); tensors get rows from 1 on.
constexpr uint32_t kEngineRow = 0;
constexpr std::chrono::milliseconds kWriterPeriod{100};
constexpr size_t kWakeWriterEvents = 4096;  // queue length that wakes the writer early
constexpr char kTrailer[] = "\n]}\n";

enum class Kind : uint8_t { kBegin, kEnd, kMark, kNameRow };

// One queued record: a small POD, no formatting. `id` is a row (tensor) for
// begin/end/name, an interned label for marks; `args` is 1 + the index of a
// mark's arguments among the queued ones, or 0.
struct Record {
  int64_t ts_ns;
  uint32_t id;
  uint32_t args;
  Kind kind;
  TimelinePhase phase;
  const char* op;  // static string (the collective's name) or nullptr
};

// Appends `text` as a JSON string literal (quotes included).
void append_json_string(std::string& out, const std::string& text) {
  out += '"';
  for (unsigned char c : text) {
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

template <typename Int>
void append_int(std::string& out, Int value) {
  char digits[24];
  const auto result = std::to_chars(digits, digits + sizeof(digits), value);
  out.append(digits, result.ptr);
}

std::string json_quoted(const std::string& text) {
  std::string out;
  append_json_string(out, text);
  return out;
}

void write_all_at(int fd, const std::string& data, off_t offset, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t wrote =
        ::pwrite(fd, data.data() + done, data.size() - done, offset + static_cast<off_t>(done));
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0)
      throw RuntimeFault("kolo timeline: writing '" + path +
                         "' failed: " + std::strerror(wrote < 0 ? errno : EIO));
    done += static_cast<size_t>(wrote);
  }
}

}  // namespace

struct Timeline::Impl {
  std::string path;
  int rank = 0;
  int fd = -1;
  std::chrono::steady_clock::time_point start;

  // Shared with the recording threads (under mu).
  std::mutex mu;
  std::condition_variable wake_writer;    // new work, flush request or stop
  std::condition_variable batch_written;  // flush() waits on it
  std::vector<Record> queue;
  std::vector<std::string> queue_args;               // arguments of queued marks
  std::unordered_map<std::string, uint32_t> rows;    // tensor name -> tid
  std::vector<std::string> row_names;                // tid -> name (index 0: engine)
  std::unordered_map<std::string, uint32_t> labels;  // mark label -> id
  std::vector<std::string> label_names;
  uint64_t queued = 0;   // records ever queued
  uint64_t written = 0;  // records ever written (or dropped after a write error)
  bool flush_requested = false;
  bool stop = false;
  std::string write_error;  // first I/O failure; the writer stops writing after it

  // Writer thread only.
  off_t data_end = 0;       // where the trailer starts
  bool first_event = true;  // no comma before the first event
  std::vector<std::string> writer_row_names, writer_label_names;
  std::vector<std::vector<TimelinePhase>> open_phases;  // per row, B not yet E'd
  std::vector<const char*> row_op;                      // per row, op of the open collective

  std::thread writer;

  int64_t now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                start)
        .count();
  }

  // Caller holds mu.
  uint32_t row_of(const std::string& tensor) {
    auto it = rows.find(tensor);
    if (it != rows.end()) return it->second;
    const uint32_t id = static_cast<uint32_t>(row_names.size());
    rows.emplace(tensor, id);
    row_names.push_back(tensor);
    push({now_ns(), id, 0, Kind::kNameRow, TimelinePhase::kNegotiate, nullptr});
    return id;
  }

  // Caller holds mu.
  void push(const Record& record) {
    queue.push_back(record);
    ++queued;
    if (queue.size() == kWakeWriterEvents) wake_writer.notify_one();
  }

  void writer_loop();
  std::string format(const std::vector<Record>& batch, const std::vector<std::string>& args);
  // Starts one event: the separator, then `{"name":<quoted_name>,"ph":"<ph>","pid":P,"tid":T`.
  void open_event(std::string& out, const std::string& quoted_name, char ph, uint32_t tid);
  // JSON literal of a static label (phase or op name), quoted once.
  const std::string& quoted_label(const char* label);
  std::unordered_map<const char*, std::string> quoted_labels;  // writer only
};

void Timeline::Impl::open_event(std::string& out, const std::string& quoted_name, char ph,
                                uint32_t tid) {
  if (!first_event) out += ",\n";
  first_event = false;
  out += "{\"name\":";
  out += quoted_name;
  out += ",\"ph\":\"";
  out += ph;
  out += "\",\"pid\":";
  append_int(out, rank);
  out += ",\"tid\":";
  append_int(out, tid);
}

const std::string& Timeline::Impl::quoted_label(const char* label) {
  auto it = quoted_labels.find(label);
  if (it == quoted_labels.end()) it = quoted_labels.emplace(label, json_quoted(label)).first;
  return it->second;
}

// Events are formatted by hand: building nlohmann::json objects costs about a
// microsecond per event, a lot for a thread that shares the cores with ranks.
std::string Timeline::Impl::format(const std::vector<Record>& batch,
                                   const std::vector<std::string>& args) {
  std::string out;
  out.reserve(batch.size() * 96);
  auto close_with_ts = [&out](int64_t ns) {  // microseconds with 3 decimals
    out += ",\"ts\":";
    append_int(out, ns / 1000);
    const int frac = static_cast<int>(ns % 1000);
    const char digits[5] = {'.', static_cast<char>('0' + frac / 100),
                            static_cast<char>('0' + frac / 10 % 10),
                            static_cast<char>('0' + frac % 10), '}'};
    out.append(digits, sizeof(digits));
  };
  auto label_of = [this](uint32_t row, TimelinePhase phase) -> const std::string& {
    return quoted_label(phase == TimelinePhase::kCollective && row_op[row] != nullptr
                            ? row_op[row]
                            : timeline_phase_name(phase));
  };
  for (const Record& r : batch) {
    switch (r.kind) {
      case Kind::kNameRow: {
        if (open_phases.size() <= r.id) {
          open_phases.resize(r.id + 1);
          row_op.resize(r.id + 1, nullptr);
        }
        open_event(out, "\"thread_name\"", 'M', r.id);
        out += ",\"args\":{\"name\":" + json_quoted(writer_row_names[r.id]) + "}}";
        // Rows in order of first appearance rather than by tid.
        open_event(out, "\"thread_sort_index\"", 'M', r.id);
        out += ",\"args\":{\"sort_index\":" + std::to_string(r.id) + "}}";
        break;
      }
      case Kind::kBegin: {
        if (r.phase == TimelinePhase::kCollective) row_op[r.id] = r.op;
        open_phases[r.id].push_back(r.phase);
        open_event(out, label_of(r.id, r.phase), 'B', r.id);
        close_with_ts(r.ts_ns);
        break;
      }
      case Kind::kEnd: {
        // Trace viewers need B/E strictly nested per row: an end closes the
        // phases opened inside it first; an end with no open begin is dropped.
        auto& open = open_phases[r.id];
        size_t depth = open.size();
        while (depth > 0 && open[depth - 1] != r.phase) --depth;
        if (depth == 0) break;
        while (open.size() >= depth) {
          const TimelinePhase phase = open.back();
          open.pop_back();
          open_event(out, label_of(r.id, phase), 'E', r.id);
          close_with_ts(r.ts_ns);
        }
        break;
      }
      case Kind::kMark: {
        open_event(out, json_quoted(writer_label_names[r.id]), 'i', kEngineRow);
        out += ",\"s\":\"t\"";
        if (r.args != 0) {
          // The caller's arguments are kept only if they are a JSON object.
          const std::string& text = args[r.args - 1];
          nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
          if (parsed.is_discarded() || !parsed.is_object()) parsed = {{"text", text}};
          out += ",\"args\":" + parsed.dump();
        }
        close_with_ts(r.ts_ns);
        break;
      }
    }
  }
  return out;
}

void Timeline::Impl::writer_loop() {
  std::vector<Record> batch;
  batch.reserve(2 * kWakeWriterEvents);  // swapped with the queue: both stay this large
  std::vector<std::string> batch_args;
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    wake_writer.wait_for(lock, kWriterPeriod, [&] {
      return stop || flush_requested || queue.size() >= kWakeWriterEvents;
    });
    const bool stopping = stop;
    flush_requested = false;
    batch.clear();
    batch.swap(queue);
    batch_args.clear();
    batch_args.swap(queue_args);
    const uint64_t target = queued;
    writer_row_names.insert(writer_row_names.end(), row_names.begin() + writer_row_names.size(),
                            row_names.end());
    writer_label_names.insert(writer_label_names.end(),
                              label_names.begin() + writer_label_names.size(), label_names.end());
    const bool failed = !write_error.empty();
    lock.unlock();

    std::string error;
    if (!batch.empty() && !failed) {
      try {
        std::string text = format(batch, batch_args);
        const size_t data_bytes = text.size();
        text += kTrailer;
        // One pwrite of the events and a fresh trailer over the old one: the
        // file only grows, and parses after every batch.
        write_all_at(fd, text, data_end, path);
        data_end += static_cast<off_t>(data_bytes);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }

    lock.lock();
    if (!error.empty() && write_error.empty()) write_error = error;
    written = target;
    batch_written.notify_all();
    if (stopping) return;
  }
}

Timeline::Timeline(const std::string& path, int rank) : impl_(std::make_unique<Impl>()) {
  Impl& t = *impl_;
  t.path = path;
  t.rank = rank;
  t.start = std::chrono::steady_clock::now();
  t.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (t.fd < 0)
    throw ContractError("kolo timeline: cannot open '" + path + "' for writing (" +
                        std::strerror(errno) +
                        "); set KOLO_TIMELINE to a writable file path, or unset it");
  // The file is a valid trace from the start: the header, the process and
  // engine rows' names, and the trailer that every batch rewrites.
  std::string text = "{\"traceEvents\":[\n";
  t.open_event(text, "\"process_name\"", 'M', kEngineRow);
  text += ",\"args\":{\"name\":\"kolo rank " + std::to_string(rank) + "\"}}";
  t.open_event(text, "\"thread_name\"", 'M', kEngineRow);
  text += ",\"args\":{\"name\":\"engine\"}}";
  const size_t data_bytes = text.size();
  text += kTrailer;
  try {
    write_all_at(t.fd, text, 0, path);
  } catch (const RuntimeFault& e) {
    ::close(t.fd);
    throw ContractError(std::string(e.what()) + "; set KOLO_TIMELINE to a writable file path");
  }
  t.data_end = static_cast<off_t>(data_bytes);

  t.queue.reserve(2 * kWakeWriterEvents);  // recording rarely reallocates
  t.row_names.push_back("engine");
  t.writer_row_names.push_back("engine");
  t.open_phases.resize(1);
  t.row_op.resize(1, nullptr);
  t.writer = std::thread([&t] { t.writer_loop(); });
}

Timeline::~Timeline() {
  Impl& t = *impl_;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    t.stop = true;
  }
  t.wake_writer.notify_one();
  t.writer.join();
  ::close(t.fd);
}

void Timeline::begin(const std::string& tensor, TimelinePhase phase, const char* op) {
  Impl& t = *impl_;
  std::lock_guard<std::mutex> lock(t.mu);
  const uint32_t row = t.row_of(tensor);
  t.push({t.now_ns(), row, 0, Kind::kBegin, phase, op});
}

void Timeline::end(const std::string& tensor, TimelinePhase phase) {
  Impl& t = *impl_;
  std::lock_guard<std::mutex> lock(t.mu);
  const uint32_t row = t.row_of(tensor);
  t.push({t.now_ns(), row, 0, Kind::kEnd, phase, nullptr});
}

void Timeline::mark(const std::string& label, const std::string& args_json) {
  Impl& t = *impl_;
  std::lock_guard<std::mutex> lock(t.mu);
  uint32_t id;
  auto it = t.labels.find(label);
  if (it != t.labels.end()) {
    id = it->second;
  } else {
    id = static_cast<uint32_t>(t.label_names.size());
    t.labels.emplace(label, id);
    t.label_names.push_back(label);
  }
  uint32_t args = 0;
  if (!args_json.empty()) {
    t.queue_args.push_back(args_json);
    args = static_cast<uint32_t>(t.queue_args.size());
  }
  t.push({t.now_ns(), id, args, Kind::kMark, TimelinePhase::kNegotiate, nullptr});
}

void Timeline::flush() {
  Impl& t = *impl_;
  std::unique_lock<std::mutex> lock(t.mu);
  const uint64_t target = t.queued;
  t.flush_requested = true;
  t.wake_writer.notify_one();
  t.batch_written.wait(lock, [&] { return t.written >= target; });
  if (!t.write_error.empty()) throw RuntimeFault(t.write_error);
}

}  // namespace kolo::detail

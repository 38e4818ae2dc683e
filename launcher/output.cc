// Output routing (output.h). Each line is one write(2), so lines of different
// ranks never interleave mid-line on the terminal.
#include "output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

namespace kolo::launcher {
namespace {

constexpr size_t kMaxLineBytes = 64 * 1024;

// Writes everything, retrying on EINTR/EAGAIN. Returns 0, or the errno of the
// failure (ENOSPC, EFBIG, EPIPE...).
int write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
      if (errno == EAGAIN) usleep(1000);
    } else {
      return n < 0 ? errno : EIO;
    }
  }
  return 0;
}

void make_directories(const std::string& path) {
  std::string prefix;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    prefix = path.substr(0, slash);
    if (!prefix.empty() && mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      throw std::system_error(errno, std::generic_category(), "mkdir " + prefix);
    }
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
}

}  // namespace

std::string output_tag(int rank, Stream stream) {
  return "[1," + std::to_string(rank) + "]" +
         (stream == Stream::kStdout ? "<stdout>:" : "<stderr>:");
}

OutputRouter::OutputRouter(const Options& options, int world_size) : options_(options) {
  if (!options_.output_dir.empty()) make_directories(options_.output_dir);
  grow(world_size);
}

void OutputRouter::grow(int count) {
  const int old_count = static_cast<int>(ranks_.size());
  if (count <= old_count) return;
  ranks_.resize(static_cast<size_t>(count));
  if (options_.output_dir.empty()) return;
  for (int r = old_count; r < count; ++r) {
    auto& state = ranks_[static_cast<size_t>(r)];
    state.log_path = options_.output_dir + "/rank." + std::to_string(r) + ".log";
    state.log_fd = open(state.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (state.log_fd < 0) {
      throw std::system_error(errno, std::generic_category(), "open " + state.log_path);
    }
  }
}

OutputRouter::~OutputRouter() {
  for (auto& state : ranks_) {
    if (state.log_fd >= 0) close(state.log_fd);
  }
}

void OutputRouter::feed(int rank, Stream stream, const char* data, size_t size) {
  RankState& state = ranks_[static_cast<size_t>(rank)];
  std::string& partial = state.partial[static_cast<int>(stream)];
  bool& after_cr = state.after_cr[static_cast<int>(stream)];
  size_t start = 0;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] != '\n' && data[i] != '\r') continue;
    partial.append(data + start, i - start);
    start = i + 1;
    if (data[i] == '\r') {
      // "\r\n" in one read stays one line end; a '\r' that ends the read
      // is a segment end, and a '\n' right after it then only ends the line.
      if (i + 1 < size && data[i + 1] == '\n') continue;
      emit(rank, stream, partial, "\r");
      partial.clear();
      after_cr = true;
      continue;
    }
    if (after_cr && partial.empty()) {
      write_raw(rank, stream, "\n");
    } else {
      emit(rank, stream, partial);
    }
    partial.clear();
    after_cr = false;
  }
  if (start < size) after_cr = false;
  partial.append(data + start, size - start);
  while (partial.size() >= kMaxLineBytes) {
    emit(rank, stream, partial.substr(0, kMaxLineBytes));
    partial.erase(0, kMaxLineBytes);
  }
}

void OutputRouter::flush(int rank, Stream stream) {
  std::string& partial = ranks_[static_cast<size_t>(rank)].partial[static_cast<int>(stream)];
  if (partial.empty()) return;
  emit(rank, stream, partial);
  partial.clear();
}

void OutputRouter::write_raw(int rank, Stream stream, const std::string& text) {
  auto& state = ranks_[static_cast<size_t>(rank)];
  if (state.log_fd >= 0) (void)write_all(state.log_fd, text);
  if (options_.mode == OutputMode::kRank0Only && rank != 0) return;
  (void)write_all(stream == Stream::kStdout ? options_.stdout_fd : options_.stderr_fd, text);
}

void OutputRouter::emit(int rank, Stream stream, const std::string& line, const char* end) {
  auto& state = ranks_[static_cast<size_t>(rank)];
  state.last.push_back({stream, line});
  while (state.last.size() > options_.keep_lines) state.last.pop_front();
  if (state.log_fd >= 0) {
    const int error = write_all(state.log_fd, line + end);
    if (error != 0) {
      // A full disk or a file-size limit: say so at once, and once more in
      // kolorun's last line (log_failures()); the job itself goes on.
      state.log_error = std::strerror(error);
      close(state.log_fd);
      state.log_fd = -1;
      (void)write_all(options_.stderr_fd, "kolorun: cannot write " + state.log_path + ": " +
                                              state.log_error + "; rank " + std::to_string(rank) +
                                              "'s output from here on is missing from it\n");
    }
  }

  int fd = stream == Stream::kStdout ? options_.stdout_fd : options_.stderr_fd;
  switch (options_.mode) {
    case OutputMode::kPlain:
      (void)write_all(fd, line + end);  // a closed terminal must not stop the job
      break;
    case OutputMode::kTag:
      (void)write_all(fd, output_tag(rank, stream) + line + end);
      break;
    case OutputMode::kRank0Only:
      if (rank == 0) (void)write_all(fd, line + end);
      break;
  }
}

std::string OutputRouter::last_line(int rank, Stream* stream) const {
  const auto& last = ranks_[static_cast<size_t>(rank)].last;
  // Prefer the last non-blank line: a trailing empty line says nothing.
  for (auto it = last.rbegin(); it != last.rend(); ++it) {
    if (it->text.find_first_not_of(" \t\r") != std::string::npos) {
      if (stream != nullptr) *stream = it->stream;
      return it->text;
    }
  }
  return "";
}

std::string OutputRouter::log_failures() const {
  std::string ranks, first;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].log_error.empty()) continue;
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (first.empty()) first = ranks_[r].log_path + ": " + ranks_[r].log_error;
  }
  if (ranks.empty()) return "";
  return "kolorun: --output-dir: the log files of rank(s) " + ranks + " are incomplete (" + first +
         ")";
}

std::string OutputRouter::log_path(int rank) const {
  return ranks_[static_cast<size_t>(rank)].log_path;
}

std::string OutputRouter::where(int rank) const {
  std::string place;
  switch (options_.mode) {
    case OutputMode::kPlain:
      place = "the terminal above, untagged (--tag-output marks each rank's lines)";
      break;
    case OutputMode::kTag:
      place = "the terminal above, tagged [1," + std::to_string(rank) + "]";
      break;
    case OutputMode::kRank0Only:
      place = rank == 0 ? "the terminal above"
                        : "nowhere: --rank0-only discarded it (--output-dir DIR keeps every "
                          "rank's output)";
      break;
  }
  const std::string& path = log_path(rank);
  if (!path.empty()) {
    place = (options_.mode == OutputMode::kRank0Only && rank != 0) ? path : place + ", and " + path;
  }
  return place;
}

}  // namespace kolo::launcher

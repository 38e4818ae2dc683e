// Routing the workers' output: line splitting, rank tags, rank-0 filtering,
// per-rank log files, and the last lines kept for the failure report.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "options.h"

namespace kolo::launcher {

enum class Stream { kStdout, kStderr };

// "[1,<rank>]<stdout>:" — the tag of mpirun --tag-output (job 1, then the rank).
std::string output_tag(int rank, Stream stream);

class OutputRouter {
 public:
  struct Options {
    OutputMode mode = OutputMode::kPlain;
    std::string output_dir;  // "" = no per-rank log files
    size_t keep_lines = 10;  // last lines remembered per rank
    int stdout_fd = 1;       // where lines are written
    int stderr_fd = 2;
  };
  // Opens DIR/rank.<r>.log for each rank when output_dir is set (creating the
  // directory); throws std::system_error when that fails.
  OutputRouter(const Options& options, int world_size);
  ~OutputRouter();
  // Makes room for ranks [0, count) (elastic mode numbers its workers as they
  // start); opens their log files as the constructor does.
  void grow(int count);
  OutputRouter(const OutputRouter&) = delete;
  OutputRouter& operator=(const OutputRouter&) = delete;

  // Bytes read from a rank's stream. Complete lines are written out at once;
  // a partial line waits for its end (or for flush()). Lines longer than 64 KiB
  // are written in pieces. A carriage return ends a segment too (a progress
  // bar redrawing its line): the segment is written at once, tagged like a
  // line and ending in '\r' instead of '\n', and is the rank's last line
  // until the next; "\r\n" is one line end.
  void feed(int rank, Stream stream, const char* data, size_t size);
  // Writes out a pending partial line (with a newline added): the stream ended.
  void flush(int rank, Stream stream);

  // The last line `rank` wrote ("" when none) and on which stream.
  std::string last_line(int rank, Stream* stream = nullptr) const;
  // "" when every log file got all its output; else one line for kolorun's
  // report naming the ranks whose log files are incomplete and why (a full
  // disk, a file-size limit). Each failure is also reported when it happens.
  std::string log_failures() const;
  // Path of the rank's log file, or "" without --output-dir.
  std::string log_path(int rank) const;
  // Where the rank's full output went, completing "its output went to ...".
  std::string where(int rank) const;

 private:
  struct Line {
    Stream stream;
    std::string text;
  };
  struct RankState {
    std::string partial[2];
    bool after_cr[2] = {false, false};  // the last byte written of the stream was a '\r' end
    std::deque<Line> last;
    int log_fd = -1;
    std::string log_path;
    std::string log_error;  // why writing the log file failed ("" = it did not)
  };
  // One line or segment, written with `end` ("\n" or "\r") after it.
  void emit(int rank, Stream stream, const std::string& line, const char* end = "\n");
  // `text` as it is, untagged and not remembered: the '\n' after a '\r' end.
  void write_raw(int rank, Stream stream, const std::string& text);

  Options options_;
  std::vector<RankState> ranks_;
};

}  // namespace kolo::launcher

// Running the built kolorun from tests, always under a watchdog.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kolo::kolorun_test {

std::string kolorun_path();                        // KOLO_BINARY_DIR/launcher/kolorun
std::string worker_path(const std::string& name);  // KOLO_BINARY_DIR/tests/<name>
std::string bench_path();                          // KOLO_BINARY_DIR/bench/kolo-bench
std::string torch_tests_path();  // KOLO_BINARY_DIR/tests/kolo_torch_tests (run under kolorun)

struct RunResult {
  int exit_code = -1;      // kolorun's exit code (-1 when killed by a signal)
  int term_signal = 0;     // signal that ended kolorun, if any
  bool timed_out = false;  // the watchdog had to SIGKILL kolorun
  std::string out;
  std::string err;
  std::vector<std::string> err_lines() const;
};

// kolorun running in the background with its stdout/stderr captured. The
// destructor SIGKILLs and reaps it if it is still running (its workers follow
// through their parent-death signal).
class KolorunProcess {
 public:
  // extra_env: "NAME=VALUE" entries added to (or replacing in) this process's
  // environment; "NAME" alone removes NAME. `program`: what to run in place
  // of kolorun (e.g. kolo-bench, which starts kolorun itself).
  explicit KolorunProcess(const std::vector<std::string>& args,
                          const std::vector<std::string>& extra_env = {},
                          const std::string& program = kolorun_path());
  ~KolorunProcess();
  KolorunProcess(const KolorunProcess&) = delete;
  KolorunProcess& operator=(const KolorunProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads output until `done(stdout so far)` holds or the timeout passes.
  bool wait_for_stdout(const std::function<bool(const std::string&)>& done,
                       std::chrono::milliseconds timeout);
  // Waits for kolorun to exit, reading its output; SIGKILLs it at the timeout.
  RunResult wait(std::chrono::milliseconds timeout);

 private:
  void pump(std::chrono::milliseconds max_wait);
  bool try_reap();

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool reaped_ = false;
  RunResult result_;
};

// Runs `program` (not kolorun) to completion under the watchdog.
RunResult run_program(const std::string& program, const std::vector<std::string>& args,
                      std::chrono::milliseconds timeout,
                      const std::vector<std::string>& extra_env = {});

// Runs `command` through /bin/sh (popen): its stdout and its wait status
// (-1 when the shell could not be started). No watchdog: bound the command
// itself (e.g. with `timeout`).
std::pair<std::string, int> run_shell(const std::string& command);

// Runs kolorun to completion under the watchdog.
RunResult run_kolorun(const std::vector<std::string>& args,
                      std::chrono::milliseconds timeout = std::chrono::seconds(60),
                      const std::vector<std::string>& extra_env = {});

// True when `pid` no longer runs (gone, or a zombie nobody reaped yet).
bool process_gone(pid_t pid);
// Waits up to `timeout` for process_gone(pid).
bool wait_gone(pid_t pid, std::chrono::milliseconds timeout);

// Values of "key=<int>" in the output, in order (e.g. every "pid=" a worker
// printed; works on tagged and untagged output).
std::vector<int> int_values(const std::string& output, const std::string& key);

// The lines of `output` that rank `rank` wrote on `stream` ("stdout"/"stderr")
// under --tag-output, with the tag removed.
std::vector<std::string> tagged_lines(const std::string& output, int rank,
                                      const std::string& stream = "stdout");

// Cores this process may use (the count kolorun divides among workers).
int usable_cores_here();

// How many times `what` occurs in `text`.
size_t count_of(const std::string& text, const std::string& what);

// The pid of a child of `parent` (kolorun: one of its workers) whose
// environment holds `variable` ("KOLO_RANK=2"); -1 if none. Children that
// exit during the scan are skipped.
pid_t child_with_env(pid_t parent, const std::string& variable);

// The numbers printed right after `prefix` in `output`, in order: prefix
// "loss " finds 0.25 in "step 20 loss 0.25", "test accuracy: " 0.9 in
// "test accuracy: 0.9".
std::vector<double> numbers_after(const std::string& output, const std::string& prefix);

// A test-parameter name from flag pairs: {"--dp", "2", "--pp", "2"} -> "dp2pp2".
std::string flag_pairs_name(const std::vector<std::string>& flags);

}  // namespace kolo::kolorun_test

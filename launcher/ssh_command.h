// The command that starts one worker on a remote host.
//
//   ssh -o BatchMode=yes HOST '<script>'
//
// The script (POSIX sh, run by the remote login shell) changes to kolorun's
// working directory, reads the job secret from the first line of its stdin
// (so that it appears on no command line, local or remote) and exports it,
// starts the program under `env` with the worker's variables,
// and watches its own stdin: kolorun keeps a pipe to ssh's stdin open for the
// whole run, so end-of-file there (kolorun stopping the worker, or kolorun or the
// connection dying) makes the script SIGTERM the worker and SIGKILL it after the
// grace period. No remote orphan outlives the connection. The script exits with
// the worker's status (128 + signal number when a signal ended it).
#pragma once

#include <string>
#include <vector>

#include "worker_env.h"

namespace kolo::launcher {

// Quotes `text` for a POSIX shell: unchanged when it only holds safe characters,
// otherwise wrapped in single quotes ('\'' for each quote inside).
std::string shell_quote(const std::string& text);

struct RemoteWorker {
  std::string host;
  std::string working_dir;
  std::vector<EnvVar> variables;  // literal NAME=VALUE pairs given to `env`
  // When > 0, OMP/OPENBLAS/MKL_NUM_THREADS not in `variables` are set to
  // max(1, nproc / threads_divisor) computed on the remote host.
  int threads_divisor = 0;
  std::string program;
  std::vector<std::string> args;
  double grace_seconds = 5.0;
  // The script reads one line from stdin into KOLO_JOB_SECRET before anything
  // else (kolorun writes `secret + "\n"` to ssh's stdin, SpawnRequest::stdin_data).
  bool secret_on_stdin = false;
};

// The shell script run on the remote host.
std::string remote_script(const RemoteWorker& worker);

// The local argv: the words of `ssh_command`, "-o BatchMode=yes", the host, the script.
std::vector<std::string> remote_command(const std::string& ssh_command, const RemoteWorker& worker);

}  // namespace kolo::launcher

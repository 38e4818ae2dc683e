// Stand-in for ssh in kolorun's tests (this machine has no ssh peers).
//
//   fake_ssh [-o OPTION]... HOST COMMAND
//
// Behaves like `ssh -o BatchMode=yes HOST COMMAND` towards a host that is this
// machine: runs COMMAND with /bin/sh (the remote login shell), stdin/stdout/
// stderr passed through, and exits with its status. It records HOST in
// FAKE_SSH_HOST so the worker can show where it "ran".
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  int i = 1;
  while (i < argc && std::string(argv[i]) == "-o") i += 2;
  if (argc - i != 2) {
    std::fprintf(stderr, "fake_ssh: usage: fake_ssh [-o OPTION]... HOST COMMAND\n");
    return 255;
  }
  setenv("FAKE_SSH_HOST", argv[i], 1);
  execl("/bin/sh", "sh", "-c", argv[i + 1], static_cast<char*>(nullptr));
  std::perror("fake_ssh: exec /bin/sh");
  return 255;
}

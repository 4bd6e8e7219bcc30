// launch_measure: runs one command and reports its wall time and peak RSS, for launch_bench.py.
//
//   launch_measure OUT_FILE COMMAND [ARGS...]
//
// Writes "<wall_ns> <maxrss_kib> <exit_code>\n" to OUT_FILE once COMMAND has exited. An exit
// code of 128+N means killed by signal N.
//
// Why a helper: ru_maxrss (wait4) is the high-water mark of the child and of its waited-for
// descendants, and the kernel seeds it, at exec, with the RSS of the address space the exec
// replaces. A child that Python starts with posix_spawn (vfork semantics) replaces Python's own
// address space, so its ru_maxrss would start at the benchmark driver's RSS (about 13 MB here).
// This helper is small and single-threaded, forks, and the child execs COMMAND: the number
// starts from the helper's copied pages (under 2 MB) and is then the agent's own peak (its
// workers, forked from it, start from at most the agent's RSS).
//
// The wall time runs from just before fork() to wait4()'s return. The caller bounds the run:
// it kills this helper's process tree when its deadline passes.
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace {

long long now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: launch_measure OUT_FILE COMMAND [ARGS...]\n");
    return 2;
  }
  const long long t0 = now_ns();
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("launch_measure: fork");
    return 2;
  }
  if (pid == 0) {
    execv(argv[2], argv + 2);
    std::fprintf(stderr, "launch_measure: cannot run %s: %s\n", argv[2], std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  while (wait4(pid, &status, 0, &usage) < 0) {
    if (errno != EINTR) {
      std::perror("launch_measure: wait4");
      return 2;
    }
  }
  const long long t1 = now_ns();
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::FILE* out = std::fopen(argv[1], "w");
  if (out == nullptr) {
    std::perror("launch_measure: open OUT_FILE");
    return 2;
  }
  std::fprintf(out, "%lld %ld %d\n", t1 - t0, usage.ru_maxrss, code);
  return std::fclose(out) == 0 ? 0 : 2;
}

// launch_probe: the worker of launch_bench.py's restart benchmark. Plain C++, no LibTorch, so
// that both launchers start the same small binary (torchrun with --no_python).
//
//   launch_probe OUT_DIR [--fail_restarts K] [--fail_after_ms MS] [--max_sleep_s S]
//
// Every worker records CLOCK_MONOTONIC as early as it can (a constructor that runs before
// main) and writes it to OUT_DIR/start.<restart>.<local_rank>.<pid>. Then, while
// TORCHELASTIC_RESTART_COUNT < K:
//   - local rank 0 waits MS milliseconds (so that its whole group is up), records
//     CLOCK_MONOTONIC into OUT_DIR/fail.<restart> and exits with 1;
//   - the other local ranks sleep until their agent stops them (at most S seconds, then exit 2).
// From restart K on, every worker exits 0 at once, so the job succeeds.
//
// Each file holds one line, "<nanoseconds>\n", and appears under its final name complete
// (written under a temporary name, then renamed).
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

long long g_start_ns = 0;

long long now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

__attribute__((constructor(101))) void record_start() { g_start_ns = now_ns(); }

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno != 0 || *end != '\0') {
    std::fprintf(stderr, "launch_probe: bad %s=%s\n", name, v);
    std::exit(3);
  }
  return x;
}

// Writes "<ns>\n" to dir/name through a temporary file and a rename.
bool write_stamp(const std::string& dir, const std::string& name, long long ns) {
  const std::string tmp = dir + "/." + name + ".tmp";
  const std::string path = dir + "/" + name;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  char buf[32];
  const int n = std::snprintf(buf, sizeof buf, "%lld\n", ns);
  const bool ok = ::write(fd, buf, static_cast<size_t>(n)) == n;
  ::close(fd);
  return ok && ::rename(tmp.c_str(), path.c_str()) == 0;
}

void sleep_ms(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: launch_probe OUT_DIR [--fail_restarts K] [--fail_after_ms MS] "
                 "[--max_sleep_s S]\n");
    return 3;
  }
  const std::string dir = argv[1];
  long fail_restarts = 0, fail_after_ms = 300, max_sleep_s = 120;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const long value = std::strtol(argv[i + 1], nullptr, 10);
    if (flag == "--fail_restarts") {
      fail_restarts = value;
    } else if (flag == "--fail_after_ms") {
      fail_after_ms = value;
    } else if (flag == "--max_sleep_s") {
      max_sleep_s = value;
    } else {
      std::fprintf(stderr, "launch_probe: unknown flag %s\n", flag.c_str());
      return 3;
    }
  }
  const long restart = env_long("TORCHELASTIC_RESTART_COUNT", -1);
  const long local_rank = env_long("LOCAL_RANK", -1);
  if (restart < 0 || local_rank < 0) {
    std::fprintf(stderr, "launch_probe: TORCHELASTIC_RESTART_COUNT and LOCAL_RANK must be set\n");
    return 3;
  }
  const std::string start_name = "start." + std::to_string(restart) + "." +
                                 std::to_string(local_rank) + "." + std::to_string(::getpid());
  if (!write_stamp(dir, start_name, g_start_ns)) {
    std::fprintf(stderr, "launch_probe: cannot write %s/%s: %s\n", dir.c_str(), start_name.c_str(),
                 std::strerror(errno));
    return 3;
  }
  if (restart >= fail_restarts) return 0;
  if (local_rank == 0) {
    sleep_ms(fail_after_ms);
    // Open the file first, so that only a write separates the time stamp from the exit.
    const std::string name = "fail." + std::to_string(restart);
    const std::string tmp = dir + "/." + name + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return 3;
    char buf[32];
    const int n = std::snprintf(buf, sizeof buf, "%lld\n", now_ns());
    if (::write(fd, buf, static_cast<size_t>(n)) != n) return 3;
    ::close(fd);
    if (::rename(tmp.c_str(), (dir + "/" + name).c_str()) != 0) return 3;
    _exit(1);
  }
  // Sleep until stopped (SIGTERM's default action ends us); bounded, in case nobody does.
  sleep_ms(max_sleep_s * 1000);
  return 2;
}

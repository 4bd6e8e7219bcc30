// A worker for the agent's tests. Usage: test_worker MODE [ARGS...]
//
//   env FILE_PREFIX        write the torchrun variables to FILE_PREFIX.<RANK>, exit 0
//   exit CODE              exit with CODE
//   fail_once [PREFIX]     local rank 1 exits 3 on the first attempt; everyone else writes env
//                          (when PREFIX is given) and exits 0
//   sleep SECONDS          sleep, then write env to $CTRUN_TEST_OUT.<RANK> if set, exit 0
//   grandchild FILE        start a grandchild that sleeps, write both pids to FILE.<RANK>, sleep
//   print                  print two lines to stdout and one to stderr
//   dumpenv FILE_PREFIX    write the whole environment to FILE_PREFIX.<RANK>, exit 0
//   until_alone FILE       write the pid to FILE.<RANK>; exit 0 once the only node in the round,
//                          else sleep (a node-loss test: the survivor finishes by itself)
//   until_fewer N FILE     write the pid to FILE.<RANK>; exit 0 once the round has fewer than N
//                          nodes, else sleep (an elastic job re-formed without a lost node
//                          finishes by itself)
//   orphan_then_fail FILE  first attempt: leave a sleeping child (pid in FILE), exit 3
//   hang_once PREFIX       heartbeats (ctrun::worker::heartbeat) every 20 ms; on the first attempt
//                          local rank 1 stops beating after 0.5 s and sleeps with SIGTERM
//                          ignored; on later attempts everyone writes env and exits 0 after 1 s
//   hang                   heartbeats every 20 ms for 0.3 s, then blocks for good in
//                          stuck_in_named_function() (native stacks of a hung C++ worker)
//   daemonize FILE         leave a process in a session of its own (pid in FILE.<RANK>, its
//                          parent already gone), then exit 0 after 1 s
//   orphans FILE           leave a grandchild that exits after 0.2 s (its parent gone first),
//                          wait 2.5 s, write to FILE.<RANK> how many zombies the agent (this
//                          worker's parent) holds, exit 0
//   steps COUNT FILE       COUNT steps of 50 ms, each reported (report_step) and written to
//                          FILE.<RANK>.<restart count>, then exit 0
//   exit_on_group_rank R CODE  the workers of group rank R exit with CODE, the others sleep
//   usr1 PREFIX            write PREFIX.<RANK>.ready, wait (up to 60 s) for SIGUSR1, then write
//                          env to PREFIX.<RANK> and exit 0 (a checkpoint on Slurm's warning)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "ctrun/worker/heartbeat.h"

namespace {

volatile sig_atomic_t got_usr1 = 0;

// How many zombie children `parent` has (from /proc/*/stat).
int zombies_of(pid_t parent) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream stat(entry.path() / "stat");
    std::string content;
    if (!std::getline(stat, content)) continue;
    const auto close = content.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(content.substr(close + 1));
    char state = '?';
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (state == 'Z' && ppid == parent) ++count;
  }
  return count;
}

// Where the "hang" mode stays: a frame with a name for eu-stack to find.
[[gnu::noinline]] void stuck_in_named_function() {
  while (true) pause();
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "<unset>";
}

// Whole or not at all: a test that sees the file reads the pid (written, then renamed in).
void write_pid(const std::string& path) {
  std::ofstream(path + ".tmp") << getpid() << "\n";
  std::filesystem::rename(path + ".tmp", path);
}

void write_env(const std::string& prefix) {
  std::ofstream out(prefix + "." + env("RANK"));
  for (const char* name : {"RANK",
                           "LOCAL_RANK",
                           "GROUP_RANK",
                           "ROLE_RANK",
                           "ROLE_NAME",
                           "LOCAL_WORLD_SIZE",
                           "WORLD_SIZE",
                           "GROUP_WORLD_SIZE",
                           "ROLE_WORLD_SIZE",
                           "MASTER_ADDR",
                           "MASTER_PORT",
                           "TORCHELASTIC_RESTART_COUNT",
                           "TORCHELASTIC_MAX_RESTARTS",
                           "TORCHELASTIC_RUN_ID",
                           "TORCHELASTIC_USE_AGENT_STORE",
                           "TORCHELASTIC_ERROR_FILE",
                           "OMP_NUM_THREADS",
                           "CTRUN_STORE_BACKEND",
                           "CTRUN_STORE_ADDR",
                           "CTRUN_STORE_PORT",
                           "CTRUN_STORE_PREFIX"}) {
    out << name << "=" << env(name) << "\n";
  }
  // Not a variable: how the worker's SIGPIPE was set up (it must start at the default).
  struct sigaction pipe_action {};
  sigaction(SIGPIPE, nullptr, &pipe_action);
  out << "X_SIGPIPE_IGNORED=" << (pipe_action.sa_handler == SIG_IGN ? 1 : 0) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "env" && argc > 2) {
    write_env(argv[2]);
    return 0;
  }
  if (mode == "exit" && argc > 2) return std::atoi(argv[2]);
  if (mode == "fail_once") {
    if (env("TORCHELASTIC_RESTART_COUNT") == "0" && env("LOCAL_RANK") == "1") return 3;
    if (argc > 2) write_env(argv[2]);
    return 0;
  }
  // --fault_tolerance=step: each process appends "<local rank> <pid> <restart count>" to the
  // file; local rank 1's first process fails, local rank 0 outlives its replacement's start.
  if (mode == "ft_once" && argc > 2) {
    {
      std::ofstream out(argv[2], std::ios::app);
      out << env("LOCAL_RANK") << " " << getpid() << " " << env("TORCHELASTIC_RESTART_COUNT")
          << "\n";
    }
    if (env("TORCHELASTIC_RESTART_COUNT") == "0" && env("LOCAL_RANK") == "1") return 3;
    if (env("LOCAL_RANK") == "0") std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return 0;
  }
  if (mode == "sleep" && argc > 2) {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(argv[2])));
    if (const char* out = std::getenv("CTRUN_TEST_OUT")) write_env(out);
    return 0;
  }
  if (mode == "grandchild" && argc > 2) {
    const pid_t child = fork();
    if (child == 0) {
      execl("/bin/sleep", "sleep", "300", nullptr);
      _exit(127);
    }
    std::ofstream(std::string(argv[2]) + "." + env("RANK")) << getpid() << " " << child << "\n";
    std::this_thread::sleep_for(std::chrono::seconds(300));
    return 0;
  }
  if (mode == "daemonize" && argc > 2) {
    const std::string file = std::string(argv[2]) + "." + env("RANK");
    const pid_t middle = fork();
    if (middle == 0) {
      if (fork() == 0) {
        setsid();
        std::ofstream(file + ".tmp") << getpid() << "\n";
        std::rename((file + ".tmp").c_str(), file.c_str());
        execl("/bin/sleep", "sleep", "300", nullptr);
        _exit(127);
      }
      _exit(0);  // the daemon's parent goes: it is re-parented
    }
    waitpid(middle, nullptr, 0);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    return 0;
  }
  if (mode == "orphans" && argc > 2) {
    const pid_t middle = fork();
    if (middle == 0) {
      if (fork() == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        _exit(0);
      }
      _exit(0);
    }
    waitpid(middle, nullptr, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    std::ofstream(std::string(argv[2]) + "." + env("RANK")) << zombies_of(getppid()) << "\n";
    return 0;
  }
  if (mode == "dumpenv" && argc > 2) {
    std::ofstream out(std::string(argv[2]) + "." + env("RANK"));
    for (char** e = environ; *e; ++e) out << *e << "\n";
    return 0;
  }
  if (mode == "until_alone" && argc > 2) {
    write_pid(std::string(argv[2]) + "." + env("RANK"));
    if (env("GROUP_WORLD_SIZE") == "1") return 0;
    std::this_thread::sleep_for(std::chrono::seconds(300));
    return 0;
  }
  if (mode == "until_fewer" && argc > 3) {
    write_pid(std::string(argv[3]) + "." + env("RANK"));
    if (std::atoi(env("GROUP_WORLD_SIZE").c_str()) < std::atoi(argv[2])) return 0;
    std::this_thread::sleep_for(std::chrono::seconds(300));
    return 0;
  }
  if (mode == "orphan_then_fail" && argc > 2) {
    if (env("TORCHELASTIC_RESTART_COUNT") != "0") return 0;
    const pid_t child = fork();
    if (child == 0) {
      execl("/bin/sleep", "sleep", "300", nullptr);
      _exit(127);
    }
    std::ofstream(argv[2]) << child << "\n";
    return 3;
  }
  if (mode == "hang_once" && argc > 2) {
    const bool first = env("TORCHELASTIC_RESTART_COUNT") == "0";
    const bool hangs = first && env("LOCAL_RANK") == "1";
    if (hangs) signal(SIGTERM, SIG_IGN);  // a hung process may not answer SIGTERM either
    const auto start = std::chrono::steady_clock::now();
    while (true) {
      const auto running = std::chrono::steady_clock::now() - start;
      if (!first && running > std::chrono::seconds(1)) break;
      if (!hangs || running < std::chrono::milliseconds(500)) ctrun::worker::heartbeat();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    write_env(argv[2]);
    return 0;
  }
  if (mode == "hang") {
    for (int i = 0; i < 15; ++i) {
      ctrun::worker::heartbeat();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    stuck_in_named_function();
  }
  if (mode == "usr1" && argc > 2) {
    signal(SIGUSR1, [](int) { got_usr1 = 1; });
    std::ofstream(std::string(argv[2]) + "." + env("RANK") + ".ready") << getpid() << "\n";
    for (int i = 0; i < 3000 && !got_usr1; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!got_usr1) return 4;
    write_env(argv[2]);
    return 0;
  }
  // Steps of 50 ms, each reported to the agent (ctrun::worker::report_step) and written to
  // FILE.<RANK>.<restart count> as the last step done; exit 0 after COUNT.
  if (mode == "steps" && argc > 3) {
    const std::string file =
        std::string(argv[3]) + "." + env("RANK") + "." + env("TORCHELASTIC_RESTART_COUNT");
    for (int step = 1; step <= std::atoi(argv[2]); ++step) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::ofstream(file) << step << "\n";
      ctrun::worker::report_step(step);
    }
    return 0;
  }
  // A failure on one node: the workers of group rank R exit with CODE, the others wait for the
  // job's end (their agent stops them).
  if (mode == "exit_on_group_rank" && argc > 3) {
    if (env("GROUP_RANK") == argv[2]) return std::atoi(argv[3]);
    std::this_thread::sleep_for(std::chrono::seconds(300));
    return 0;
  }
  if (mode == "print") {
    std::printf("hello from %s\nsecond line\n", env("RANK").c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "to stderr\n");
    return 0;
  }
  std::fprintf(stderr, "test_worker: unknown mode '%s'\n", mode.c_str());
  return 2;
}

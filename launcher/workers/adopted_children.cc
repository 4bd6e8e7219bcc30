#include "launcher/workers/adopted_children.h"

#include <dirent.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>

namespace ctrun::launcher {

namespace rdzv = ctrun::rendezvous;

namespace {

// Every thread's children: a child belongs to the thread that forked it.
std::vector<int> all_children() {
  std::vector<int> out;
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return out;
  while (dirent* t = readdir(tasks)) {
    if (t->d_name[0] == '.') continue;
    std::ifstream in(std::string("/proc/self/task/") + t->d_name + "/children");
    for (int pid = 0; in >> pid;) out.push_back(pid);
  }
  closedir(tasks);
  return out;
}

}  // namespace

rdzv::Status become_child_subreaper() {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    return rdzv::Error{rdzv::ErrorCode::kInternal,
                       std::string("cannot become a child subreaper: ") + std::strerror(errno)};
  }
  return rdzv::ok_status();
}

std::vector<int> adopted_children(const std::vector<int>& workers) {
  const pid_t own_group = getpgrp();
  std::vector<int> out;
  for (int pid : all_children()) {
    if (std::find(workers.begin(), workers.end(), pid) != workers.end()) continue;
    const pid_t group = getpgid(pid);
    if (group < 0 || group == own_group) continue;  // gone, or the agent's own (a probe)
    out.push_back(pid);
  }
  return out;
}

int reap_adopted_children(const std::vector<int>& workers) {
  int reaped = 0;
  for (int pid : adopted_children(workers)) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) ++reaped;
  }
  return reaped;
}

int kill_adopted_children(const std::vector<int>& workers, int rounds) {
  std::set<int> killed;
  for (int round = 0; round < rounds; ++round) {
    const std::vector<int> adopted = adopted_children(workers);
    if (adopted.empty()) break;
    for (int pid : adopted) {
      if (killed.insert(pid).second) ::kill(pid, SIGKILL);
    }
    // Reaped as they die; their own children are re-parented here and killed next round.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    reap_adopted_children(workers);
  }
  return static_cast<int>(killed.size());
}

}  // namespace ctrun::launcher

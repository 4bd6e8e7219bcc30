// The dependency rules of docs/architecture.md, held against the includes of the tree: each
// part of rendezvous/ and launcher/ includes only the parts below it, the pure files of the
// launcher include no socket, process or Asio header, and the worker runtime and the trainers
// never include the launcher. A new file in a folder that is no part fails here too.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = CTRUN_SOURCE_DIR;

// What each part may include besides itself (the transitive closure of its link line).
const std::map<std::string, std::set<std::string>> kAllowed = {
    {"rendezvous/base", {}},
    {"rendezvous/tls", {"rendezvous/base"}},
    {"rendezvous/protocol", {"rendezvous/base"}},
    {"rendezvous/core", {"rendezvous/protocol", "rendezvous/base"}},
    {"rendezvous/service", {"rendezvous/core", "rendezvous/protocol", "rendezvous/base"}},
    {"rendezvous/daemon",
     {"rendezvous/service", "rendezvous/core", "rendezvous/tls", "rendezvous/protocol",
      "rendezvous/base"}},
    {"rendezvous/client", {"rendezvous/protocol", "rendezvous/tls", "rendezvous/base"}},
    {"rendezvous/etcd",
     {"rendezvous/core", "rendezvous/tls", "rendezvous/protocol", "rendezvous/base"}},
    {"rendezvous/backend",
     {"rendezvous/client", "rendezvous/etcd", "rendezvous/core", "rendezvous/tls",
      "rendezvous/protocol", "rendezvous/base"}},
    // worker_runtime reaches the rendezvous through its public headers only.
    {"worker_runtime/base", {}},
    {"worker_runtime/quorum", {"worker_runtime/base"}},
    {"worker_runtime/process_groups", {"worker_runtime/base", "rendezvous/base"}},
    {"worker_runtime/data_parallel", {"worker_runtime/process_groups", "worker_runtime/base"}},
    {"worker_runtime/sharded", {"worker_runtime/process_groups", "worker_runtime/base"}},
    {"worker_runtime/checkpoints",
     {"worker_runtime/sharded", "worker_runtime/data_parallel", "worker_runtime/process_groups",
      "worker_runtime/base", "rendezvous/base"}},
    {"worker_runtime/fault_tolerance",
     {"worker_runtime/quorum", "worker_runtime/sharded", "worker_runtime/process_groups",
      "worker_runtime/base"}},
    {"launcher/cli", {"rendezvous/base"}},
    {"launcher/workers", {"launcher/cli", "rendezvous/protocol", "rendezvous/base"}},
    {"launcher/diagnosis",
     {"launcher/workers", "launcher/cli", "rendezvous/protocol", "rendezvous/base"}},
    // The faults of a whole node stand in front of the agent's Backend (cut_off_backend).
    {"launcher/faults",
     {"launcher/cli", "rendezvous/backend", "rendezvous/protocol", "rendezvous/base"}},
    // The agent talks to a Backend; it hosts a daemon's Server for --standalone and is_host.
    {"launcher/agent",
     {"launcher/diagnosis", "launcher/faults", "launcher/workers", "launcher/cli",
      "rendezvous/backend", "rendezvous/daemon", "rendezvous/protocol", "rendezvous/base"}},
    {"launcher/cluster",
     {"launcher/agent", "launcher/diagnosis", "launcher/faults", "launcher/workers", "launcher/cli",
      "rendezvous/backend", "rendezvous/daemon", "rendezvous/protocol", "rendezvous/base"}},
    // `ctrun status` reads an etcd job's keys itself (etcd_jobs.h) and ctrund's with a Client;
    // `ctrun worker-proxy` is the Python workers' way to the per-step quorum.
    {"launcher/commands",
     {"launcher/cluster", "launcher/agent", "launcher/diagnosis", "launcher/faults",
      "launcher/workers", "launcher/cli", "worker_runtime/quorum", "rendezvous/backend",
      "rendezvous/etcd", "rendezvous/client", "rendezvous/protocol", "rendezvous/base"}},
};

// The launcher's public headers belong to the part that implements them.
const std::map<std::string, std::string> kPublicLauncherHeaders = {
    {"ctrun/launcher/options.h", "launcher/cli"},
    {"ctrun/launcher/slurm.h", "launcher/cli"},
    {"ctrun/launcher/worker_env.h", "launcher/workers"},
    {"ctrun/launcher/log_line_prefix.h", "launcher/workers"},
    {"ctrun/launcher/failure_report.h", "launcher/diagnosis"},
};

// The worker runtime's public headers, likewise.
const std::map<std::string, std::string> kPublicWorkerHeaders = {
    {"ctrun/worker/env.h", "worker_runtime/base"},
    {"ctrun/worker/error_file.h", "worker_runtime/base"},
    {"ctrun/worker/heartbeat.h", "worker_runtime/base"},
    {"ctrun/worker/log.h", "worker_runtime/base"},
    {"ctrun/worker/lr_schedule.h", "worker_runtime/base"},
    {"ctrun/worker/malloc_tuning.h", "worker_runtime/base"},
    {"ctrun/worker/sampler.h", "worker_runtime/base"},
    {"ctrun/worker/throughput.h", "worker_runtime/base"},
    {"ctrun/worker/torch_forward.h", "worker_runtime/base"},
    {"ctrun/worker/step_quorum.h", "worker_runtime/quorum"},
    {"ctrun/worker/process_group.h", "worker_runtime/process_groups"},
    {"ctrun/worker/ddp.h", "worker_runtime/data_parallel"},
    {"ctrun/worker/optimizers.h", "worker_runtime/data_parallel"},
    {"ctrun/worker/sharded.h", "worker_runtime/sharded"},
    {"ctrun/worker/checkpoint.h", "worker_runtime/checkpoints"},
    {"ctrun/worker/sharded_checkpoint.h", "worker_runtime/checkpoints"},
    {"ctrun/worker/fault_tolerance.h", "worker_runtime/fault_tolerance"},
};

// The launcher's pure files: decisions and parsers, tested in memory.
const std::set<std::string> kPureLauncherFiles = {
    "cli/arg_parser",
    "cli/host_list",
    "cli/option_text",
    "cli/options",
    "cli/slurm",
    "cli/text",
    "workers/file_timers",
    "workers/log_line_prefix",
    "workers/numa_binding",
    "workers/worker_env",
    "workers/worker_exit",
    "workers/stderr_tail",
    "diagnosis/failure_report",
    "diagnosis/hang_report",
    "diagnosis/health_checks",
    "diagnosis/heartbeat_monitor",
    "diagnosis/native_stacks",
    "workers/stderr_tail",
    "diagnosis/step_rates",
    "diagnosis/stragglers",
    "faults/fault_injector",
    "faults/fault_plan",
    "faults/fault_report",
    "faults/fault_timeline",
    "faults/link_cut",
    "agent/agent_machine",
    "agent/rendezvous_plan",
    "cluster/cluster_job",
    "cluster/cluster_plan",
    "commands/status_view",
};

// Headers a pure file must not include: sockets, processes, the event loop, coroutines.
const std::vector<std::string> kImpureHeaders = {
    "<boost/asio",   "<boost/process", "<sys/socket.h>", "<netinet/",
    "<arpa/inet.h>", "<sys/wait.h>",   "<spawn.h>",      "\"ctrun/rendezvous/task.h\"",
};

struct Include {
  std::string text;  // as written, with its quotes or brackets
  int line;
};

std::vector<Include> includes_of(const fs::path& file) {
  std::ifstream in(file);
  std::vector<Include> out;
  std::string line;
  int number = 0;
  static const std::regex include_line(R"(^\s*#\s*include\s*([<"][^>"]+[>"]))");
  while (std::getline(in, line)) {
    ++number;
    std::smatch match;
    if (std::regex_search(line, match, include_line)) out.push_back({match[1], number});
  }
  return out;
}

// "rendezvous/core" for "\"rendezvous/core/store.h\"", the public launcher headers' parts;
// empty for anything else (system headers, public rendezvous headers, the folder's own).
std::string part_of_include(const std::string& text) {
  if (text.front() != '"') return "";
  const std::string path = text.substr(1, text.size() - 2);
  if (const auto it = kPublicLauncherHeaders.find(path); it != kPublicLauncherHeaders.end()) {
    return it->second;
  }
  if (const auto it = kPublicWorkerHeaders.find(path); it != kPublicWorkerHeaders.end()) {
    return it->second;
  }
  for (const char* top : {"rendezvous/", "launcher/", "worker_runtime/"}) {
    if (path.rfind(top, 0) != 0) continue;
    const auto slash = path.find('/', std::string(top).size());
    if (slash == std::string::npos) return "";
    return path.substr(0, slash);
  }
  return "";
}

bool is_source(const fs::path& file) {
  const auto ext = file.extension();
  return ext == ".cc" || ext == ".h" || ext == ".in";
}

// Every source file under `top`'s part folders, with the part it is in ("launcher/agent").
std::vector<std::pair<std::string, fs::path>> sources_of_parts(const std::string& top) {
  std::vector<std::pair<std::string, fs::path>> out;
  for (const auto& entry : fs::directory_iterator(kRoot / top)) {
    if (!entry.is_directory()) continue;
    const std::string folder = entry.path().filename().string();
    if (folder == "include" || folder == "python") continue;
    const std::string part = top + "/" + folder;
    for (const auto& file : fs::recursive_directory_iterator(entry.path())) {
      if (file.is_regular_file() && is_source(file.path())) out.emplace_back(part, file.path());
    }
  }
  return out;
}

// The broken rules, one per line, for the failure's message.
std::string lines_of(const std::vector<std::string>& broken) {
  std::ostringstream text;
  for (const auto& line : broken) text << line << "\n";
  return text.str();
}

}  // namespace

TEST_CASE(
    "architecture: every part of rendezvous/ and launcher/ includes only the parts below it") {
  std::vector<std::string> broken;
  int files = 0;
  for (const std::string top : {"rendezvous", "launcher", "worker_runtime"}) {
    for (const auto& [part, file] : sources_of_parts(top)) {
      ++files;
      const auto allowed = kAllowed.find(part);
      if (allowed == kAllowed.end()) {
        broken.push_back(file.string() + ": in " + part + ", which is no part of the graph");
        continue;
      }
      for (const auto& include : includes_of(file)) {
        const std::string to = part_of_include(include.text);
        // The launcher reaches a rendezvous through the Backend seam only, and only the
        // command's main (and the agent's own files) include the agent.
        const bool past_seam = top == "launcher" && to == "rendezvous/backend" &&
                               include.text != "\"rendezvous/backend/backend.h\"" &&
                               include.text != "\"rendezvous/backend/backend_spec.h\"";
        const bool agent_from_outside = include.text == "\"launcher/agent/agent.h\"" &&
                                        part != "launcher/agent" && file.filename() != "main.cc";
        if (!past_seam && !agent_from_outside &&
            (to.empty() || to == part || allowed->second.count(to))) {
          continue;
        }
        broken.push_back(fs::relative(file, kRoot).string() + ":" + std::to_string(include.line) +
                         ": " + part + " includes " + include.text);
      }
    }
  }
  INFO(lines_of(broken));
  CHECK(files > 200);
  CHECK(broken.empty());
}

TEST_CASE("architecture: the launcher's pure files include no socket, process or event loop") {
  std::vector<std::string> broken;
  std::set<std::string> found;
  for (const auto& [part, file] : sources_of_parts("launcher")) {
    const std::string stem =
        part.substr(std::string("launcher/").size()) + "/" + file.stem().string();
    if (!kPureLauncherFiles.count(stem)) continue;
    found.insert(stem);
    for (const auto& include : includes_of(file)) {
      bool impure = false;
      for (const auto& prefix : kImpureHeaders) {
        if (include.text.rfind(prefix, 0) == 0) impure = true;
      }
      // A pure file includes only pure files of the launcher.
      const std::string to = part_of_include(include.text);
      if (to.rfind("launcher/", 0) == 0) {
        const auto path = fs::path(include.text.substr(1, include.text.size() - 2));
        const std::string included =
            to.substr(std::string("launcher/").size()) + "/" + path.stem().string();
        if (!kPureLauncherFiles.count(included)) impure = true;
      }
      if (impure) {
        broken.push_back(fs::relative(file, kRoot).string() + ":" + std::to_string(include.line) +
                         ": includes " + include.text);
      }
    }
  }
  INFO(lines_of(broken));
  CHECK(found == kPureLauncherFiles);  // each listed file exists
  CHECK(broken.empty());
}

TEST_CASE(
    "architecture: the worker runtime never includes the launcher, the trainers only its public "
    "headers") {
  std::vector<std::string> broken;
  for (const std::string top : {"worker_runtime", "trainers"}) {
    for (const auto& file : fs::recursive_directory_iterator(kRoot / top)) {
      if (!file.is_regular_file() || !is_source(file.path())) continue;
      for (const auto& include : includes_of(file.path())) {
        const std::string& text = include.text;
        if (text.find("\"launcher/") == 0 || text.find("\"ctrun/launcher/") == 0 ||
            (top == "trainers" &&
             (text.find("\"rendezvous/") == 0 || text.find("\"worker_runtime/") == 0))) {
          broken.push_back(fs::relative(file.path(), kRoot).string() + ":" +
                           std::to_string(include.line) + ": includes " + text);
        }
      }
    }
  }
  INFO(lines_of(broken));
  CHECK(broken.empty());
}

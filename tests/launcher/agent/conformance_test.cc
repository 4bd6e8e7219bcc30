// The conformance suite (issue 16, section 4): every launch scenario of torch's launcher tests
// (test/distributed/launcher/test_run.py and its bin/ scripts, main and the 1.13 era), and the
// command lines and PET_* variables that TorchX's dist.ddp component and Kubeflow's
// training-operator produce, each run under ctrun and under the reference torchrun of PyTorch
// 1.13 (/usr/bin/torchrun, through tests/python/torchrun_ref.py), with the same outcome on both.
//
// Each scenario is one row of a table: the launcher's arguments (the same for both), the
// environment, the worker (our own scripts in tests/python/conformance/, most of them without
// torch) and the expected outcome: the launcher's exit code, the files the workers leave (one per
// global rank, holding what the launcher gave them), values in them, console lines, log files.
// Both launchers run a row at the same time; the outcome of each is checked against the row and
// against the other's.
//
// Rows that use flags torch 1.13 lacks are ctrun-only (`ctrun_only` says why). A row that shows a
// real ctrun bug is kept, marked `known_difference` with the reason: its mismatches are reported
// as warnings, and the row fails once the difference is gone, so the mark gets removed.
//
// The reference's TCPStore binds every interface, so it runs in a loopback-only network
// namespace (unshare -n; root only). Without root the reference is skipped with a warning and
// ctrun's outcome is still checked against each row.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "catch.h"
#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using Env = std::vector<std::pair<std::string, std::string>>;
using Values = std::map<std::string, std::string>;

const std::string kScripts = CONFORMANCE_DIR;
const std::string kTouch = kScripts + "/touch_rank.py";
const std::string kTouchSh = kScripts + "/touch_rank.sh";
const std::string kIsLaunched = kScripts + "/is_launched.py";
const std::string kInitMethod = kScripts + "/init_method.py";
const std::string kFileTimer = kScripts + "/file_timer.py";

// torch 1.13 raises (a traceback, exit 1) where ctrun refuses the command line in one line with
// exit 2 (docs/env.md, "The command line, flag by flag").
constexpr int kRefused = 2;

struct Row {
  std::string name;
  std::string source;  // where the scenario comes from
  std::vector<std::string> args;
  Env env = {};
  // Extra variables for each agent of a multi-node row (one entry per agent; empty: one agent).
  std::vector<Env> agents = {};
  int exit_code = 0;                   // the reference's, and ctrun's unless below
  std::optional<int> ctrun_exit = {};  // ctrun's, where it documents another code
  // The files the workers must leave in {dir}, attempts.* aside (see `attempts`).
  std::set<std::string> files = {};
  Values expect = {};  // KEY=VALUE every rank file holds, under both launchers
  // Keys whose values must be the same under both launchers, beyond kSame.
  std::vector<std::string> same = {};
  std::vector<std::string> console = {};  // text both consoles hold
  Values logs = {};                       // attempt_N/R/file under {logs}/<run>/ -> text it holds
  Values attempts = {};                   // attempts.R -> its content
  std::string ctrun_only = {};            // why the reference does not run it
  std::string known_difference = {};      // a ctrun bug this row shows (see the top)
  bool skip_with_gpu = false;             // expectations assume no GPU (nproc auto/gpu)
};

// What a rank file holds that must be the same under both launchers (paths normalised).
const std::vector<std::string> kSame = {"LOCAL_RANK",
                                        "RANK",
                                        "GROUP_RANK",
                                        "ROLE_RANK",
                                        "ROLE_NAME",
                                        "LOCAL_WORLD_SIZE",
                                        "WORLD_SIZE",
                                        "GROUP_WORLD_SIZE",
                                        "ROLE_WORLD_SIZE",
                                        "TORCHELASTIC_RESTART_COUNT",
                                        "TORCHELASTIC_MAX_RESTARTS",
                                        "OMP_NUM_THREADS",
                                        "TEST_SENTINEL_PARENT",
                                        "PYTHONUNBUFFERED",
                                        "CUDA_VISIBLE_DEVICES",
                                        "argv",
                                        "main",
                                        "arg_local_rank",
                                        "world_size",
                                        "all_reduce_sum",
                                        "content"};

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
  return s;
}

struct Places {
  std::string dir, logs, port, port2;
  std::string operator()(std::string s) const {
    s = replace_all(std::move(s), "{dir}", dir);
    s = replace_all(std::move(s), "{logs}", logs);
    s = replace_all(std::move(s), "{port2}", port2);
    s = replace_all(std::move(s), "{port}", port);
    if (s.find("{fqdn}") != std::string::npos)
      s = replace_all(std::move(s), "{fqdn}", standalone_master_addr());
    return replace_all(std::move(s), "{scripts}", kScripts);
  }
};

struct Outcome {
  std::vector<std::optional<int>> exits;
  std::string console;
  std::set<std::string> names;          // files in {dir}, attempts.* aside
  std::map<std::string, Values> ranks;  // file -> its KEY=VALUE lines, {dir} normalised
  Values attempts;                      // attempts.R -> content
  Values logs;                          // attempt_N/R/name (run directory dropped) -> content
};

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

Outcome collect(const std::string& dir, const std::string& logs) {
  Outcome o;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) continue;
    if (name.rfind("attempts.", 0) == 0) {
      o.attempts[name] = read_file(entry.path().string());
      continue;
    }
    o.names.insert(name);
    Values values;
    for (auto& [k, v] : read_env_file(entry.path().string()))
      values[k] = replace_all(v, dir, "{dir}");
    // A file of no KEY=VALUE lines (is_launched.py's True or False) is its content.
    if (values.empty()) values["content"] = read_file(entry.path().string());
    o.ranks[name] = values;
  }
  std::error_code ec;
  if (fs::is_directory(logs, ec)) {
    for (const auto& entry : fs::recursive_directory_iterator(logs)) {
      if (!is_file(entry.path())) continue;
      const fs::path rel = fs::relative(entry.path(), logs);
      // Drop the run's directory: torchrun names it <run id>_<random>, ctrun <run id>.
      fs::path tail;
      for (auto it = std::next(rel.begin()); it != rel.end(); ++it) tail /= *it;
      o.logs[tail.string()] = read_file(entry.path().string());
    }
  }
  return o;
}

// A loopback-only network namespace kept open by a sleeping process, which agents enter.
class Netns {
 public:
  explicit Netns(const ScratchDir& s)
      : up_(s.path("netns.up")),
        holder_({"/usr/bin/unshare", "-n", "/bin/sh", "-c",
                 "ip link set lo up && echo up > " + up_ + " && exec sleep 600"},
                s.path("netns.log")) {}
  bool ready() { return wait_for_file(up_, 20s).has_value(); }
  std::string enter() const { return "--net=/proc/" + std::to_string(holder_.pid()) + "/ns/net"; }

 private:
  std::string up_;
  ChildProcess holder_;
};

enum class Launcher { kReference, kCtrun };

// One launch of a row under one launcher: its agents, started at once.
class Launch {
 public:
  Launch(const Row& row, Launcher which, const ScratchDir& s, const std::string& tag,
         const std::string& port, const std::string& port2, const Netns* netns)
      : dir_(s.path(tag + ".out")), logs_(s.path(tag + ".logs")), tag_(tag), s_(s) {
    fs::create_directories(dir_);
    const Places at{dir_, logs_, port, port2};
    const std::vector<Env> agents = row.agents.empty() ? std::vector<Env>{{}} : row.agents;
    for (std::size_t i = 0; i < agents.size(); ++i) {
      std::vector<std::string> argv;
      if (which == Launcher::kReference) argv = {"/usr/bin/nsenter", netns->enter()};
      for (const char* a : {"/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "HOME=/root",
                            "TEST_SENTINEL_PARENT=FOOBAR"}) {
        argv.push_back(a);
      }
      if (which == Launcher::kCtrun) argv.push_back("PYTHON_EXEC=/usr/bin/python3");
      for (const auto& [k, v] : row.env) argv.push_back(k + "=" + at(v));
      for (const auto& [k, v] : agents[i]) argv.push_back(k + "=" + at(v));
      if (which == Launcher::kReference) {
        argv.push_back("/usr/bin/python3");
        argv.push_back(TORCHRUN_REF_PATH);
      } else {
        argv.push_back(CTRUN_PATH);
      }
      for (const auto& a : row.args) argv.push_back(at(a));
      children_.push_back(std::make_unique<ChildProcess>(argv, log(i)));
    }
  }

  Outcome finish(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<std::optional<int>> exits;
    for (auto& c : children_) {
      const auto left = std::max(std::chrono::milliseconds(0),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                     deadline - std::chrono::steady_clock::now()));
      auto code = c->wait(left);
      if (!code) {  // let the agent stop its workers, then the destructor kills it
        c->signal(SIGTERM);
        c->wait(10s);
      }
      exits.push_back(code);
    }
    Outcome o = collect(dir_, logs_);
    o.exits = exits;
    for (std::size_t i = 0; i < children_.size(); ++i) o.console += read_file(log(i));
    return o;
  }

 private:
  std::string log(std::size_t i) const { return s_.path(tag_ + ".agent" + std::to_string(i)); }

  std::string dir_, logs_, tag_;
  const ScratchDir& s_;
  std::vector<std::unique_ptr<ChildProcess>> children_;
};

bool has_gpu() {
  struct stat st {};
  return ::stat("/dev/nvidiactl", &st) == 0 || ::stat("/dev/nvidia0", &st) == 0;
}

// Mismatches of one row, reported as failures, or as warnings for a known difference.
class Findings {
 public:
  void expect(bool ok, const std::string& what) {
    if (!ok) found_.push_back(what);
  }
  void report(const Row& row, const std::string& consoles) {
    std::ostringstream all;
    for (const auto& f : found_) all << "\n  " << f;
    if (row.known_difference.empty()) {
      if (found_.empty()) return;
      INFO(consoles);
      FAIL_CHECK("row '" << row.name << "' (" << row.source << "):" << all.str());
      return;
    }
    WARN("known difference in row '" << row.name << "': " << row.known_difference << all.str());
    INFO("row '" << row.name << "' is marked known_difference (" << row.known_difference
                 << ") but ran as the row expects: remove the mark");
    CHECK_FALSE(found_.empty());
  }

 private:
  std::vector<std::string> found_;
};

std::string show(const std::set<std::string>& s) {
  std::string out = "{";
  for (const auto& x : s) out += (out.size() > 1 ? "," : "") + x;
  return out + "}";
}

std::string show(const std::optional<int>& code) {
  return code ? std::to_string(*code) : std::string("timeout");
}

// The row's expectations, on one launcher's outcome.
void check_row(const Row& row, const Outcome& o, const std::string& who, int exit_code,
               const Places& at, Findings& f) {
  for (std::size_t i = 0; i < o.exits.size(); ++i) {
    f.expect(o.exits[i] == std::optional<int>(exit_code),
             who + " agent " + std::to_string(i) + " exited " + show(o.exits[i]) + ", expected " +
                 std::to_string(exit_code));
  }
  f.expect(o.names == row.files,
           who + " workers left " + show(o.names) + ", expected " + show(row.files));
  for (const auto& [file, values] : o.ranks) {
    for (const auto& [key, pattern] : row.expect) {
      const std::string want = at(pattern);
      const auto it = values.find(key);
      f.expect(it != values.end() && it->second == want,
               who + " " + file + ": " + key + "=" +
                   (it == values.end() ? std::string("<unset>") : it->second) + ", expected " +
                   want);
    }
  }
  for (const auto& text : row.console) {
    f.expect(o.console.find(text) != std::string::npos, who + " console lacks '" + text + "'");
  }
  for (const auto& [path, text] : row.logs) {
    const auto it = o.logs.find(path);
    f.expect(it != o.logs.end(), who + " wrote no log file <log_dir>/<run>/" + path);
    if (it != o.logs.end()) {
      f.expect(it->second.find(text) != std::string::npos,
               who + " " + path + " lacks '" + text + "'");
    }
  }
  for (const auto& [file, want] : row.attempts) {
    const auto it = o.attempts.find(file);
    f.expect(it != o.attempts.end() && it->second == want,
             who + " " + file + " holds '" +
                 (it == o.attempts.end() ? std::string("<none>") : it->second) + "', expected '" +
                 want + "'");
  }
}

// The same outcome on both launchers, beyond the row's own expectations.
void compare(const Row& row, const Outcome& ref, const Outcome& ours, Findings& f) {
  f.expect(ref.names == ours.names,
           "torchrun's workers left " + show(ref.names) + ", ctrun's " + show(ours.names));
  std::vector<std::string> keys = kSame;
  keys.insert(keys.end(), row.same.begin(), row.same.end());
  for (const auto& [file, theirs] : ref.ranks) {
    const auto mine = ours.ranks.find(file);
    if (mine == ours.ranks.end()) continue;
    std::set<std::string> theirs_keys, mine_keys;
    for (const auto& [k, v] : theirs) theirs_keys.insert(k);
    for (const auto& [k, v] : mine->second) mine_keys.insert(k);
    f.expect(theirs_keys == mine_keys, file + ": torchrun's workers see " + show(theirs_keys) +
                                           ", ctrun's " + show(mine_keys));
    for (const auto& key : keys) {
      const auto a = theirs.find(key);
      const auto b = mine->second.find(key);
      const std::string va = a == theirs.end() ? "<unset>" : a->second;
      const std::string vb = b == mine->second.end() ? "<unset>" : b->second;
      f.expect(va == vb,
               file + ": " + key + " is '" + va + "' under torchrun, '" + vb + "' under ctrun");
    }
  }
  std::set<std::string> ref_logs, our_logs;
  for (const auto& [p, t] : ref.logs) ref_logs.insert(p);
  for (const auto& [p, t] : ours.logs) our_logs.insert(p);
  f.expect(ref_logs == our_logs,
           "log files: torchrun " + show(ref_logs) + ", ctrun " + show(our_logs));
}

// The end of a console, for failure messages.
std::string tail(const std::string& console) {
  constexpr std::size_t kKeep = 4000;
  return console.size() <= kKeep ? console : "..." + console.substr(console.size() - kKeep);
}

void run_rows(const std::vector<Row>& rows) {
  const bool reference = can_unshare_network();
  if (!reference) WARN("reference torchrun skipped: needs root for unshare -n");
  const bool gpu = has_gpu();
  for (const auto& row : rows) {
    if (row.skip_with_gpu && gpu) {
      WARN("row '" << row.name << "' skipped: its expectation assumes a machine with no GPU");
      continue;
    }
    ScratchDir s("conformance");
    const std::string port = std::to_string(free_port());
    const std::string port2 = std::to_string(free_port());
    const bool with_ref = reference && row.ctrun_only.empty();
    std::unique_ptr<Netns> netns;
    if (with_ref) {
      netns = std::make_unique<Netns>(s);
      REQUIRE(netns->ready());
    }
    // Both at once: the reference inside its namespace, ctrun on the host.
    std::unique_ptr<Launch> ref;
    if (with_ref) {
      ref = std::make_unique<Launch>(row, Launcher::kReference, s, "torchrun", port, port2,
                                     netns.get());
    }
    Launch ours(row, Launcher::kCtrun, s, "ctrun", port, port2, nullptr);
    const Outcome mine = ours.finish(120s);
    Findings f;
    // Rank files hold {dir} for the launcher's output directory (collect() normalises it).
    const Places at{"{dir}", "{logs}", port, port2};
    check_row(row, mine, "ctrun", row.ctrun_exit.value_or(row.exit_code), at, f);
    std::string consoles = "ctrun's console:\n" + tail(mine.console);
    if (ref) {
      const Outcome theirs = ref->finish(120s);
      check_row(row, theirs, "torchrun", row.exit_code, at, f);
      compare(row, theirs, mine, f);
      consoles += "\ntorchrun's console:\n" + tail(theirs.console);
    }
    f.report(row, consoles);
  }
}

// ---------------------------------------------------------------------------------------------
// The rows.

std::set<std::string> ranks(int n) {
  std::set<std::string> out;
  for (int i = 0; i < n; ++i) out.insert(std::to_string(i));
  return out;
}

const std::string kTouchDir = "--touch_file_dir={dir}";

// test_run.py: the launches that succeed (underscore spellings: torch 1.13 knows no others; the
// dashed ones of PyTorch main are ctrun-only rows below).
std::vector<Row> test_run_launches() {
  return {
      {.name = "user script python",
       .source = "test_run.py test_launch_user_script_python",
       .args = {"--nnodes=1", "--nproc_per_node=4", "--rdzv_id=4242", "--monitor_interval=1",
                "--start_method=spawn", kTouch, kTouchDir},
       .files = ranks(4),
       .expect = {{"WORLD_SIZE", "4"}, {"TEST_SENTINEL_PARENT", "FOOBAR"}, {"main", "__main__"}}},
      {.name = "user script python caffe2 bc (static master)",
       .source = "test_run.py test_launch_user_script_python_caffe2_bc",
       .args = {"--nnodes=1", "--nproc_per_node=4", "--monitor_interval=1", "--start_method=spawn",
                "--master_addr=localhost", "--master_port={port}", "--node_rank=0", kTouch,
                kTouchDir},
       .files = ranks(4),
       .expect = {{"MASTER_ADDR", "localhost"},
                  {"MASTER_PORT", "{port}"},
                  {"TORCHELASTIC_RUN_ID", "none"},
                  {"TORCHELASTIC_USE_AGENT_STORE", "True"}},
       .same = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}},
      {.name = "user script bash (--no_python)",
       .source = "test_run.py test_launch_user_script_bash",
       .args = {"--nnodes=1", "--nproc_per_node=4", "--rdzv_id=4242", "--monitor_interval=1",
                "--start_method=spawn", "--no_python", kTouchSh, "{dir}"},
       .files = ranks(4),
       .expect = {{"argv", "{dir}"}}},
      {.name = "default nproc_per_node is 1",
       .source = "test_run.py test_launch_user_script_default_nproc",
       .args = {"--nnodes=1", "--rdzv_id=4242", "--monitor_interval=1", "--start_method=spawn",
                "--no_python", kTouchSh, "{dir}"},
       .files = ranks(1),
       .expect = {{"WORLD_SIZE", "1"}}},
      {.name = "options from PET_ variables",
       .source = "test_run.py test_launch_with_env_vars (PET_MODULE=0)",
       .args = {kTouchSh, "{dir}"},
       .env = {{"PET_NNODES", "1"},
               {"PET_NPROC_PER_NODE", "4"},
               {"PET_RDZV_ID", "4242"},
               {"PET_MONITOR_INTERVAL", "1"},
               {"PET_START_METHOD", "spawn"},
               {"PET_NO_PYTHON", "1"},
               {"PET_MODULE", "0"}},
       .files = ranks(4)},
      {.name = "nproc_per_node=4",
       .source = "test_run.py test_nproc_launch_number_configurations",
       .args = {"--nnodes=1", "--nproc_per_node=4", "--rdzv_id=4242", "--no_python", kTouchSh,
                "{dir}"},
       .files = ranks(4),
       .expect = {{"LOCAL_WORLD_SIZE", "4"}}},
      {.name = "nproc_per_node=auto without a GPU is the CPU count",
       .source = "test_run.py test_nproc_launch_auto_configurations",
       .args = {"--nnodes=1", "--nproc_per_node=auto", "--rdzv_id=4242", "--no_python", kTouchSh,
                "{dir}"},
       .files = ranks(static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN))),
       .skip_with_gpu = true},
      {.name = "nproc_per_node=cpu",
       .source = "torch.distributed.run determine_local_world_size (cpu)",
       .args = {"--nnodes=1", "--nproc_per_node=cpu", "--rdzv_id=4242", "--no_python", kTouchSh,
                "{dir}"},
       .files = ranks(static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)))},
      {.name = "elastic 1:2 with one node (rdzv_conf as test_run.py writes it)",
       .source = "test_run.py test_launch_elastic",
       .args = {"--nnodes=1:2", "--nproc_per_node=4", "--rdzv_backend=c10d",
                "--rdzv_endpoint=localhost:{port}",
                "--rdzv_conf='join_timeout=5,last_call_timeout=1,timeout=5'", "--rdzv_id=4242",
                "--monitor_interval=1", "--start_method=spawn", kTouch, kTouchDir},
       .files = ranks(4),
       // torch's test passes the quotes literally: both launchers ignore the keys they cannot
       // use ('join_timeout, and timeout=5', which c10d does not read).
       .expect = {{"TORCHELASTIC_RUN_ID", "4242"}, {"GROUP_WORLD_SIZE", "1"}},
       .same = {"TORCHELASTIC_RUN_ID"}},
      {.name = "elastic 1:2 with one node",
       .source = "test_run.py test_launch_elastic (rdzv_conf without the quotes)",
       .args = {"--nnodes=1:2", "--nproc_per_node=4", "--rdzv_backend=c10d",
                "--rdzv_endpoint=localhost:{port}",
                "--rdzv_conf=join_timeout=5,last_call_timeout=1,timeout=5", "--rdzv_id=4242",
                "--monitor_interval=1", "--start_method=spawn", kTouch, kTouchDir},
       .files = ranks(4),
       .expect = {{"TORCHELASTIC_RUN_ID", "4242"}, {"GROUP_WORLD_SIZE", "1"}},
       .same = {"TORCHELASTIC_RUN_ID"}},
      {.name = "standalone",
       .source = "test_run.py test_launch_standalone",
       .args = {"--nnodes=1", "--nproc_per_node=4", "--standalone", "--monitor_interval=1",
                "--start_method=spawn", kTouch, kTouchDir},
       .files = ranks(4)},
      {.name = "run_path",
       .source = "test_run.py test_launch_run_path",
       .args = {"--run_path", "--nnodes=1", "--nproc_per_node=4", "--monitor_interval=1",
                "--start_method=spawn", kTouch, kTouchDir},
       .files = ranks(4),
       .expect = {{"main", "__main__"}, {"argv", "--touch_file_dir={dir}"}}},
      {.name = "elastic 1:2 with two agents",
       .source = "test_run.py test_launch_elastic_multiple_agents",
       .args = {"--nnodes=1:2", "--nproc_per_node=4", "--rdzv_backend=c10d",
                "--rdzv_endpoint=localhost:{port}", "--rdzv_conf=timeout=5", "--rdzv_id=4242",
                "--monitor_interval=1", "--start_method=spawn", kTouch, kTouchDir},
       .agents = {{}, {}},
       .files = ranks(8),
       .expect = {{"WORLD_SIZE", "8"}, {"GROUP_WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4"}}},
      {.name = "redirects and tee to log_dir",
       .source = "test_run.py test_capture_logs_using_default_logs_specs (--redirect=3 --tee=3)",
       .args = {"--nnodes=1", "--nproc_per_node=2", "--rdzv_id=4242", "--redirect=3", "--tee=3",
                "--log_dir={logs}", "--monitor_interval=1", "--start_method=spawn", kTouch,
                kTouchDir},
       .files = ranks(2),
       .console = {"[default0]:conformance worker rank 0", "[default1]:conformance worker rank 1",
                   "[default0]:conformance stderr rank 0"},
       .logs = {{"attempt_0/0/stdout.log", "conformance worker rank 0 attempt 0"},
                {"attempt_0/1/stdout.log", "conformance worker rank 1 attempt 0"},
                {"attempt_0/0/stderr.log", "conformance stderr rank 0"},
                {"attempt_0/1/stderr.log", "conformance stderr rank 1"}}},
  };
}

// test_run.py: command lines both launchers refuse, and workers that fail.
std::vector<Row> test_run_refusals_and_failures() {
  return {
      {.name = "--no_python with --module is refused",
       .source = "test_run.py test_launch_user_script_bash (assertRaises ValueError)",
       .args = {"--nnodes=1", "--nproc_per_node=4", "--rdzv_id=4242", "--no_python", "--module",
                kTouchSh, "{dir}"},
       .exit_code = 1,
       .ctrun_exit = kRefused},
      {.name = "PET_NO_PYTHON=1 with PET_MODULE=1 is refused",
       .source = "test_run.py test_launch_with_env_vars (PET_MODULE=1)",
       .args = {kTouchSh, "{dir}"},
       .env = {{"PET_NNODES", "1"},
               {"PET_NPROC_PER_NODE", "4"},
               {"PET_RDZV_ID", "4242"},
               {"PET_NO_PYTHON", "1"},
               {"PET_MODULE", "1"}},
       .exit_code = 1,
       .ctrun_exit = kRefused},
      {.name = "nproc_per_node=unknown is refused",
       .source = "test_run.py test_nproc_launch_unknown_configurations",
       .args = {"--nnodes=1", "--nproc_per_node=unknown", "--rdzv_id=4242", "--no_python", kTouchSh,
                "{dir}"},
       .exit_code = 1,
       .ctrun_exit = kRefused},
      {.name = "nproc_per_node=gpu without a GPU is refused",
       .source = "test_run.py test_nproc_gpu_launch_configurations (no GPU here)",
       .args = {"--nnodes=1", "--nproc_per_node=gpu", "--rdzv_id=4242", "--no_python", kTouchSh,
                "{dir}"},
       .exit_code = 1,
       .ctrun_exit = kRefused,
       .skip_with_gpu = true},
      {.name = "nnodes=2:20:30 is refused",
       .source = "test_run.py test_min_max_nodes_parse",
       .args = {"--nnodes=2:20:30", "--nproc_per_node=1", "--rdzv_id=4242", "--no_python", kTouchSh,
                "{dir}"},
       .exit_code = 1,
       .ctrun_exit = kRefused},
      {.name = "a worker raising an exception fails the job",
       .source = "test_run.py test_launch_elastic_worker_raise_exception",
       .args = {"--nnodes=1:2", "--nproc_per_node=4", "--rdzv_backend=c10d",
                "--rdzv_endpoint=localhost:{port}",
                "--rdzv_conf=join_timeout=5,last_call_timeout=1,timeout=5", "--rdzv_id=4242",
                "--monitor_interval=1", "--max_restarts=0", "--start_method=spawn", kTouch,
                "--fail"},
       .exit_code = 1,
       .console = {"RuntimeError: conformance worker rank", "Root Cause (first observed failure)",
                   "touch_rank.py FAILED"}},
      {.name = "max_restarts=2 with a worker that always fails",
       .source = "test_run.py --max-restarts with bin/test_script.py --fail",
       .args = {"--standalone", "--nproc_per_node=1", "--max_restarts=2", "--monitor_interval=1",
                kTouch, kTouchDir, "--fail"},
       .exit_code = 1,
       .console = {"Root Cause (first observed failure)"},
       .attempts = {{"attempts.0", "0\n1\n2\n"}}},
      {.name = "max_restarts=1 with workers that fail once",
       .source = "max_restarts: the job succeeds on its first restart",
       .args = {"--standalone", "--nproc_per_node=2", "--max_restarts=1", "--monitor_interval=1",
                kTouch, kTouchDir, "--fail_until=1"},
       .files = ranks(2),
       .expect = {{"TORCHELASTIC_RESTART_COUNT", "1"}, {"TORCHELASTIC_MAX_RESTARTS", "1"}}},
  };
}

// TorchX's dist.ddp component: `python -m torch.distributed.run` with these options (the 2021
// form with a fixed endpoint and --max_restarts, the current one with localhost:0 for one node,
// --tee 3 and --role '', and $rank0_host:port for several nodes).
std::vector<Row> torchx_rows() {
  return {
      {.name = "dist.ddp (2021) j=1x2",
       .source = "torchx/components/dist.py ddp: --rdzv_backend c10d --rdzv_endpoint "
                 "localhost:29500 --rdzv_id APP --nnodes 1 --nproc_per_node 2 --max_restarts 1",
       .args = {"--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:{port}", "--rdzv_id",
                "app-x1y2", "--nnodes", "1", "--nproc_per_node", "2", "--max_restarts", "1", kTouch,
                "--touch_file_dir", "{dir}", "--lr", "0.1"},
       .env = {{"LOGLEVEL", "INFO"}},
       .files = ranks(2),
       .expect = {{"TORCHELASTIC_RUN_ID", "app-x1y2"},
                  {"TORCHELASTIC_MAX_RESTARTS", "1"},
                  {"argv", "--touch_file_dir {dir} --lr 0.1"}},
       .same = {"TORCHELASTIC_RUN_ID"}},
      {.name = "dist.ddp j=1x2 (localhost:0 with tee 3 and an empty role)",
       .source = "torchx/components/dist.py ddp: --rdzv_endpoint localhost:0 ... --tee 3 --role ''",
       .args = {"--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "--rdzv_id", "app-x1y2",
                "--nnodes", "1", "--nproc_per_node", "2", "--tee", "3", "--role", "", kTouch,
                "--touch_file_dir", "{dir}"},
       .env = {{"LOGLEVEL", "WARNING"}},
       .files = ranks(2),
       .expect = {{"ROLE_NAME", ""}, {"TORCHELASTIC_RUN_ID", "app-x1y2"}},
       .same = {"TORCHELASTIC_RUN_ID"},
       .console = {"[0]:conformance worker rank 0", "[1]:conformance worker rank 1",
                   "[1]:conformance stderr rank 1"}},
      {.name = "dist.ddp -m module j=1x2",
       .source = "torchx/components/dist.py ddp(m=...): ... --tee 3 --role '' -m MODULE ARGS",
       .args = {"--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0", "--rdzv_id", "app-x1y2",
                "--nnodes", "1", "--nproc_per_node", "2", "--tee", "3", "--role", "", "-m",
                "conf_module", "--touch_file_dir", "{dir}", "extra"},
       .env = {{"LOGLEVEL", "WARNING"},
               {"PYTHONPATH", "{scripts}"},
               {"PYTHONDONTWRITEBYTECODE", "1"}},  // no __pycache__ in the tree
       .files = ranks(2),
       .expect = {{"argv", "--touch_file_dir {dir} extra"}, {"main", "touch_rank"}}},
      {.name = "dist.ddp j=2x1 (two nodes at rank 0's host)",
       .source = "torchx/components/dist.py ddp: --rdzv_endpoint $rank0_host:PORT --nnodes 2",
       .args = {"--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:{port}", "--rdzv_id",
                "app-x1y2", "--nnodes", "2", "--nproc_per_node", "1", "--tee", "3", "--role", "",
                kTouch, "--touch_file_dir", "{dir}"},
       .agents = {{}, {}},
       .files = ranks(2),
       .expect = {{"WORLD_SIZE", "2"}, {"GROUP_WORLD_SIZE", "2"}, {"ROLE_NAME", ""}}},
  };
}

// Kubeflow's training-operator: what it puts in each pod's environment for `torchrun SCRIPT`.
std::vector<Row> kubeflow_rows() {
  // A PyTorchJob without an elastic policy (training-operator >= 1.7 with nprocPerNode): the
  // pod's own MASTER_*, WORLD_SIZE (replicas) and RANK (replica index), and PET_* for torchrun.
  const Env pod = {{"PYTHONUNBUFFERED", "0"},
                   {"MASTER_ADDR", "localhost"},
                   {"MASTER_PORT", "{port}"},
                   {"PET_MASTER_ADDR", "localhost"},
                   {"PET_MASTER_PORT", "{port}"}};
  Env one_node = pod;
  one_node.insert(one_node.end(), {{"WORLD_SIZE", "1"},
                                   {"RANK", "0"},
                                   {"PET_NNODES", "1"},
                                   {"PET_NPROC_PER_NODE", "2"},
                                   {"PET_NODE_RANK", "0"}});
  Env two_nodes = pod;
  two_nodes.insert(two_nodes.end(),
                   {{"WORLD_SIZE", "2"}, {"PET_NNODES", "2"}, {"PET_NPROC_PER_NODE", "2"}});
  // An elastic policy: rendezvous variables, nnodes as replicas or MIN:MAX.
  const Env elastic = {{"PYTHONUNBUFFERED", "0"},
                       {"PET_RDZV_ENDPOINT", "localhost:{port}"},
                       {"PET_RDZV_BACKEND", "c10d"},
                       {"PET_NNODES", "2"},
                       {"PET_MAX_RESTARTS", "3"},
                       {"PET_NPROC_PER_NODE", "1"},
                       {"PET_RDZV_ID", "pytorchjob-elastic"}};
  return {
      {.name = "PyTorchJob one pod (static)",
       .source = "training-operator envvar.go/master.go: MASTER_*, WORLD_SIZE, RANK, PET_NNODES, "
                 "PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT",
       .args = {kTouch, kTouchDir},
       .env = one_node,
       .files = ranks(2),
       .expect = {{"WORLD_SIZE", "2"},
                  {"MASTER_ADDR", "localhost"},
                  {"MASTER_PORT", "{port}"},
                  {"PYTHONUNBUFFERED", "0"}},
       .same = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}},
      {.name = "PyTorchJob two pods (static)",
       .source = "training-operator: master and worker pods with PET_NODE_RANK 0 and 1",
       .args = {kTouch, kTouchDir},
       .env = two_nodes,
       .agents = {{{"RANK", "0"}, {"PET_NODE_RANK", "0"}}, {{"RANK", "1"}, {"PET_NODE_RANK", "1"}}},
       .files = ranks(4),
       .expect = {{"WORLD_SIZE", "4"}, {"GROUP_WORLD_SIZE", "2"}, {"MASTER_PORT", "{port}"}},
       .same = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}},
      {.name = "PyTorchJob elastic policy two pods",
       .source = "training-operator elastic.go: PET_RDZV_ENDPOINT, PET_RDZV_BACKEND, PET_NNODES, "
                 "PET_MAX_RESTARTS, PET_NPROC_PER_NODE, PET_RDZV_ID",
       .args = {kTouch, kTouchDir},
       .env = elastic,
       .agents = {{}, {}},
       .files = ranks(2),
       .expect = {{"TORCHELASTIC_RUN_ID", "pytorchjob-elastic"},
                  {"TORCHELASTIC_MAX_RESTARTS", "3"},
                  {"WORLD_SIZE", "2"}},
       .same = {"TORCHELASTIC_RUN_ID"}},
      {.name = "PyTorchJob elastic policy 1:2 with one pod and rdzvConf",
       .source = "training-operator elastic.go: PET_NNODES=MIN:MAX, PET_RDZV_CONF=k=v,k=v",
       .args = {kTouch, kTouchDir},
       .env = {{"PYTHONUNBUFFERED", "0"},
               {"PET_RDZV_ENDPOINT", "localhost:{port}"},
               {"PET_RDZV_BACKEND", "c10d"},
               {"PET_NNODES", "1:2"},
               {"PET_NPROC_PER_NODE", "2"},
               {"PET_RDZV_ID", "pytorchjob-elastic"},
               {"PET_RDZV_CONF", "join_timeout=10,last_call_timeout=1"}},
       .files = ranks(2),
       .expect = {{"GROUP_WORLD_SIZE", "1"}, {"WORLD_SIZE", "2"}}},
      {.name = "PyTorchJob elastic standalone (PET_STANDALONE empty) is refused",
       .source = "training-operator elastic.go: standalone sets PET_STANDALONE to \"\", which "
                 "torchrun reads with int()",
       .args = {kTouch, kTouchDir},
       .env = {{"PET_NNODES", "1"}, {"PET_NPROC_PER_NODE", "1"}, {"PET_STANDALONE", ""}},
       .exit_code = 1,
       .ctrun_exit = kRefused},
      {.name = "PET_N_PROC_PER_NODE of old training-operators is not an option",
       .source = "training-operator <= 1.5 elastic.go: EnvNProcPerNode = PET_N_PROC_PER_NODE",
       .args = {kTouch, kTouchDir},
       .env = {{"PET_RDZV_ENDPOINT", "localhost:{port}"},
               {"PET_RDZV_BACKEND", "c10d"},
               {"PET_NNODES", "1"},
               {"PET_N_PROC_PER_NODE", "3"},
               {"PET_RDZV_ID", "pytorchjob-old"}},
       .files = ranks(1),
       .expect = {{"LOCAL_WORLD_SIZE", "1"}}},
  };
}

// What each torch's own agent gives its workers for NCCL and signals (issue 43): torch 1.13's
// against the reference; torch 2.x's through a stand-in interpreter whose torch says 2.11 (the
// agent asks the workers' Python which torch it has), ctrun only.
std::vector<Row> torch_variable_rows() {
  const std::string torch2 = "torch 1.13's agent gives torch 1.13's variables";
  const Env as_torch2 = {{"PYTHON_EXEC", kScripts + "/torch2_python.sh"}};
  Env user_torch2 = as_torch2;
  user_torch2.emplace_back("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3");
  return {
      {.name = "torch 1.13's workers: NCCL_ASYNC_ERROR_HANDLING=1, nothing of torch 2.x",
       .source = "torch 1.13 local_elastic_agent._start_workers",
       .args = {"--nnodes=1", "--nproc_per_node=2", "--rdzv_id=4242", "--monitor_interval=1",
                kTouch, kTouchDir},
       .files = ranks(2),
       .expect = {{"NCCL_ASYNC_ERROR_HANDLING", "1"},
                  {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "<unset>"},
                  {"TORCHELASTIC_SIGNALS_TO_HANDLE", "<unset>"}}},
      {.name = "torch 1.13's workers keep a user's NCCL_ASYNC_ERROR_HANDLING=0",
       .source = "torch 1.13 local_elastic_agent: os.getenv(NCCL_ASYNC_ERROR_HANDLING, 1)",
       .args = {"--nnodes=1", "--nproc_per_node=2", "--rdzv_id=4242", "--monitor_interval=1",
                kTouch, kTouchDir},
       .env = {{"NCCL_ASYNC_ERROR_HANDLING", "0"}},
       .files = ranks(2),
       .expect = {{"NCCL_ASYNC_ERROR_HANDLING", "0"}}},
      {.name = "torch 2.x's workers: TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and the signals handled, "
               "not the deprecated name",
       .source = "torch main local_elastic_agent._start_workers, launcher/api.py launch_agent",
       .args = {"--nnodes=1", "--nproc_per_node=2", "--rdzv_id=4242", "--monitor_interval=1",
                "--signals_to_handle=SIGTERM,SIGUSR1", kTouch, kTouchDir},
       .env = as_torch2,
       .files = ranks(2),
       .expect = {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
                  {"NCCL_ASYNC_ERROR_HANDLING", "<unset>"},
                  {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGUSR1"}},
       .ctrun_only = torch2},
      {.name = "torch 2.x's workers keep a user's TORCH_NCCL_ASYNC_ERROR_HANDLING=3",
       .source = "torch main local_elastic_agent: os.getenv(TORCH_NCCL_ASYNC_ERROR_HANDLING, 1)",
       .args = {"--nnodes=1", "--nproc_per_node=1", "--rdzv_id=4242", "--monitor_interval=1",
                kTouch, kTouchDir},
       .env = user_torch2,
       .files = ranks(1),
       .expect = {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"},
                  {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"}},
       .ctrun_only = torch2},
  };
}

// PyTorch main's command lines with flags torch 1.13 does not have: ctrun only.
std::vector<Row> newer_flag_rows() {
  const std::string dashed = "torch 1.13 knows only the underscore spellings (main: both)";
  return {
      {.name = "user script python as PyTorch main writes it",
       .source = "test_run.py test_launch_user_script_python (main)",
       .args = {"--nnodes=1", "--nproc-per-node=4", "--rdzv-id=4242", "--monitor-interval=1",
                "--start-method=spawn", kTouch, "--touch-file-dir={dir}"},
       .files = ranks(4),
       .ctrun_only = dashed},
      {.name = "caffe2 bc as PyTorch main writes it",
       .source = "test_run.py test_launch_user_script_python_caffe2_bc (main)",
       .args = {"--nnodes=1", "--nproc-per-node=4", "--monitor-interval=1", "--start-method=spawn",
                "--master-addr=localhost", "--master-port={port}", "--node-rank=0", kTouch,
                "--touch-file-dir={dir}"},
       .files = ranks(4),
       .expect = {{"MASTER_PORT", "{port}"}},
       .ctrun_only = dashed},
      {.name = "logs_specs=default",
       .source = "test_run.py test_is_torchelastic_launched_with_logs_spec_defined",
       .args = {"--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1",
                "--logs_specs=default", kTouch, kTouchDir},
       .files = ranks(1),
       .ctrun_only = "--logs_specs is newer than torch 1.13"},
      {.name = "logs_specs naming no entry point is refused",
       .source = "test_run.py test_logs_logs_spec_entrypoint_must_be_defined",
       .args = {"--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1",
                "--logs_specs=DOESNOT_EXIST", kTouch, kTouchDir},
       .exit_code = kRefused,
       .ctrun_only = "--logs_specs is newer than torch 1.13"},
      {.name = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
       .source = "test_run.py test_capture_logs_using_default_logs_specs (main)",
       .args = {"--nnodes=1", "--nproc-per-node=4", "--rdzv-id=4242", "--redirect=3", "--tee=3",
                "--monitor-interval=1", "--start-method=spawn", "--no-python", kTouchSh, "{dir}"},
       .env = {{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]: "}},
       .files = ranks(4),
       .console = {"[rank0]: creating ", "[rank1]: creating ", "[rank2]: creating ",
                   "[rank3]: creating "},
       .ctrun_only = "the prefix template is read by torchrun 2.2 and later"},
      {.name = "standalone: MASTER_ADDR is the fully qualified host name, as torch 2.x's",
       .source = "torch main dynamic_rendezvous: RendezvousStoreInfo.build, socket.getfqdn()",
       .args = {"--standalone", "--nproc-per-node=2", kTouch, kTouchDir},
       .files = ranks(2),
       .expect = {{"MASTER_ADDR", "{fqdn}"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}},
       .ctrun_only = "torch 1.13 gives localhost and no agent store"},
      {.name = "virtual-local-rank",
       .source = "test_run.py test_virtual_local_rank (without a GPU: the variables only)",
       .args = {"--standalone", "--nproc-per-node=2", "--virtual-local-rank", kTouch, kTouchDir},
       .files = ranks(2),
       .expect = {{"LOCAL_RANK", "0"}},
       .ctrun_only = "--virtual-local-rank is newer than torch 1.13",
       .skip_with_gpu = true},
  };
}

}  // namespace

TEST_CASE("conformance: test_run.py launches under ctrun and torchrun") {
  run_rows(test_run_launches());
}

TEST_CASE("conformance: test_run.py refusals and failing workers under ctrun and torchrun") {
  run_rows(test_run_refusals_and_failures());
}

TEST_CASE("conformance: TorchX dist.ddp command lines under ctrun and torchrun") {
  run_rows(torchx_rows());
}

TEST_CASE("conformance: Kubeflow PyTorchJob PET_ variables under ctrun and torchrun") {
  run_rows(kubeflow_rows());
}

TEST_CASE("conformance: PyTorch main's newer flags (ctrun only)") { run_rows(newer_flag_rows()); }

TEST_CASE("conformance: each torch's NCCL and signal variables for its workers") {
  run_rows(torch_variable_rows());
}

// torch's file timer (issue 43): with TORCHELASTIC_ENABLE_FILE_TIMER=1 the launcher serves the
// pipe it names in TORCHELASTIC_TIMER_FILE, and kills a worker that overruns its timer; the job
// then restarts as after any failure.
TEST_CASE("conformance: the file timer kills a worker that overruns, under both") {
  run_rows({
      {.name = "TORCHELASTIC_ENABLE_FILE_TIMER=1, one overrun",
       .source = "torch local_elastic_agent._setup_local_watchdog, timer/file_based_local_timer.py",
       .args = {"--nnodes=1", "--nproc_per_node=1", "--max_restarts=1", "--monitor_interval=1",
                kFileTimer, "--touch_file_dir={dir}"},
       .env = {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}},
       .files = ranks(1),
       .expect = {{"timer_file_is_pipe", "True"},
                  {"timer_file_name", "watchdog_timer_"},
                  {"TORCHELASTIC_RESTART_COUNT", "1"}},
       .attempts = {{"attempts.0", "0\n1\n"}}},
  });
}

// Scenarios whose workers need torch: is_torchelastic_launched() and init_process_group with
// env:// and tcp:// at the launcher's master port (two workers, not test_run.py's four: each
// imports torch).
TEST_CASE("conformance: torch workers (is_torchelastic_launched and init_method) under both") {
  run_rows({
      {.name = "is_torchelastic_launched",
       .source = "test_run.py test_is_torchelastic_launched",
       .args = {"--run_path", "--nnodes=1", "--nproc_per_node=1", "--monitor_interval=1",
                kIsLaunched, "--out_file={dir}/out"},
       .files = {"out"},
       .expect = {{"content", "True"}}},
      {.name = "init_method tcp:// at the master port",
       .source = "test_run.py test_init_method_tcp_with_torchelastic",
       .args = {"--run_path", "--nnodes=1", "--nproc_per_node=2", "--master_addr=localhost",
                "--master_port={port}", "--monitor_interval=1", kInitMethod,
                "--init_method=tcp://localhost:{port}", "--out_dir={dir}"},
       .files = ranks(2),
       .expect = {{"world_size", "2"}, {"all_reduce_sum", "2"}}},
      {.name = "init_method env://",
       .source = "test_run.py test_init_method_env_with_torchelastic",
       .args = {"--run_path", "--nnodes=1", "--nproc_per_node=2", "--master_addr=localhost",
                "--master_port={port}", "--monitor_interval=1", kInitMethod, "--init_method=env://",
                "--out_dir={dir}"},
       .files = ranks(2),
       .expect = {{"world_size", "2"}, {"all_reduce_sum", "2"}}},
  });
  // The file says True under a launcher (both), and False without one
  // (test_is_not_torchelastic_launched): the check above can tell them apart.
  ScratchDir s("conformance");
  ChildProcess plain({"/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "/usr/bin/python3", kIsLaunched,
                      "--out_file=" + s.path("out")},
                     s.path("plain.log"));
  REQUIRE(plain.wait(60s) == std::optional<int>(0));
  CHECK(read_file(s.path("out")) == "False");
}

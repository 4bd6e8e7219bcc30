// ctrun --hostfile on hosts that are network namespaces, each running Debian's OpenSSH server
// with keys the test makes: the launcher runs in node 0 (the login machine), the hosts are
// nodes 1..N. Needs root and /usr/sbin/sshd; elsewhere the tests say so and check nothing.
// Every process a test leaves in its namespaces is killed by PID when it ends.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <set>
#include <thread>

#include "catch.h"
#include "netns_cluster.h"
#include "process.h"
#include "skip.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

bool have_sshd() { return ::access("/usr/sbin/sshd", X_OK) == 0; }

#define SKIP_WITHOUT_SSH_HOSTS()                                               \
  do {                                                                         \
    if (geteuid() != 0) CTRUN_SKIP("needs root to create network namespaces"); \
    if (!have_sshd()) CTRUN_SKIP("needs /usr/sbin/sshd (openssh-server)");     \
  } while (0)

// node 0 plus `hosts` namespaces with an sshd each (`without_sshd`: node numbers left
// without one: a host that refuses connections).
class SshHosts {
 public:
  explicit SshHosts(int hosts, std::set<int> without_sshd = {})
      : cluster_(hosts + 1, "h"), dir_("ssh_hosts"), nodes_(hosts + 1) {
    if (!cluster_.ok()) return;
    ::mkdir("/run/sshd", 0755);  // sshd's privilege separation directory
    if (!keygen(dir_.path("client"))) return;
    for (int i = 1; i <= hosts; ++i) {
      if (without_sshd.count(i) > 0) continue;
      const std::string n = std::to_string(i);
      if (!keygen(dir_.path("host" + n))) return;
      std::ofstream(dir_.path("sshd" + n + ".conf"))
          << "ListenAddress " << Cluster::address(i) << ":22\n"
          << "HostKey " << dir_.path("host" + n) << "\n"
          << "AuthorizedKeysFile " << dir_.path("client.pub") << "\n"
          << "PermitRootLogin yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
          << "UsePAM no\nStrictModes no\nPidFile none\nMaxStartups 200\n";
      sshd_.push_back(std::make_unique<ChildProcess>(
          cluster_.on(i, {"/usr/sbin/sshd", "-D", "-e", "-f", dir_.path("sshd" + n + ".conf")}),
          dir_.path("sshd" + n + ".log")));
      if (!wait_for_text(dir_.path("sshd" + n + ".log"), "Server listening", 10s)) return;
    }
    ok_ = true;
  }
  ~SshHosts() {
    // Whatever a test left in its hosts (agents, workers, ssh's shared connections), by PID.
    for (int i = 0; i < nodes_; ++i) {
      for (pid_t pid : cluster_.pids(i, dir_.path("pids"))) ::kill(pid, SIGKILL);
    }
  }
  bool ok() const { return ok_; }
  std::string setup_log() const {
    std::string out = cluster_.setup_log();
    for (std::size_t i = 1; i <= sshd_.size(); ++i) {
      out += read_file(dir_.path("sshd" + std::to_string(i) + ".log"));
    }
    return out;
  }
  const Cluster& cluster() const { return cluster_; }
  // The --ssh command: the test's key, no known-hosts file, short timeouts.
  std::string ssh() const {
    return "ssh -F /dev/null -i " + dir_.path("client") +
           " -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
           " -o ConnectTimeout=5 -o ServerAliveInterval=1 -o ServerAliveCountMax=3";
  }
  // ctrun --ssh ... `args` run in node 0 from the directory `cwd`, with TMPDIR there (ssh's
  // shared connections of this test's hosts stay apart from other tests', whose hosts have
  // the same addresses: keep `cwd` short, so that they live under it), logging to `log`.
  std::unique_ptr<ChildProcess> launch(const std::string& cwd, std::vector<std::string> args,
                                       const std::string& log,
                                       std::vector<std::string> env = {}) const {
    std::vector<std::string> argv = {"/usr/bin/env", "-C", cwd, "TMPDIR=" + cwd,
                                     "PYTHON_EXEC=/usr/bin/python3"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.insert(argv.end(), {CTRUN_PATH, "--ssh", ssh()});
    argv.insert(argv.end(), args.begin(), args.end());
    return std::make_unique<ChildProcess>(cluster_.on(0, argv), log);
  }
  // The processes in host `node` other than sshd's own (its listener and sessions).
  std::set<pid_t> job_processes(int node) const {
    std::set<pid_t> out;
    for (pid_t pid : cluster_.pids(node, dir_.path("pids"))) {
      const std::string comm = read_file("/proc/" + std::to_string(pid) + "/comm");
      if (comm.rfind("sshd", 0) != 0 && !comm.empty()) out.insert(pid);
    }
    return out;
  }

 private:
  bool keygen(const std::string& path) {
    ChildProcess k({"/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path},
                   dir_.path("keygen.log"));
    return k.wait(20s) == 0;
  }

  Cluster cluster_;
  ScratchDir dir_;
  int nodes_;
  std::vector<std::unique_ptr<ChildProcess>> sshd_;
  bool ok_ = false;
};

std::string hosts_list(int from, int to, const std::string& slots = "") {
  std::string out;
  for (int i = from; i <= to; ++i) out += (out.empty() ? "" : ",") + Cluster::address(i) + slots;
  return out;
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0; }

// Polls (bounded) until none of `pids` is alive.
bool all_gone(const std::set<pid_t>& pids, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::none_of(pids.begin(), pids.end(), alive)) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

}  // namespace

TEST_CASE("hostfile: a Python gloo DDP job on 2 hosts and a C++ trainer on 3, from one command") {
  SKIP_WITHOUT_SSH_HOSTS();
  SshHosts hosts(3);
  INFO(hosts.setup_log());
  REQUIRE(hosts.ok());
  ScratchDir s("hj");
  {
    // DeepSpeed's hostfile format; PYTHON_EXEC reaches the hosts among the default variables.
    std::ofstream(s.path("hostfile")) << "# two hosts\n"
                                      << Cluster::address(1) << " slots=2\n"
                                      << Cluster::address(2) << " slots=2  # the second\n";
    // GLOO_SOCKET_IFNAME (among the variables sent by default) names gloo's interface: the
    // hosts' name resolves to loopback.
    auto job = hosts.launch(
        s.path(""),
        {"--hostfile", "hostfile", DDP_SCRIPT_PATH, "--epochs", "2", "--samples", "256"},
        s.path("ddp.log"), {"GLOO_SOCKET_IFNAME=eth0"});
    const auto rc = job->wait(240s);
    const std::string out = read_file(s.path("ddp.log"));
    INFO(out);
    REQUIRE(rc);
    CHECK(*rc == 0);
    CHECK(out.find("on 2 hosts (198.18.0.11, 198.18.0.12), --nnodes=2:2") != std::string::npos);
    CHECK(out.find("the job finished on 2 of 2 hosts") != std::string::npos);
    // Each host's lines come with its name in front.
    CHECK(out.find("198.18.0.11: ") != std::string::npos);
    CHECK(out.find("198.18.0.12: ") != std::string::npos);
    CHECK(out.find("done: 2 epochs, world size 4, parameters identical") != std::string::npos);
  }
  {
    auto job = hosts.launch(s.path(""),
                            {"--hosts", hosts_list(1, 3, ":1"), "--log_dir", s.path("logs"),
                             MLP_PATH, "--epochs", "1", "--samples", "768", "--seed", "3"},
                            s.path("mlp.log"));
    const auto rc = job->wait(240s);
    const std::string out = read_file(s.path("mlp.log"));
    INFO(out);
    REQUIRE(rc);
    CHECK(*rc == 0);
    CHECK(out.find("parameters identical on all 3 rank(s)") != std::string::npos);
    // --log_dir: each host's lines on the launching machine, its agent's files beside them.
    for (int i = 1; i <= 3; ++i) {
      const std::string host = Cluster::address(i);
      CHECK(read_file(s.path("logs/" + host + ".log")).find("ctrun: round 0") != std::string::npos);
      struct stat st {};
      CHECK(::stat(s.path("logs/" + host).c_str(), &st) == 0);
    }
  }
}

TEST_CASE("hostfile: a failure on one host is a non-zero exit naming the host and the rank") {
  SKIP_WITHOUT_SSH_HOSTS();
  SshHosts hosts(2);
  INFO(hosts.setup_log());
  REQUIRE(hosts.ok());
  ScratchDir s("hf");
  // Group rank 1's workers exit 3; group rank 0's wait for the job's end.
  auto job = hosts.launch(
      s.path(""),
      {"--hosts", hosts_list(1, 2, ":2"), TEST_WORKER_PATH, "exit_on_group_rank", "1", "3"},
      s.path("job.log"));
  const auto rc = job->wait(120s);
  const std::string out = read_file(s.path("job.log"));
  INFO(out);
  REQUIRE(rc);
  CHECK(*rc == 1);
  // The failing host is the one whose agent had group rank 1.
  std::string failing;
  for (int i = 1; i <= 2; ++i) {
    const std::string prefix = Cluster::address(i) + ": ";
    for (std::size_t at = out.find(prefix); at != std::string::npos;
         at = out.find(prefix, at + 1)) {
      const std::string line = out.substr(at, out.find('\n', at) - at);
      if (line.find("round 0: group rank 1 of 2") != std::string::npos)
        failing = Cluster::address(i);
    }
  }
  REQUIRE_FALSE(failing.empty());
  // Global ranks 2 and 3 are group rank 1's; either may be seen to fail first.
  CHECK(out.find("ctrun: host " + failing + ": its agent exited with code 1 (rank ") !=
        std::string::npos);
  CHECK(out.find("ctrun: the job failed: rank ") != std::string::npos);
  CHECK(out.find("exit code 3") != std::string::npos);
}

TEST_CASE("hostfile: Ctrl-C stops every host's agent and workers, and another job runs on") {
  SKIP_WITHOUT_SSH_HOSTS();
  SshHosts hosts(2);
  INFO(hosts.setup_log());
  REQUIRE(hosts.ok());
  ScratchDir a("ha");
  ScratchDir b("hb");
  // The very same command line in two directories: workers that write their pid and sleep.
  const std::vector<std::string> args = {"--hosts", hosts_list(1, 2, ":2"), TEST_WORKER_PATH,
                                         "until_alone", "pid"};
  auto job_a = hosts.launch(a.path(""), args, a.path("job.log"));
  auto job_b = hosts.launch(b.path(""), args, b.path("job.log"));
  std::set<pid_t> workers_a, workers_b;
  for (int rank = 0; rank < 4; ++rank) {
    for (auto [dir, set] : {std::pair{&a, &workers_a}, std::pair{&b, &workers_b}}) {
      auto pid = wait_for_file(dir->path("pid." + std::to_string(rank)), 60s);
      INFO(read_file(dir->path("job.log")));
      REQUIRE(pid);
      set->insert(std::stoi(*pid));
    }
  }
  // Everything of the jobs on the hosts: both agents, all eight workers.
  std::set<pid_t> before;
  for (int i = 1; i <= 2; ++i) {
    auto p = hosts.job_processes(i);
    before.insert(p.begin(), p.end());
  }
  CHECK(before.size() == 12);

  job_a->signal(SIGINT);
  const auto rc = job_a->wait(60s);
  const std::string out = read_file(a.path("job.log"));
  INFO(out);
  REQUIRE(rc);
  CHECK(*rc == 128 + SIGINT);
  CHECK(out.find("SIGINT: stopping the job on 2 hosts") != std::string::npos);
  CHECK(all_gone(workers_a, 10s));
  // Job B is untouched: its workers, and its agents, run on.
  for (pid_t pid : workers_b) CHECK(alive(pid));
  std::set<pid_t> left;
  for (int i = 1; i <= 2; ++i) {
    auto p = hosts.job_processes(i);
    left.insert(p.begin(), p.end());
  }
  CHECK(left.size() == 6);
  CHECK(std::includes(before.begin(), before.end(), left.begin(), left.end()));

  // A launcher killed outright takes its ssh sessions with it (PR_SET_PDEATHSIG), and the
  // agents' input ends all the same.
  job_b->signal(SIGKILL);
  REQUIRE(job_b->wait(60s));
  CHECK(all_gone(left, 10s));
  CHECK(hosts.job_processes(1).empty());
  CHECK(hosts.job_processes(2).empty());
}

TEST_CASE("hostfile: a host that cannot be reached fails fast with one line naming it") {
  SKIP_WITHOUT_SSH_HOSTS();
  SshHosts hosts(2, {2});  // host 2 has no sshd: connections are refused
  INFO(hosts.setup_log());
  REQUIRE(hosts.ok());
  ScratchDir s("hu");
  struct Case {
    std::string bad_host;
    std::string cause;
  };
  for (const Case& c : {Case{Cluster::address(2), "Connection refused"},
                        Case{"198.18.0.99", "port 22: "},  // nobody there: timeout, no route
                        Case{"no-such-host.invalid", "Could not resolve hostname"}}) {
    INFO(c.bad_host);
    const auto started = std::chrono::steady_clock::now();
    auto job = hosts.launch(
        s.path(""),
        {"--hosts", Cluster::address(1) + "," + c.bad_host, TEST_WORKER_PATH, "sleep", "300"},
        s.path("job.log"));
    const auto rc = job->wait(60s);
    const std::string out = read_file(s.path("job.log"));
    INFO(out);
    REQUIRE(rc);
    CHECK(*rc == 255);
    CHECK(std::chrono::steady_clock::now() - started < 30s);  // ConnectTimeout=5, and the stop
    CHECK(out.find("ctrun: host " + c.bad_host + ": ") != std::string::npos);
    CHECK(out.find(c.cause) != std::string::npos);
    CHECK(out.find("1 of 2 hosts are left, below --nnodes' minimum of 2") != std::string::npos);
    CHECK(hosts.job_processes(1).empty());
    ::unlink(s.path("job.log").c_str());
  }
  // A key the host does not accept. From another directory (TMPDIR): in this one ssh shares
  // the connection the launches above opened to that host, and asks for no key.
  ScratchDir other("hk");
  auto job = hosts.launch(other.path(""),
                          {"--hosts", Cluster::address(1), "--ssh",
                           "ssh -F /dev/null -i /nonexistent/key -o BatchMode=yes -o "
                           "StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                           TEST_WORKER_PATH, "sleep", "300"},
                          other.path("key.log"));
  const auto rc = job->wait(60s);
  const std::string out = read_file(other.path("key.log"));
  INFO(out);
  REQUIRE(rc);
  CHECK(*rc == 255);
  CHECK(out.find("ctrun: host " + Cluster::address(1) + ": ") != std::string::npos);
  CHECK(out.find("Permission denied (publickey") != std::string::npos);
}

TEST_CASE(
    "hostfile: a host whose link is cut is lost, and the elastic job finishes on the others") {
  SKIP_WITHOUT_SSH_HOSTS();
  SshHosts hosts(3);
  INFO(hosts.setup_log());
  REQUIRE(hosts.ok());
  ScratchDir s("hl");
  auto job =
      hosts.launch(s.path(""),
                   {"--hosts", hosts_list(1, 3), "--nnodes", "2:3", "--max_restarts", "0",
                    "--rdzv_conf", "keep_alive_interval=1,keep_alive_max_attempt=2,join_timeout=60",
                    TEST_WORKER_PATH, "until_fewer", "3", "pid"},
                   s.path("job.log"));
  for (int rank = 0; rank < 3; ++rank) {
    INFO(read_file(s.path("job.log")));
    REQUIRE(wait_for_file(s.path("pid." + std::to_string(rank)), 60s));
  }
  const auto cut_host_processes = hosts.job_processes(3);
  REQUIRE(hosts.cluster().set_link(3, false, s.path("ip.log")));
  // The rendezvous drops host 3 and the others re-form without it; their workers, in a round of
  // two nodes, finish, and so does the job, by itself, once ssh's keep-alives end host 3's
  // session (which may come before the re-formed round's end, or after).
  const auto rc = job->wait(90s);
  const std::string out = read_file(s.path("job.log"));
  INFO(out);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(out.find("round 1 formed: 2 nodes") != std::string::npos);
  CHECK(out.find("the job finished on 2 of 3 hosts; lost on the way: 198.18.0.13: ") !=
        std::string::npos);
  // Why it was lost is ssh's word, never the host agent's last log line.
  CHECK(out.find("lost on the way: 198.18.0.13: 20") == std::string::npos);
  // Back on its link, the host's agent learns its session is gone and stops.
  REQUIRE(hosts.cluster().set_link(3, true, s.path("ip.log")));
  CHECK(all_gone(cut_host_processes, 60s));
}

TEST_CASE(
    "hostfile: the variables named, the env file's, the defaults and the slots picked reach the "
    "workers") {
  SKIP_WITHOUT_SSH_HOSTS();
  SshHosts hosts(2);
  INFO(hosts.setup_log());
  REQUIRE(hosts.ok());
  ScratchDir s("he");
  std::ofstream(s.path("vars.env")) << "# sent to every host\nFROM_FILE=a b 'c'\n";
  // Host 1 with its slot 1 alone, host 2 whole: three workers.
  auto job =
      hosts.launch(s.path(""),
                   {"--hosts", hosts_list(1, 2, ":2"), "--include",
                    Cluster::address(1) + ":1@" + Cluster::address(2), "--forward_env",
                    "MY_VAR,PICK_*", "--env_file", "vars.env", TEST_WORKER_PATH, "dumpenv", "env"},
                   s.path("job.log"), {"MY_VAR=1", "PICK_ONE=2", "NCCL_DEBUG=INFO", "NOT_SENT=3"});
  const auto rc = job->wait(120s);
  INFO(read_file(s.path("job.log")));
  REQUIRE(rc);
  CHECK(*rc == 0);
  int narrowed = 0;
  for (int rank = 0; rank < 3; ++rank) {
    auto env = read_env_file(s.path("env." + std::to_string(rank)));
    CHECK(env["WORLD_SIZE"] == "3");
    if (env["LOCAL_WORLD_SIZE"] == "1") {
      CHECK(env["CUDA_VISIBLE_DEVICES"] == "1");
      ++narrowed;
    } else {
      CHECK(env.count("CUDA_VISIBLE_DEVICES") == 0);
    }
    CHECK(env["MY_VAR"] == "1");
    CHECK(env["PICK_ONE"] == "2");
    CHECK(env["NCCL_DEBUG"] == "INFO");
    CHECK(env["FROM_FILE"] == "a b 'c'");
    CHECK(env.count("NOT_SENT") == 0);
  }
  CHECK(narrowed == 1);
}

// bootstrap_bench: the store traffic of a process group's bootstrap, N ranks at once, against
// torch's own TCPStore server and against ctrun's worker store (what an agent hosts, with its
// defaults, for a round of N ranks).
//
// Each run starts a fresh server in a child process (this binary again, with --role), then one
// load generator (tests/common/bootstrap_load.h, in this process) plays all N ranks over N
// connections, from one address or from many of 127.0.0.0/8, with the requests of
// init_process_group under an agent store plus torch's store-based barrier, and times the first
// connect to the last rank through the barrier.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "../common/process.h"
#include "bootstrap_load.h"
#include "ctrun/rendezvous/client.h"
#include "servers.h"

namespace {

using bench::Child;
using bench::Clock;
namespace ts = ctrun::rendezvous::tcpstore;

// tcpstore: torch's c10d::TCPStore server of the LibTorch this is built against (1.13 here:
// torch <= 2.0's numbering; 2.5+ on a GPU machine: its libuv server, VALIDATE and 2.2+'s
// numbering). ctrun: ctrun's worker store, torch <= 2.0's bytes. ctrun_v2: ctrun's worker store
// in torch 2.5+'s bytes (VALIDATE and PING first). torch's server is compared with the ctrun row
// of its own wire.
const std::vector<std::string> kBackends = {"tcpstore", "ctrun", "ctrun_v2"};

const store_bench::TorchServerInfo& torch_info() {
  static const store_bench::TorchServerInfo info = store_bench::torch_server_info();
  return info;
}

// The ctrun row that plays the same bytes as torch's server.
std::string same_wire_as_torch() { return torch_info().validated_wire ? "ctrun_v2" : "ctrun"; }

std::string label(const std::string& backend) {
  if (backend == "tcpstore") {
    return "torch " + torch_info().version + " TCPStore" + (torch_info().libuv ? " (libuv)" : "");
  }
  if (backend == "ctrun") return "ctrun worker store";
  return "ctrun, torch 2.2+ wire";
}

struct Settings {
  std::vector<int> ranks = {1024, 4096, 16384, 65536};
  // Addresses the ranks come from: 1 (one host, or pods behind one SNAT address) and many. From
  // one address at most 64,511 connections reach one port, so larger N come from many only.
  std::vector<int> sources = {1, 256};
  int reps = 3;
  int timeout_s = 120;
  int connect_window = 128;
  bool paced = false;
  std::vector<std::string> backends = kBackends;
};

// The connections one address can open to one port: the load generator picks each source port
// itself from 1024 up (the kernel's own search would stop at net.ipv4.ip_local_port_range).
constexpr int kPortsOfOneAddress = 65535 - 1024;

struct Measurement {
  bool ok = false;
  std::string error;
  double wall_s = 0, connected_s = 0, unique_id_s = 0;
  // The server's peak RSS over the run, less its RSS before it: both servers are this binary,
  // which maps LibTorch (~150 MiB resident) before it serves anything.
  double server_cpu_s = 0, server_growth_mib = 0, generator_cpu_s = 0;
  int connect_retries = 0;
  long requests = 0;
  // SYNs the kernel dropped because the server's accept queue was full (this network namespace's
  // TcpExt ListenOverflows over the run): each costs its rank a 1 s retransmission.
  long listen_overflows = 0;
};

// TcpExt ListenOverflows of the calling process's network namespace; -1 if unreadable.
long read_listen_overflows() {
  std::ifstream in("/proc/net/netstat");
  std::string names, values;
  while (std::getline(in, names) && std::getline(in, values)) {
    if (names.rfind("TcpExt:", 0) != 0) continue;
    std::istringstream n(names), v(values);
    std::string name, value;
    while (n >> name && v >> value) {
      if (name == "ListenOverflows") return std::stol(value);
    }
  }
  return -1;
}

// VmRSS of a live process, in KiB; 0 if unreadable.
long read_vm_rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return 0;
}

std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(buf, static_cast<std::size_t>(n));
}

Measurement measure(const std::string& backend, int ranks, int sources, const Settings& s,
                    const std::string& dir) {
  const std::string role = backend == "tcpstore" ? "tcpstore_server" : "ctrun_server";
  const std::string port_file = dir + "/" + role + ".port";
  std::remove(port_file.c_str());
  Child::Options o;
  o.argv = {self_path(),          "--role", role, "--port_file", port_file, "--round_ranks",
            std::to_string(ranks)};
  o.stderr_path =
      dir + "/" + backend + "-" + std::to_string(ranks) + "-" + std::to_string(sources) + ".log";
  Child server = Child::spawn(o);
  Measurement m;
  auto port = bench::wait_for_port_file(port_file, Clock::now() + std::chrono::seconds(30));
  if (!port) {
    m.error = "the server did not start; see " + o.stderr_path;
    return m;
  }
  const double cpu0 = bench::read_cpu_seconds(server.pid());
  const long rss0_kib = read_vm_rss_kib(server.pid());
  bootstrap_load::LoadOptions load;
  load.port = *port;
  load.ranks = ranks;
  load.source_addresses = sources;
  const bool validated =
      backend == "ctrun_v2" || (backend == "tcpstore" && torch_info().validated_wire);
  load.dialect = validated ? ts::Dialect::kValidated : ts::Dialect::kLegacy;
  load.connect_window = s.connect_window;
  load.paced = s.paced;
  load.timeout = std::chrono::seconds(s.timeout_s);
  const long overflows0 = read_listen_overflows();
  const bootstrap_load::LoadResult r = bootstrap_load::run_bootstrap(load);
  m.listen_overflows = read_listen_overflows() - overflows0;
  m.server_cpu_s = bench::read_cpu_seconds(server.pid()) - cpu0;
  m.server_growth_mib =
      static_cast<double>(bench::read_vm_hwm_kib(server.pid()) - rss0_kib) / 1024.0;
  if (auto exited = server.wait_until(Clock::now()); exited) {
    m.error = "the server exited (status " + std::to_string(*exited) + "); " + r.error;
    return m;
  }
  server.stop();
  m.ok = r.ok;
  m.error = r.error;
  m.wall_s = r.wall_s;
  m.connected_s = r.connected_s;
  m.unique_id_s = r.unique_id_s;
  m.generator_cpu_s = r.generator_cpu_s;
  m.connect_retries = r.connect_retries;
  m.requests = r.requests;
  return m;
}

// Per backend and rank count: the successful runs, or the first failure.
struct Cell {
  std::vector<Measurement> runs;
  std::optional<std::string> failure;
  // The run with the median wall time represents the cell (its phases and CPU go with it).
  const Measurement* median() const {
    if (runs.empty()) return nullptr;
    std::vector<const Measurement*> v;
    for (const auto& m : runs) v.push_back(&m);
    std::sort(v.begin(), v.end(),
              [](const Measurement* a, const Measurement* b) { return a->wall_s < b->wall_s; });
    return v[(v.size() - 1) / 2];
  }
};
// A run's shape: N ranks from this many source addresses.
struct Case {
  int ranks = 0;
  int sources = 1;
  auto operator<=>(const Case&) const = default;
};
using Results = std::map<std::string, std::map<Case, Cell>>;

std::vector<Case> cases_of(const Settings& s) {
  std::vector<Case> out;
  const int ports = kPortsOfOneAddress;
  for (int n : s.ranks) {
    for (int k : s.sources) {
      if (k == 1 && n > ports) continue;  // one address cannot open that many connections
      out.push_back({n, k});
    }
  }
  return out;
}

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s * 1e3);
  return buf;
}

std::string cell_text(const Cell& c) {
  if (c.failure) return "FAILED";
  if (const Measurement* m = c.median()) return ms(m->wall_s);
  return "-";
}

std::string sources_text(int k) { return k == 1 ? "one" : std::to_string(k); }

bool has(const Results& results, const std::string& backend) { return results.count(backend) != 0; }

const Cell& get(const Results& results, const std::string& b, Case c) {
  static const Cell kEmpty;
  auto it = results.find(b);
  if (it == results.end()) return kEmpty;
  auto jt = it->second.find(c);
  return jt == it->second.end() ? kEmpty : jt->second;
}

// torch's server time over ctrun's, when both finished; "-" otherwise.
std::string ratio_text(const Results& results, Case c) {
  const std::string ours = same_wire_as_torch();
  const Cell& a = get(results, "tcpstore", c);
  const Cell& b = get(results, ours, c);
  if (a.failure || b.failure || !a.median() || !b.median()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", a.median()->wall_s / b.median()->wall_s);
  return buf;
}

void print_report(const Results& results, const Settings& s) {
  std::printf(
      "\nbootstrap_bench: the store traffic of init_process_group for N ranks (connect, and for "
      "torch 2.2+'s wire VALIDATE and PING; ADD init/; rank 0 SETs a 128-byte id, the others "
      "WAIT and GET it; barrier: ADD, the last SETs, all WAIT), from one source address or "
      "many of 127.0.0.0/8, one load-generator process, a fresh server per run (ctrun's: an "
      "agent's defaults, a round of N ranks), median of %d; wall time from the first connect to "
      "the last rank through the barrier\n\n",
      s.reps);
  // Columns: torch's server, the ctrun row of its wire with the ratio beside it, the other.
  const std::string same = same_wire_as_torch();
  const std::string other = same == "ctrun" ? "ctrun_v2" : "ctrun";
  const bool torch = has(results, "tcpstore");
  const bool ours = has(results, same);
  const bool rest = has(results, other);
  std::printf("| ranks | from |");
  if (torch) std::printf(" %s (ms) |", label("tcpstore").c_str());
  if (ours) std::printf(" %s (ms) |", label(same).c_str());
  if (torch && ours) std::printf(" ratio |");
  if (rest) std::printf(" %s (ms) |", label(other).c_str());
  std::printf("\n|------:|-----:|");
  if (torch) std::printf("---:|");
  if (ours) std::printf("---:|");
  if (torch && ours) std::printf("------:|");
  if (rest) std::printf("---:|");
  std::printf("\n");
  for (const Case& c : cases_of(s)) {
    std::printf("| %5d | %4s |", c.ranks, sources_text(c.sources).c_str());
    if (torch) std::printf(" %s |", cell_text(get(results, "tcpstore", c)).c_str());
    if (ours) std::printf(" %s |", cell_text(get(results, same, c)).c_str());
    if (torch && ours) std::printf(" %5s |", ratio_text(results, c).c_str());
    if (rest) std::printf(" %s |", cell_text(get(results, other, c)).c_str());
    std::printf("\n");
  }

  std::printf(
      "\nThe median run of each: when the last rank was connected and through the barrier (ms "
      "from the first connect); requests per second; microseconds per rank (the knee is where "
      "it grows); the server's CPU time and the growth of its peak RSS over its RSS before the "
      "run, per connection; the load generator's CPU time (both share the machine's cores); SYNs "
      "dropped for a full accept queue (each costs a 1 s retransmission)\n\n");
  std::printf(
      "| ranks | from | server | connected | barrier | requests/s | us/rank | server CPU (ms) | "
      "server KiB/conn | generator CPU (ms) | SYNs dropped |\n");
  std::printf(
      "|------:|-----:|--------|----------:|--------:|-----------:|--------:|----------------:|"
      "----------------:|-------------------:|-------------:|\n");
  for (const Case& c : cases_of(s)) {
    for (const auto& b : s.backends) {
      const Cell& cell = get(results, b, c);
      const Measurement* m = cell.median();
      if (cell.failure || !m) continue;
      std::printf(
          "| %5d | %4s | %s | %9s | %7s | %10.0f | %7.1f | %15s | %15.1f | %18s | %12ld |\n",
          c.ranks, sources_text(c.sources).c_str(), label(b).c_str(), ms(m->connected_s).c_str(),
          ms(m->wall_s).c_str(), static_cast<double>(m->requests) / m->wall_s,
          m->wall_s * 1e6 / c.ranks, ms(m->server_cpu_s).c_str(),
          m->server_growth_mib * 1024.0 / c.ranks, ms(m->generator_cpu_s).c_str(),
          m->listen_overflows);
    }
  }
  bool any_failure = false;
  for (const auto& b : s.backends) {
    for (const Case& c : cases_of(s)) {
      const Cell& cell = get(results, b, c);
      if (!cell.failure) continue;
      if (!any_failure) std::printf("\nFailures:\n");
      any_failure = true;
      std::printf("- %s, %d ranks from %s: %s\n", label(b).c_str(), c.ranks,
                  sources_text(c.sources).c_str(), cell.failure->c_str());
    }
  }
  if (std::any_of(s.ranks.begin(), s.ranks.end(), [](int n) { return n > kPortsOfOneAddress; })) {
    std::printf(
        "\nFrom one address at most %d connections reach one port (source ports 1024-65535): "
        "larger N come from many addresses only.\n",
        kPortsOfOneAddress);
  }

  if (torch && ours) {
    std::printf("\ntargets:");
    // torch 1.13's server: 2x at 4096 ranks; torch 2.x's libuv server: 2x at 4096 and 16,384.
    const bool torch2 = torch_info().validated_wire;
    for (int n : s.ranks) {
      if (n != 4096 && !(torch2 && n == 16384)) continue;
      const Case c{n, 1};
      const Cell& a = get(results, "tcpstore", c);
      const Cell& b = get(results, same, c);
      std::printf(" >= 2x torch %s's server at %d ranks from one address: ",
                  torch_info().version.c_str(), n);
      if (b.failure || !b.median()) {
        std::printf("MISSED (ctrun failed);");
      } else if (a.failure) {
        std::printf("MET (torch's server failed);");
      } else if (a.median()) {
        const double ratio = a.median()->wall_s / b.median()->wall_s;
        std::printf("%.2fx %s;", ratio, ratio >= 2 ? "MET" : "MISSED");
      }
    }
    for (const Case& c : cases_of(s)) {
      if (c.ranks != 65536) continue;
      const Cell& b = get(results, same, c);
      const Measurement* m = b.median();
      std::printf(" 65536 ranks (from %s) within 5 s: %s;", sources_text(c.sources).c_str(),
                  b.failure        ? "MISSED (failed)"
                  : !m             ? "NOT RUN (the open-file limit, above)"
                  : m->wall_s <= 5 ? ("MET, " + ms(m->wall_s) + " ms").c_str()
                                   : ("MISSED, " + ms(m->wall_s) + " ms").c_str());
    }
    bool failed = false;
    for (const Case& c : cases_of(s)) failed |= get(results, same, c).failure.has_value();
    std::printf(" every N run served by ctrun: %s\n", failed ? "MISSED" : "MET");
  }
}

std::string json_escape(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) >= 0x20) out += ch;
  }
  return out;
}

void write_json(const Results& results, const Settings& s, const std::string& path) {
  std::ofstream out(path);
  for (const auto& b : s.backends) {
    for (const Case& c : cases_of(s)) {
      auto it = results.find(b);
      if (it == results.end() || !it->second.count(c)) continue;
      const Cell& cell = it->second.at(c);
      const Measurement* m = cell.median();
      out << "{\"backend\": \"" << b << "\", \"ranks\": " << c.ranks
          << ", \"sources\": " << c.sources
          << ", \"ok\": " << (cell.failure || !m ? "false" : "true");
      if (cell.failure) out << ", \"error\": \"" << json_escape(*cell.failure) << "\"";
      if (m && !cell.failure) {
        out << ", \"wall_s\": " << m->wall_s << ", \"connected_s\": " << m->connected_s
            << ", \"unique_id_s\": " << m->unique_id_s << ", \"server_cpu_s\": " << m->server_cpu_s
            << ", \"server_growth_mib\": " << m->server_growth_mib
            << ", \"requests\": " << m->requests;
      }
      out << "}\n";
    }
  }
}

int orchestrate(const Settings& s, const std::string& json_out) {
  bench::install_cleanup_handlers();
  // The load generator holds a descriptor per rank, and so does each server: both run with the
  // most this machine allows (as root, 1,048,576, what the packaged ctrund unit sets).
  const long nofile = bench::raise_nofile_limit();
  const std::string dir = bench::make_temp_dir("bootstrap_bench.");
  std::vector<Case> cases;
  for (const Case& c : cases_of(s)) {
    if (c.ranks + 64L <= nofile) {
      cases.push_back(c);
    } else {  // a machine whose hard limit no process here may pass
      std::printf(
          "%d ranks: not run, the open-file limit here is %ld (hard, and no "
          "CAP_SYS_RESOURCE to raise it): one process cannot hold %d connections\n",
          c.ranks, nofile, c.ranks);
    }
  }
  Results results;
  bool ours_failed = false;
  for (int rep = 0; rep < s.reps; ++rep) {
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const Case c = cases[i];
      for (std::size_t k = 0; k < s.backends.size(); ++k) {
        // Rotate the order, so bursts of load from others on a shared machine fall on all alike.
        const std::string& b =
            s.backends[(k + i + static_cast<std::size_t>(rep)) % s.backends.size()];
        Cell& cell = results[b][c];
        if (cell.failure) continue;  // failed once here: reported, not retried
        Measurement m;
        try {
          m = measure(b, c.ranks, c.sources, s, dir);
        } catch (const std::exception& e) {
          m.error = e.what();
        }
        if (!m.ok) {
          std::fprintf(stderr, "rep %d %-22s %5d ranks from %s: FAILED: %s\n", rep + 1,
                       label(b).c_str(), c.ranks, sources_text(c.sources).c_str(), m.error.c_str());
          cell.failure = m.error;
          if (b != "tcpstore") ours_failed = true;
          continue;
        }
        const std::string retries =
            m.connect_retries ? ", " + std::to_string(m.connect_retries) + " connect retries" : "";
        std::fprintf(stderr,
                     "rep %d %-22s %5d ranks from %s: %8.1f ms (connected %.1f, id %.1f), server "
                     "cpu %.0f ms, +%.1f MiB, %ld SYNs dropped%s\n",
                     rep + 1, label(b).c_str(), c.ranks, sources_text(c.sources).c_str(),
                     m.wall_s * 1e3, m.connected_s * 1e3, m.unique_id_s * 1e3, m.server_cpu_s * 1e3,
                     m.server_growth_mib, m.listen_overflows, retries.c_str());
        cell.runs.push_back(m);
      }
    }
  }
  print_report(results, s);
  if (!json_out.empty()) write_json(results, s, json_out);
  if (!ours_failed) bench::remove_tree(dir);  // else its server logs stay
  // Out without static destructors: LibTorch 2.11's crash at exit (SIGSEGV, seen on a GPU
  // machine) lost the buffered report of a finished run.
  std::fflush(nullptr);
  std::_Exit(ours_failed ? 1 : 0);
}

// --restarts: a job restarted again and again on one agent's store. A node of `ranks` workers
// joins (this process, as an agent does), the ranks bootstrap and go, the node joins again (a
// restart: a new round), and so on; the server's RSS and the job's key count are read every so
// many restarts. Flat is the goal: a round's keys go once nothing can read them.
int run_restarts(int restarts, int ranks, const std::string& dir) {
  namespace rdzv = ctrun::rendezvous;
  bench::install_cleanup_handlers();
  const std::string port_file = dir + "/restarts.port";
  Child::Options o;
  o.argv = {self_path(), "--role", "ctrun_server", "--port_file", port_file, "--round_ranks", "0"};
  o.stderr_path = dir + "/restarts.log";
  Child server = Child::spawn(o);
  auto port = bench::wait_for_port_file(port_file, Clock::now() + std::chrono::seconds(30));
  if (!port) {
    std::cerr << "bootstrap_bench: the server did not start; see " << o.stderr_path << "\n";
    return 1;
  }
  rdzv::ClientOptions co;
  co.host = "127.0.0.1";
  co.port = static_cast<std::uint16_t>(*port);
  co.job = "bootstrap";
  auto node = rdzv::Client::connect(co);
  if (!node) {
    std::cerr << "bootstrap_bench: " << node.error().message << "\n";
    return 1;
  }
  const long rss0 = read_vm_rss_kib(server.pid());
  std::printf(
      "\nbootstrap_bench --restarts: one agent's store, a job of %d ranks restarted %d times "
      "(each round: a node joins, its ranks bootstrap and leave); the server's RSS and the "
      "job's keys\n\n| restarts | server RSS (MiB) | growth since start (MiB) | keys in the "
      "store |\n|---------:|-----------------:|-------------------------:|------------------:|\n",
      ranks, restarts);
  for (int r = 1; r <= restarts; ++r) {
    auto joined = node.value()->call({{"op", "join"},
                                      {"node", "node0"},
                                      {"host", "127.0.0.1"},
                                      {"master_port", *port},
                                      {"min_nodes", 1},
                                      {"max_nodes", 1},
                                      {"local_world_size", ranks}},
                                     std::chrono::seconds(30));
    if (!joined) {
      std::cerr << "bootstrap_bench: restart " << r << ": " << joined.error().message << "\n";
      return 1;
    }
    bootstrap_load::LoadOptions load;
    load.port = *port;
    load.ranks = ranks;
    load.dialect = ts::Dialect::kValidated;
    load.timeout = std::chrono::seconds(30);
    const auto result = bootstrap_load::run_bootstrap(load);
    if (!result.ok) {
      std::cerr << "bootstrap_bench: restart " << r << ": " << result.error << "\n";
      return 1;
    }
    if (r == 1 || r % (restarts / 10 > 0 ? restarts / 10 : 1) == 0) {
      const long rss = read_vm_rss_kib(server.pid());
      const auto keys = node.value()->num_keys();
      std::printf("| %8d | %16.1f | %24.1f | %17lld |\n", r, static_cast<double>(rss) / 1024.0,
                  static_cast<double>(rss - rss0) / 1024.0,
                  keys ? static_cast<long long>(keys.value()) : -1LL);
      std::fflush(stdout);
    }
  }
  server.stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "bootstrap_bench: process-group bootstrap traffic, ctrun's worker store vs torch's "
      "TCPStore"};
  Settings s;
  std::string role, port_file, json_out;
  int round_ranks = 1;
  bool quick = false;
  app.add_option("--role", role, "internal: tcpstore_server | ctrun_server");
  app.add_option("--port_file", port_file);
  app.add_option("--round_ranks", round_ranks, "internal: the ctrun server's round size");
  app.add_option("--sources", s.sources,
                 "source address counts to run (1: one address; more: 127.1.x.y)")
      ->delimiter(',');
  app.add_option("--ranks", s.ranks, "rank counts")->delimiter(',');
  app.add_option("--reps", s.reps, "repetitions (the median is reported)");
  app.add_option("--timeout_s", s.timeout_s, "per run: a server that cannot finish FAILS");
  app.add_option("--connect_window", s.connect_window, "connects in flight at once");
  app.add_flag("--paced", s.paced,
               "diagnostic: a rank counts against --connect_window until its first answer, so "
               "the server's accept queue stays short");
  app.add_option("--backends", s.backends, "of tcpstore, ctrun, ctrun_v2")->delimiter(',');
  app.add_flag("--quick", quick, "one repetition");
  int restarts = 0, restart_ranks = 64;
  app.add_option("--restarts", restarts,
                 "instead: restart a job this many times on one store and follow its memory");
  app.add_option("--restart_ranks", restart_ranks, "with --restarts: the job's ranks");
  app.add_option("--json_out", json_out, "also write one row per backend and N as JSON lines");
  CLI11_PARSE(app, argc, argv);

  if (role == "tcpstore_server") {
    bench::die_with_parent();
    return store_bench::run_tcpstore_server(port_file);
  }
  if (role == "ctrun_server") {
    bench::die_with_parent();
    return bootstrap_bench::run_ctrun_server(port_file, round_ranks);
  }
  if (!role.empty()) {
    std::cerr << "bootstrap_bench: unknown role '" << role << "'\n";
    return 2;
  }
  for (const auto& b : s.backends) {
    if (std::find(kBackends.begin(), kBackends.end(), b) == kBackends.end()) {
      std::cerr << "bootstrap_bench: unknown backend '" << b << "'\n";
      return 2;
    }
  }
  if (!torch_info().supported &&
      std::find(s.backends.begin(), s.backends.end(), "tcpstore") != s.backends.end()) {
    std::cerr << "bootstrap_bench: torch " << torch_info().version
              << "'s TCPStore speaks a numbering the load generator does not play (it plays "
                 "torch <= 2.0's and 2.5+'s): leave tcpstore out of --backends\n";
    return 2;
  }
  if (s.ranks.empty() || *std::min_element(s.ranks.begin(), s.ranks.end()) < 1 || s.reps < 1 ||
      s.sources.empty() || *std::min_element(s.sources.begin(), s.sources.end()) < 1 ||
      *std::max_element(s.sources.begin(), s.sources.end()) > 254 * 254 || s.connect_window < 1 ||
      s.timeout_s < 1) {
    std::cerr
        << "bootstrap_bench: --ranks, --sources, --reps, --connect_window and --timeout_s must be "
           "positive (--sources at most 64516)\n";
    return 2;
  }
  if (quick) s.reps = 1;
  if (restarts > 0) {
    if (restart_ranks < 1 || restart_ranks > 4096) {
      std::cerr << "bootstrap_bench: --restart_ranks must be 1..4096\n";
      return 2;
    }
    const std::string dir = bench::make_temp_dir("bootstrap_bench.");
    const int code = run_restarts(restarts, restart_ranks, dir);
    if (code == 0) bench::remove_tree(dir);
    return code;
  }
  std::sort(s.ranks.begin(), s.ranks.end());
  return orchestrate(s, json_out);
}

// store_bench: key-value throughput and latency of ctrund against PyTorch's TCPStore.
//
// The orchestrator (no role flag) starts each server and N client processes by re-executing
// this binary with --role, releases the clients at once, and collects one result line from
// each. Servers and clients are separate processes, as they are in a real job.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>

#include "../common/process.h"
#include "../common/stats.h"
#include "client_role.h"
#include "report.h"
#include "store_client.h"

namespace {

using bench::Child;
using bench::Clock;
using store_bench::ClientResult;
using store_bench::ClientSpec;
using store_bench::Measurement;

struct Settings {
  std::string ctrund = CTRUND_PATH;
  std::vector<int> clients = {1, 4, 16};
  int reps = 5;
  int duration_ms = 1000;
  int value_bytes = 32;
  // ctrun_posted: the same Client, its sets through post_set. ctrun_raw: a diagnostic (see
  // raw_client.cc), not part of the comparison the issue asks for.
  std::vector<std::string> backends = {"ctrun", "tcpstore", "ctrun_posted", "ctrun_raw"};
};

std::string self_path() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(buf, static_cast<std::size_t>(n));
}

// A server process and the port it listens on.
struct Server {
  Child process;
  int port = 0;
};

Server start_server(const std::string& backend, const Settings& s, const std::string& dir) {
  const std::string port_file = dir + "/" + backend + ".port";
  std::remove(port_file.c_str());
  Child::Options o;
  o.stderr_path = dir + "/" + backend + ".log";
  if (backend != "tcpstore") {
    o.argv = {s.ctrund, "--host", "127.0.0.1", "--port", "0", "--port_file", port_file};
  } else {
    o.argv = {self_path(), "--role", "tcpstore_server", "--port_file", port_file};
  }
  Server server{Child::spawn(o), 0};
  auto port = bench::wait_for_port_file(port_file, Clock::now() + std::chrono::seconds(30));
  if (!port)
    throw std::runtime_error(backend + " server did not report a port; see " + o.stderr_path);
  server.port = *port;
  return server;
}

Measurement measure(const std::string& backend, const Server& server, int nclients,
                    const Settings& s, const std::string& dir) {
  const int port = server.port;
  bench::Pipe go = bench::Pipe::create();
  std::vector<Child> clients;
  for (int i = 0; i < nclients; ++i) {
    Child::Options o;
    o.argv = {self_path(),
              "--role",
              "client",
              "--backend",
              backend,
              "--port",
              std::to_string(port),
              "--index",
              std::to_string(i),
              "--duration_ms",
              std::to_string(s.duration_ms),
              "--value_bytes",
              std::to_string(s.value_bytes)};
    o.stdin_fd = go.read_fd;
    o.capture_stdout = true;
    o.stderr_path = dir + "/clients.log";
    clients.push_back(Child::spawn(o));
  }
  go.close_read();
  const auto ready_deadline = Clock::now() + std::chrono::seconds(60);
  for (auto& c : clients) {
    auto line = c.read_line(ready_deadline);
    if (line != "ready")
      throw std::runtime_error(backend + " client not ready; see " + dir + "/clients.log");
  }
  const double server_cpu_start = bench::read_cpu_seconds(server.process.pid());
  go.close_write();  // EOF on every client's stdin: start

  const auto done_deadline =
      Clock::now() + std::chrono::milliseconds(s.duration_ms) + std::chrono::seconds(60);
  Measurement m;
  double ops = 0, client_cpu = 0;
  std::vector<ClientResult> results;
  for (auto& c : clients) {
    auto line = c.read_line(done_deadline);
    ClientResult r;
    if (!line || !store_bench::parse_result(*line, r)) {
      throw std::runtime_error(backend + " client gave no result; see " + dir + "/clients.log");
    }
    m.ops_per_s += 2.0 * static_cast<double>(r.pairs) / r.elapsed_s;
    ops += 2.0 * static_cast<double>(r.pairs);
    client_cpu += r.cpu_s;
    results.push_back(r);
  }
  // Ends a little after the clients do (collecting their lines): an upper bound.
  const double server_cpu = bench::read_cpu_seconds(server.process.pid()) - server_cpu_start;
  m.client_cpu_us = 1e6 * client_cpu / ops;
  m.server_cpu_us = 1e6 * server_cpu / ops;
  for (auto& c : clients) c.wait_until(Clock::now() + std::chrono::seconds(10));
  // Latencies: the median over clients of each client's quantile.
  std::vector<double> p50, p99, s50;
  for (const auto& r : results) {
    p50.push_back(r.get_p50_us);
    p99.push_back(r.get_p99_us);
    s50.push_back(r.set_p50_us);
  }
  m.get_p50_us = bench::median(p50);
  m.get_p99_us = bench::median(p99);
  m.set_p50_us = bench::median(s50);
  return m;
}

int orchestrate(const Settings& s) {
  bench::install_cleanup_handlers();
  const std::string dir = bench::make_temp_dir("store_bench.");
  const std::vector<std::string>& backends = s.backends;
  store_bench::Results results;
  try {
    for (int rep = 0; rep < s.reps; ++rep) {
      std::map<std::string, Server>
          servers;  // all alive for the whole repetition, idle when not measured
      for (const auto& backend : backends) servers.emplace(backend, start_server(backend, s, dir));
      for (std::size_t i = 0; i < s.clients.size(); ++i) {
        const int n = s.clients[i];
        for (std::size_t b = 0; b < backends.size(); ++b) {
          // Interleave finely and rotate the order, so bursts of load from others on this shared
          // machine fall on every side alike.
          const std::string& backend =
              backends[(b + i + static_cast<std::size_t>(rep)) % backends.size()];
          Measurement m = measure(backend, servers.at(backend), n, s, dir);
          std::fprintf(stderr,
                       "rep %d %-9s %2d clients: %9.0f ops/s  get p50 %.1f us p99 %.1f us\n",
                       rep + 1, backend.c_str(), n, m.ops_per_s, m.get_p50_us, m.get_p99_us);
          results[backend][n].push_back(m);
        }
      }
      for (auto& [backend, server] : servers) server.process.stop();
    }
  } catch (const std::exception& e) {
    std::cerr << "store_bench: " << e.what() << "\n";
    return 1;  // the temp dir stays for its logs
  }
  bench::remove_tree(dir);
  print_report(results, store_bench::ReportInfo{s.clients, s.value_bytes, s.duration_ms, s.reps});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"store_bench: ctrund vs TCPStore key-value throughput and latency"};
  Settings s;
  std::string role;
  ClientSpec client;
  std::string port_file;
  bool quick = false;
  app.add_option("--role", role, "internal: client | tcpstore_server");
  app.add_option("--ctrund", s.ctrund, "path of the ctrund binary");
  app.add_option("--clients", s.clients, "client process counts")->delimiter(',');
  app.add_option("--reps", s.reps, "repetitions (the median is reported)");
  app.add_option("--duration_ms", s.duration_ms, "length of each run");
  app.add_option("--value_bytes", s.value_bytes, "value size");
  app.add_flag("--quick", quick, "one short repetition");
  app.add_option("--backends", s.backends,
                 "of ctrun, tcpstore, ctrun_posted, ctrun_raw (the tables need the first two)")
      ->delimiter(',');
  app.add_option("--backend", client.backend);
  app.add_option("--port", client.port);
  app.add_option("--index", client.index);
  app.add_option("--port_file", port_file);
  CLI11_PARSE(app, argc, argv);

  if (role == "client") {
    bench::die_with_parent();
    client.duration_ms = s.duration_ms;
    client.value_bytes = s.value_bytes;
    return store_bench::run_client(client);
  }
  if (role == "tcpstore_server") {
    bench::die_with_parent();
    return store_bench::run_tcpstore_server(port_file);
  }
  if (!role.empty()) {
    std::cerr << "store_bench: unknown role '" << role << "'\n";
    return 2;
  }
  if (quick) {
    s.reps = 1;
    s.duration_ms = std::min(s.duration_ms, 500);
  }
  std::sort(s.clients.begin(), s.clients.end());
  return orchestrate(s);
}

// backend_rdzv_bench: one rendezvous round of N nodes through the agent's Backend interface, on
// ctrund, on ctrund over mutual TLS (ctrund-tls), on etcd and on etcd over TLS with client
// certificates (etcd-tls), side by side. Each run starts a fresh ctrund or a fresh single-member
// etcd (default settings, data on disk); one
// single-threaded process plays all N nodes, each with its own Backend as an agent has (its own
// connection, lease, watch), as the agents would on N hosts. The time is from the first join() to
// the last join() returning its assignment.
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <boost/asio.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "../common/process.h"
#include "ctrun/rendezvous/client.h"
#include "rendezvous/backend/backend.h"
#include "rendezvous/etcd/etcd.h"
#include "test_certs.h"

namespace {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;
using bench::Child;
using bench::Clock;

constexpr auto kStartTimeout = std::chrono::seconds(60);
constexpr auto kJoinTimeout = std::chrono::seconds(240);

struct Row {
  std::string backend;
  int nodes = 0;
  double join_wall_s = 0;
  double first_s = 0;          // first join() returned
  double nodes_cpu_s = 0;      // this process (all N nodes) during the joins
  double service_cpu_s = 0;    // ctrund or etcd, its whole life
  double service_hwm_mib = 0;  // its peak resident memory
};

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw std::runtime_error("no free port");
  }
  close(fd);
  return ntohs(a.sin_port);
}

bool accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

double own_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// A fresh service for one run: ctrund on a port of its choosing, or a one-member etcd.
struct Service {
  Child process;
  std::string log;
  int port = 0;
};

// The TLS sides' certificates, made once per bench run (EC P-256, as a cluster's would be).
struct Pki {
  ctrun::testing::CertFiles ca, server, client;
};
Pki make_pki(const std::string& dir) {
  Pki p;
  p.ca = ctrun::testing::make_ca(dir, "ca");
  p.server = ctrun::testing::issue_cert(dir, p.ca, {"server", {"127.0.0.1"}});
  p.client = ctrun::testing::issue_cert(dir, p.ca, {"client", {}, true});
  return p;
}

std::optional<Service> start_service(const std::string& backend, const std::string& ctrund,
                                     const std::string& etcd, const std::string& dir, int run,
                                     const Pki& pki) {
  Service s;
  s.log = dir + "/" + backend + "-" + std::to_string(run) + ".log";
  Child::Options o;
  o.stderr_path = s.log;
  if (backend == "ctrund" || backend == "ctrund-tls") {
    const std::string port_file = dir + "/ctrund.port";
    std::remove(port_file.c_str());
    // Every node connects from 127.0.0.1: the per-host limit must fit them all.
    o.argv = {ctrund,   "--host",      "127.0.0.1", "--port",
              "0",      "--port_file", port_file,   "--max_connections_per_host",
              "1048576"};
    if (backend == "ctrund-tls") {
      o.argv.insert(o.argv.end(), {"--tls_cert", pki.server.cert, "--tls_key", pki.server.key,
                                   "--tls_client_ca", pki.ca.cert});
    }
    s.process = Child::spawn(o);
    auto port = bench::wait_for_port_file(port_file, Clock::now() + kStartTimeout);
    if (!port) return std::nullopt;
    s.port = *port;
    return s;
  }
  s.port = free_port();
  const int peer = free_port();
  const bool tls = backend == "etcd-tls";
  const std::string client_url =
      std::string(tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(s.port);
  const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
  o.argv = {etcd,
            "--name=bench",
            "--data-dir=" + dir + "/etcd-" + std::to_string(run),
            "--listen-client-urls=" + client_url,
            "--advertise-client-urls=" + client_url,
            "--listen-peer-urls=" + peer_url,
            "--initial-advertise-peer-urls=" + peer_url,
            "--initial-cluster=bench=" + peer_url,
            "--logger=zap",
            "--log-level=error"};
  if (tls) {
    o.argv.insert(o.argv.end(), {"--cert-file=" + pki.server.cert, "--key-file=" + pki.server.key,
                                 "--client-cert-auth", "--trusted-ca-file=" + pki.ca.cert});
  }
  s.process = Child::spawn(o);
  const auto deadline = Clock::now() + kStartTimeout;
  while (!accepts(s.port)) {
    if (Clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return s;
}

std::unique_ptr<rdzv::Backend> make_node(asio::io_context& io, const std::string& backend, int port,
                                         const std::string& job, const Pki& pki) {
  if (backend == "ctrund" || backend == "ctrund-tls") {
    rdzv::ClientOptions o;
    o.host = "127.0.0.1";
    o.port = static_cast<std::uint16_t>(port);
    o.job = job;
    o.connect_timeout = kStartTimeout;
    if (backend == "ctrund-tls") {
      o.tls = rdzv::TlsClientFiles{pki.ca.cert, pki.client.cert, pki.client.key};
    }
    return rdzv::make_ctrund_backend(io, o);
  }
  rdzv::BackendSpec o;
  o.service = rdzv::BackendSpec::Service::kEtcd;
  o.endpoints = {rdzv::Endpoint{"127.0.0.1", static_cast<std::uint16_t>(port)}};
  o.job = job;
  o.connect_timeout = kStartTimeout;
  o.lease_ttl = std::chrono::seconds(15);
  if (backend == "etcd-tls") {
    o.access.tls = rdzv::TlsClientFiles{pki.ca.cert, pki.client.cert, pki.client.key};
  }
  return rdzv::make_etcd_backend(io, o);
}

// Runs `io` until `done()` or the deadline.
bool run_until(asio::io_context& io, const std::function<bool()>& done, Clock::time_point until) {
  io.restart();
  while (!done()) {
    if (Clock::now() > until) return false;
    io.run_for(std::chrono::milliseconds(5));
    io.restart();
  }
  return true;
}

std::optional<Row> run_once(const std::string& backend, int nodes, const Service& service, int run,
                            const Pki& pki, std::string& error) {
  asio::io_context io;
  const std::string job = "bench-" + std::to_string(run);
  std::vector<std::unique_ptr<rdzv::Backend>> all;
  for (int i = 0; i < nodes; ++i) all.push_back(make_node(io, backend, service.port, job, pki));

  // Untimed: every node reaches the service and starts its keep-alives, as an agent does.
  int connected = 0;
  for (auto& node : all) {
    asio::co_spawn(io, node->connect(), [&](std::exception_ptr e, rdzv::Status s) {
      if (e || !s) error = e ? "connect threw" : s.error().message;
      ++connected;
    });
  }
  if (!run_until(
          io, [&] { return connected == nodes; }, Clock::now() + kStartTimeout) ||
      !error.empty()) {
    if (error.empty()) error = "connects did not finish in time";
    return std::nullopt;
  }
  for (auto& node : all) node->start_keep_alive(std::chrono::seconds(5), 3);

  rdzv::RendezvousConfig config;
  config.min_nodes = config.max_nodes = nodes;
  config.join_timeout = kJoinTimeout;
  std::vector<std::optional<rdzv::RoundAssignment>> assigned(nodes);
  std::vector<Clock::time_point> returned(nodes);
  int answered = 0;
  const double cpu_before = own_cpu_seconds();
  const auto t0 = Clock::now();
  for (int i = 0; i < nodes; ++i) {
    rdzv::NodeInfo info;
    info.node_id = "node-" + std::to_string(i);
    info.host = "127.0.0.1";
    info.master_port = 20000 + i;
    asio::co_spawn(io, all[i]->join(info, config),
                   [&, i](std::exception_ptr e, rdzv::Result<rdzv::RoundAssignment> r) {
                     returned[i] = Clock::now();
                     ++answered;
                     if (e || !r) {
                       if (error.empty()) error = e ? "join threw" : r.error().message;
                       return;
                     }
                     assigned[i] = r.value();
                   });
  }
  const bool in_time = run_until(
      io, [&] { return answered == nodes; }, t0 + kJoinTimeout + std::chrono::seconds(5));
  const double nodes_cpu = own_cpu_seconds() - cpu_before;
  if (!in_time && error.empty()) error = "joins did not finish in time";

  Row row;
  row.backend = backend;
  row.nodes = nodes;
  row.join_wall_s =
      std::chrono::duration<double>(*std::max_element(returned.begin(), returned.end()) - t0)
          .count();
  row.first_s =
      std::chrono::duration<double>(*std::min_element(returned.begin(), returned.end()) - t0)
          .count();
  row.nodes_cpu_s = nodes_cpu;
  if (error.empty()) {
    std::set<int> ranks;
    for (const auto& a : assigned) {
      if (!a || a->group_world_size != nodes || a->world_size != nodes) {
        error = "an assignment is missing or has the wrong world size";
        break;
      }
      ranks.insert(a->group_rank);
    }
    if (error.empty() && (ranks.size() != static_cast<std::size_t>(nodes) || *ranks.begin() != 0 ||
                          *ranks.rbegin() != nodes - 1)) {
      error = "group ranks are not 0..N-1";
    }
  }
  // Goodbye (etcd: the leases are revoked), bounded.
  int released = 0;
  for (auto& node : all) {
    asio::co_spawn(io, node->release(), [&](std::exception_ptr) { ++released; });
  }
  run_until(
      io, [&] { return released == nodes; }, Clock::now() + std::chrono::seconds(20));
  all.clear();
  io.run_for(std::chrono::milliseconds(50));
  if (!error.empty()) return std::nullopt;
  return row;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"backend_rdzv_bench: one rendezvous round of N nodes, ctrund vs etcd (and TLS)"};
  std::string ctrund = CTRUND_PATH;
  std::string etcd = "/usr/bin/etcd";
  std::vector<int> node_counts = {16, 64, 256, 1024};
  std::vector<std::string> backends = {"ctrund", "ctrund-tls", "etcd", "etcd-tls"};
  int etcd_max_nodes = 256;
  int reps = 3;
  bool quick = false;
  std::string json_out;
  app.add_option("--ctrund", ctrund, "path of the ctrund binary");
  app.add_option("--etcd", etcd, "path of the etcd binary");
  app.add_option("--nodes", node_counts, "node counts")->delimiter(',');
  app.add_option("--backends", backends, "ctrund, ctrund-tls, etcd, etcd-tls")->delimiter(',');
  app.add_option("--etcd_max_nodes", etcd_max_nodes,
                 "run the etcd sides up to this many nodes (256: a round of 1024 on one etcd "
                 "takes minutes)");
  app.add_option("--reps", reps, "repetitions (the median is reported)");
  app.add_flag("--quick", quick, "one repetition");
  app.add_option("--json_out", json_out, "also write the rows as JSON lines here");
  CLI11_PARSE(app, argc, argv);
  if (quick) reps = 1;
  for (const auto& b : backends) {
    if (b != "ctrund" && b != "ctrund-tls" && b != "etcd" && b != "etcd-tls") {
      std::cerr << "backend_rdzv_bench: --backends: expected ctrund, ctrund-tls, etcd or "
                   "etcd-tls, got '"
                << b << "'\n";
      return 2;
    }
  }
  const bool any_etcd = std::any_of(backends.begin(), backends.end(),
                                    [](const std::string& b) { return b.starts_with("etcd"); });
  if (any_etcd && access(etcd.c_str(), X_OK) != 0) {
    std::cerr << "backend_rdzv_bench: " << etcd
              << " is not installed (apt-get install etcd-server)\n";
    return 1;
  }

  bench::install_cleanup_handlers();
  bench::raise_nofile_limit();  // each etcd node holds a few connections: 256 nodes, ~1000
  const std::string dir = bench::make_temp_dir("backend_rdzv_bench.");
  const Pki pki = make_pki(dir);
  std::map<std::pair<std::string, int>, std::vector<Row>> runs;
  bool failed = false;
  int run = 0;
  for (int rep = 0; rep < reps && !failed; ++rep) {
    for (int n : node_counts) {
      // Rotate the order so drift on a shared machine hits both sides alike.
      std::vector<std::string> order = backends;
      std::rotate(order.begin(), order.begin() + (rep % order.size()), order.end());
      for (const auto& backend : order) {
        if (backend.starts_with("etcd") && n > etcd_max_nodes) continue;
        ++run;
        auto service = start_service(backend, ctrund, etcd, dir, run, pki);
        if (!service) {
          std::cerr << "backend_rdzv_bench: " << backend << " did not start\n";
          failed = true;
          break;
        }
        std::string error;
        auto row = run_once(backend, n, *service, run, pki, error);
        if (row) {
          row->service_cpu_s = bench::read_cpu_seconds(service->process.pid());
          row->service_hwm_mib =
              static_cast<double>(bench::read_vm_hwm_kib(service->process.pid())) / 1024.0;
        }
        service->process.stop();
        if (!row) {
          std::cerr << "backend_rdzv_bench: " << backend << ", " << n << " nodes: " << error
                    << " (service log " << service->log << ")\n";
          failed = true;
          break;
        }
        std::fprintf(stderr,
                     "rep %d %-10s %4d nodes: join %9.1f ms, nodes cpu %.2f s, %s cpu %.2f s\n",
                     rep + 1, backend.c_str(), n, row->join_wall_s * 1e3, row->nodes_cpu_s,
                     backend.c_str(), row->service_cpu_s);
        runs[{backend, n}].push_back(*row);
      }
      if (failed) break;
    }
  }
  if (!failed) bench::remove_tree(dir);

  auto median = [&](const std::string& b, int n, double Row::*field) {
    std::vector<double> v;
    for (const auto& r : runs[{b, n}]) v.push_back(r.*field);
    return v.empty() ? 0.0 : median_of(v);
  };
  std::printf(
      "\nbackend_rdzv_bench: one round of N nodes (min = max = N) through the agent's "
      "Backend, fresh service per run, median of %d\n\n",
      reps);
  std::printf(
      "| nodes | backend    | join wall (ms) | first answer (ms) | nodes' CPU (s) | service "
      "CPU (s) | service VmHWM (MiB) |\n");
  std::printf(
      "|------:|------------|---------------:|------------------:|---------------:|--------"
      "--------:|--------------------:|\n");
  for (int n : node_counts) {
    for (const auto& b : backends) {
      if (runs[{b, n}].empty()) continue;
      std::printf("| %5d | %-10s | %14.1f | %17.1f | %14.2f | %15.2f | %19.1f |\n", n, b.c_str(),
                  median(b, n, &Row::join_wall_s) * 1e3, median(b, n, &Row::first_s) * 1e3,
                  median(b, n, &Row::nodes_cpu_s), median(b, n, &Row::service_cpu_s),
                  median(b, n, &Row::service_hwm_mib));
    }
  }
  // Ratios of the join wall time, where both sides ran.
  auto ratios = [&](const std::string& a, const std::string& b) {
    bool header = false;
    for (int n : node_counts) {
      const double x = median(a, n, &Row::join_wall_s);
      const double y = median(b, n, &Row::join_wall_s);
      if (x <= 0 || y <= 0) continue;
      if (!header) {
        std::printf("\n| nodes | %s / %s (join wall) |\n|------:|---:|\n", a.c_str(), b.c_str());
        header = true;
      }
      std::printf("| %5d | %.2fx |\n", n, x / y);
    }
  };
  ratios("etcd", "ctrund");
  ratios("ctrund-tls", "ctrund");
  ratios("etcd-tls", "etcd");
  if (!json_out.empty()) {
    std::ofstream out(json_out);
    for (const auto& [key, rows] : runs) {
      if (rows.empty()) continue;
      out << "{\"backend\": \"" << key.first << "\", \"nodes\": " << key.second
          << ", \"join_wall_s\": " << median(key.first, key.second, &Row::join_wall_s)
          << ", \"nodes_cpu_s\": " << median(key.first, key.second, &Row::nodes_cpu_s) << "}\n";
    }
  }
  return failed ? 1 : 0;
}

// ctrund: the rendezvous daemon. Serves many jobs at once on one address.
#include <CLI/CLI.hpp>
#include <boost/asio.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string_view>

#include "rendezvous/base/event_log.h"
#include "rendezvous/base/log.h"
#include "rendezvous/base/open_files.h"
#include "rendezvous/base/token.h"
#include "rendezvous/base/version.h"
#include "rendezvous/core/metrics.h"
#include "rendezvous/daemon/http_server.h"
#include "rendezvous/daemon/server.h"
#include "rendezvous/tls/tls_context.h"

namespace rdzv = ctrun::rendezvous;

namespace {

// Written whole, then renamed: a reader never sees a partial port number. Nothing to do for an
// empty path.
bool write_port_file(const std::string& path, std::uint16_t port) {
  if (path.empty()) return true;
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  std::ofstream out(tmp);
  out << port << "\n";
  out.close();
  if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::cerr << "ctrund: error: cannot write port file '" << path << "': " << std::strerror(errno)
              << "\n";
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

// --metrics_port's pages: the Prometheus text at /metrics, a link to it at /.
rdzv::HttpReply metrics_reply(std::string_view target, rdzv::Server& daemon) {
  if (target == "/metrics" || target.starts_with("/metrics?")) {
    return {200, "text/plain; version=0.0.4; charset=utf-8",
            rdzv::prometheus_text(daemon.metrics())};
  }
  if (target == "/") {
    return {200, "text/html; charset=utf-8",
            "<html><body><a href=\"/metrics\">ctrund metrics</a></body></html>\n"};
  }
  return {404, "text/plain; charset=utf-8", "not found: try /metrics\n"};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ctrund: rendezvous and key-value store daemon for ctrun jobs"};
  rdzv::ServerOptions options;
  std::string token_file;
  std::string port_file;
  std::string metrics_port_file;
  std::size_t max_frame_bytes = rdzv::kDefaultMaxFrameBytes;
  std::size_t max_connections = options.service.max_connections;
  std::size_t max_connections_per_host = options.service.max_connections_per_host;
  app.add_option("--host", options.host, "address to listen on (default: every interface)");
  app.add_option("--port", options.port, "port to listen on; 0 picks a free one")
      ->default_val(rdzv::kDefaultPort);
  app.add_option("--token_file", token_file,
                 "file holding the shared token clients must prove (else $CTRUN_RDZV_TOKEN)");
  app.add_option("--max_frame_bytes", max_frame_bytes, "largest frame accepted")
      ->default_val(rdzv::kDefaultMaxFrameBytes)
      ->check(CLI::Range(std::size_t{64}, std::size_t{1} << 30));
  app.add_option("--max_connections", max_connections, "connections served at once")
      ->default_val(options.service.max_connections)
      ->check(CLI::PositiveNumber);
  app.add_option("--max_connections_per_host", max_connections_per_host,
                 "connections served at once from one address")
      ->default_val(options.service.max_connections_per_host)
      ->check(CLI::PositiveNumber);
  std::size_t worker_store_max_connections = 0;
  app.add_option("--worker_store_max_connections", worker_store_max_connections,
                 "TCPStore connections served at once per job on --worker_store_ports, from any "
                 "address; 0 (the default): 4 a rank of the job and 1024 more, at least 16384");
  app.add_option("--port_file", port_file, "write the bound port to this file once listening");
  app.add_option("--state_dir", options.state_dir,
                 "keep every job's store and rendezvous here and restore them at start-up");
  int metrics_port = -1;
  app.add_option("--metrics_port", metrics_port,
                 "serve Prometheus metrics over HTTP on this port (GET /metrics), on --host's "
                 "address; 0 picks a free one")
      ->check(CLI::Range(0, 65535));
  app.add_option("--metrics_port_file", metrics_port_file,
                 "write the bound metrics port to this file once listening");
  std::string event_log_path;
  app.add_option("--event_log", event_log_path,
                 "append every job's rendezvous events here as JSON lines (join, round, node "
                 "lost, job end)");
  std::string worker_store_ports;
  app.add_option("--worker_store_ports", worker_store_ports,
                 "serve each job's store to torch's TCPStore clients (its workers, "
                 "TORCHELASTIC_USE_AGENT_STORE=True) on a port of its own: auto, PORT or "
                 "FIRST-LAST; such ports take no token");
  rdzv::TlsServerFiles tls_files;
  app.add_option("--tls_cert", tls_files.cert_file,
                 "serve TLS only, with this certificate chain (PEM); needs --tls_key. The "
                 "worker-store ports stay plain (torch's TCPStore clients have no TLS)");
  app.add_option("--tls_key", tls_files.key_file, "the private key of --tls_cert (PEM)");
  app.add_option("--tls_client_ca", tls_files.client_ca_file,
                 "mutual TLS: a client must present a certificate this CA file signed");
  bool metrics_tls = false;
  app.add_flag("--metrics_tls", metrics_tls,
               "serve the metrics over HTTPS with --tls_cert (and --tls_client_ca's check)");
  app.set_version_flag("--version", "ctrund " + ctrun::version_text());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "ctrund: error: " << e.what() << "\n";
    return 2;
  }

  const char* env_token = std::getenv(rdzv::kTokenVariable);
  auto token = rdzv::resolve_token(
      token_file, env_token ? std::optional<std::string>(env_token) : std::nullopt);
  if (!token) {
    std::cerr << "ctrund: error: " << token.error().message << "\n";
    return 2;
  }
  options.service.token = token.value();
  if (!worker_store_ports.empty()) {
    auto range = rdzv::parse_port_range(worker_store_ports);
    if (!range) {
      std::cerr << "ctrund: error: --worker_store_ports: " << range.error().message << "\n";
      return 2;
    }
    options.worker_store_ports = range.value();
  }
  const bool tls = !tls_files.cert_file.empty() || !tls_files.key_file.empty();
  if (!tls && !tls_files.client_ca_file.empty()) {
    std::cerr << "ctrund: error: --tls_client_ca needs --tls_cert and --tls_key\n";
    return 2;
  }
  if (metrics_tls && !tls) {
    std::cerr << "ctrund: error: --metrics_tls needs --tls_cert and --tls_key\n";
    return 2;
  }
  if (tls) {
    auto context = rdzv::make_server_tls_context(tls_files);
    if (!context) {
      std::cerr << "ctrund: error: " << context.error().message << "\n";
      return 2;
    }
    options.tls = std::move(context).value();
  }
  options.service.max_frame_bytes = max_frame_bytes;
  // A value must fit in a frame with its key and the request around it.
  options.service.store_limits.max_value_bytes =
      max_frame_bytes - std::min<std::size_t>(max_frame_bytes / 2, 8192);
  options.max_pending_write_bytes = std::max(options.max_pending_write_bytes, 4 * max_frame_bytes);
  options.service.max_connections = max_connections;
  options.service.max_connections_per_host = max_connections_per_host;
  options.service.worker_store_limits.max_connections = worker_store_max_connections;
  // A descriptor per connection: take what the hard limit allows (a soft limit of 1024 stalls
  // the accepts near 1000 clients).
  const rdzv::OpenFileLimit files = rdzv::raise_open_file_limit();
  options.service.log = [](const std::string& line) { rdzv::log_line("ctrund", line); };

  std::unique_ptr<rdzv::EventLog> event_log;
  if (!event_log_path.empty()) {
    auto opened = rdzv::EventLog::open(event_log_path, "ctrund");
    if (!opened) {
      std::cerr << "ctrund: error: " << opened.error().message << "\n";
      return 2;
    }
    event_log = std::move(opened).value();
    options.service.events = event_log->sink();
  }

  boost::asio::io_context io;
  auto server = rdzv::Server::create(io, options);
  if (!server) {
    std::cerr << "ctrund: error: " << server.error().message << "\n";
    return 1;
  }
  server.value()->start();
  std::unique_ptr<rdzv::HttpServer> metrics;
  if (metrics_port >= 0) {
    rdzv::Server& daemon = *server.value();
    auto created = rdzv::HttpServer::create(
        io, options.host, static_cast<std::uint16_t>(metrics_port), "ctrund",
        [&daemon](std::string_view target) { return metrics_reply(target, daemon); },
        metrics_tls ? options.tls : nullptr);
    if (!created) {
      std::cerr << "ctrund: error: --metrics_port: " << created.error().message << "\n";
      return 1;
    }
    metrics = std::move(created).value();
    metrics->start();
    rdzv::log_line("ctrund", std::string("metrics on ") + (metrics_tls ? "https://" : "http://") +
                                 metrics->endpoint() + "/metrics");
  }
  if (event_log) event_log->write("daemon_start", {{"endpoint", server.value()->endpoint()}});
  const std::string security =
      !tls ? "plain TCP"
           : (tls_files.client_ca_file.empty() ? "TLS" : "TLS, client certificates required");
  rdzv::log_line("ctrund", "listening on " + server.value()->endpoint() + " (" + security +
                               "; token " + (options.service.token ? "required" : "not required") +
                               "; open files " + rdzv::open_file_limit_text(files.soft) + ")");
  if (!write_port_file(port_file, server.value()->port())) return 1;
  if (metrics && !write_port_file(metrics_port_file, metrics->port())) return 1;

  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](boost::system::error_code ec, int signo) {
    if (ec) return;
    rdzv::log_line("ctrund",
                   std::string("stopping on ") + (signo == SIGINT ? "SIGINT" : "SIGTERM"));
    server.value()->stop();
    if (metrics) metrics->stop();
    if (event_log)
      event_log->write("daemon_stop", {{"signal", signo == SIGINT ? "SIGINT" : "SIGTERM"}});
    io.stop();
  });
  std::signal(SIGPIPE, SIG_IGN);
  io.run();
  return 0;
}

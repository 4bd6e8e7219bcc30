#include "launcher/cluster/cluster_launcher.h"

#include <netdb.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include "ctrun/rendezvous/endpoint.h"
#include "launcher/agent/agent_os.h"
#include "launcher/agent/hosted_rendezvous.h"
#include "launcher/agent/rendezvous_plan.h"
#include "launcher/cli/host_list.h"
#include "launcher/cluster/cluster_job.h"
#include "launcher/cluster/cluster_plan.h"
#include "launcher/cluster/ssh_session.h"
#include "rendezvous/base/local_address.h"
#include "rendezvous/base/log.h"
#include "rendezvous/base/token.h"
#include "rendezvous/daemon/server.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;

namespace {

void log(const std::string& line) { rdzv::log_line("ctrun", line); }

int fail(const std::string& message) {
  std::fprintf(stderr, "ctrun: error: %s\n", message.c_str());
  return 2;
}

// The address of this machine that the hosts reach the rendezvous at: the one packets to
// `host` leave from (ssh's port; base/local_address.h).
rdzv::Result<std::string> local_address_towards(const std::string& host) {
  auto address = rdzv::local_address_towards(host, 22);
  if (!address)
    return rdzv::Error{address.error().code, "host " + host + ": " + address.error().message};
  return address;
}

// A directory of this user's alone for ssh's shared connections.
rdzv::Result<std::string> control_directory(const EnvLookup& env) {
  auto tmp = env("TMPDIR");
  const std::string base = tmp && !tmp->empty() ? *tmp : std::string("/tmp");
  const std::string name = "/ctrun-ssh-" + std::to_string(::getuid());
  std::string dir = base + name;
  // ssh's socket path (the directory, 40 characters of %C and a temporary suffix) must fit a
  // Unix socket's address: about 90 characters in all. A long TMPDIR gets a short directory of
  // its own in /tmp instead.
  if (dir.size() > 48) {
    const std::size_t base_hash = std::hash<std::string>{}(base)&0xffffffffu;
    char hash[17];
    std::snprintf(hash, sizeof(hash), "%08zx", base_hash);
    dir = "/tmp" + name + "-" + hash;
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return rdzv::Error{
        rdzv::ErrorCode::kBadRequest,
        "cannot create '" + dir + "' for ssh's connections: " + std::strerror(errno)};
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid() ||
      (st.st_mode & 0077) != 0) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       "'" + dir +
                           "' is not a private directory of this user (mode 0700): ssh's "
                           "shared connections cannot live there"};
  }
  return dir;
}

// The env files' lines: ~/.ctrun_env, then ./.ctrun_env (later ones win), or --env_file alone.
rdzv::Result<EnvVars> read_env_files(const ClusterOptions& c, const EnvLookup& env) {
  std::vector<std::pair<std::string, bool>> files;  // path, must exist
  if (!c.env_file.empty()) {
    files.emplace_back(c.env_file, true);
  } else {
    if (auto home = env("HOME"); home && !home->empty())
      files.emplace_back(*home + "/.ctrun_env", false);
    files.emplace_back(".ctrun_env", false);
  }
  EnvVars vars;
  for (const auto& [path, required] : files) {
    auto text = read_text_file(path);
    if (!text) {
      if (!required && errno == ENOENT) continue;
      return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                         "--env_file: cannot read '" + path + "': " + std::strerror(errno)};
    }
    auto parsed = parse_env_file(*text, path);
    if (!parsed) return parsed.error();
    for (auto& v : parsed.value()) vars.push_back(std::move(v));
  }
  return vars;
}

std::vector<std::pair<std::string, std::string>> split_environment() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& entry : current_environment()) {
    const auto eq = entry.find('=');
    if (eq != std::string::npos) out.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return out;
}

std::string this_executable() {
  std::string path(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
  if (n <= 0) return "ctrun";
  path.resize(static_cast<std::size_t>(n));
  return path;
}

// Each session holds four descriptors (three pipes and the exit's pidfd): a long host list
// needs more than the usual soft limit of 1024, within the hard one.
rdzv::Status ensure_descriptors(std::size_t hosts) {
  const rlim_t needed = 64 + 4 * static_cast<rlim_t>(hosts);
  rlimit now{};
  if (::getrlimit(RLIMIT_NOFILE, &now) != 0 || now.rlim_cur == RLIM_INFINITY ||
      now.rlim_cur >= needed) {
    return rdzv::ok_status();
  }
  if (now.rlim_max != RLIM_INFINITY && now.rlim_max < needed) {
    return rdzv::Error{
        rdzv::ErrorCode::kLimit,
        std::to_string(hosts) + " ssh sessions need about " + std::to_string(needed) +
            " open files, and the hard limit (ulimit -Hn) is " + std::to_string(now.rlim_max)};
  }
  rlimit raised = now;
  raised.rlim_cur = needed;
  if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) {
    return rdzv::Error{rdzv::ErrorCode::kLimit,
                       std::string("cannot raise the open-file limit: ") + std::strerror(errno)};
  }
  return rdzv::ok_status();
}

std::string command_text(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& word : argv) out += (out.empty() ? "" : " ") + shell_quote(word);
  return out;
}

}  // namespace

int run_cluster(asio::io_context& io, const LaunchOptions& o, const EnvLookup& env) {
  const ClusterOptions& c = *o.cluster;
  // The hosts.
  rdzv::Result<std::vector<Host>> listed = std::vector<Host>{};
  if (!c.hostfile.empty()) {
    auto text = read_text_file(c.hostfile);
    if (!text) return fail("--hostfile: cannot read '" + c.hostfile + "': " + std::strerror(errno));
    listed = parse_hostfile(*text, c.hostfile);
  } else {
    listed = parse_hosts_option(c.hosts);
  }
  if (!listed) return fail(listed.error().message);
  auto hosts = select_hosts(std::move(listed).value(), c.include, c.exclude);
  if (!hosts) return fail(hosts.error().message);

  ClusterFacts facts;
  std::error_code ec;
  facts.cwd = std::filesystem::current_path(ec).string();
  if (ec) return fail("cannot read the working directory: " + ec.message());
  facts.ctrun_path = this_executable();
  auto control = control_directory(env);
  if (!control) return fail(control.error().message);
  facts.control_dir = control.value();
  facts.job_id = "ctrun-" + random_uuid().substr(0, 8);
  facts.environment = split_environment();
  auto env_files = read_env_files(c, env);
  if (!env_files) return fail(env_files.error().message);
  facts.env_file = std::move(env_files).value();

  // The rendezvous: the one named (etcd, or a c10d/ctrund endpoint on another machine), else
  // one this launcher hosts, on the address the hosts reach it at.
  const char* env_token = std::getenv(rdzv::kTokenVariable);
  auto token = rdzv::resolve_token(
      o.rdzv_conf.token_file, env_token ? std::optional<std::string>(env_token) : std::nullopt);
  if (!token) return fail(token.error().message);
  std::unique_ptr<rdzv::Server> server;
  const bool etcd = o.rdzv_backend == "etcd" || o.rdzv_backend == "etcd-v2";
  std::string bind_host;
  std::uint16_t port = 0;
  bool host_here = !etcd && !c.rdzv_endpoint_given;
  if (!etcd && c.rdzv_endpoint_given) {
    auto ep = parse_rdzv_endpoint(o.rdzv_endpoint, rdzv::kDefaultPort);
    if (!ep) return fail(ep.error().message);
    if (is_local_host(ep.value().host)) {
      host_here = true;
      bind_host = ep.value().host;
      port = ep.value().port;
    }
  }
  if (host_here) {
    // The hosted rendezvous is plain: agents told to use TLS could not reach it.
    auto access = store_access(false, o.rdzv_endpoint, o.rdzv_conf);
    if (!access) return fail(access.error().message);
    if (access.value().tls) {
      return fail(
          "--rdzv_conf's TLS settings need a ctrund --tls_cert of its own: give its "
          "--rdzv_endpoint (this launcher hosts its rendezvous without TLS)");
    }
  }
  std::string advertised;
  if (host_here) {
    if (bind_host.empty()) {
      // The first host reached through a network decides; a list of this machine's own names
      // (localhost) gets loopback.
      for (const Host& h : hosts.value()) {
        auto address = local_address_towards(h.name);
        if (!address) return fail(address.error().message);
        advertised = address.value();
        if (advertised.rfind("127.", 0) != 0 && advertised != "::1") break;
      }
    } else {
      advertised = bind_host;
    }
    // Bound to every address when bind_host is empty, so each host reaches it its way.
    rdzv::ServerOptions server_options = hosted_rendezvous_options(
        o.rdzv_conf, bind_host, port, token.value(), c.rdzv_id_given ? o.rdzv_id : facts.job_id);
    auto created = rdzv::Server::create(io, server_options);
    if (!created) return fail("cannot host the rendezvous: " + created.error().message);
    server = std::move(created).value();
    facts.endpoint = rdzv::format_endpoint({advertised, server->port()});
  } else {
    facts.endpoint = o.rdzv_endpoint;
  }

  auto plan = plan_cluster(o, hosts.value(), facts);
  if (!plan) return fail(plan.error().message);
  if (c.dry_run) {
    for (const auto& h : plan.value().hosts) {
      std::printf("%s: %s\n", h.host.c_str(), command_text(h.ssh_argv).c_str());
    }
    return 0;
  }
  if (auto s = ensure_descriptors(plan.value().hosts.size()); !s) return fail(s.error().message);
  if (!o.log_dir.empty()) {
    std::filesystem::create_directories(o.log_dir, ec);
    if (ec) return fail("--log_dir: cannot create '" + o.log_dir + "': " + ec.message());
  }

  std::string names;
  for (const auto& h : plan.value().hosts) names += (names.empty() ? "" : ", ") + h.host;
  if (server) server->start();
  log("job " + plan.value().job_id + " on " + std::to_string(plan.value().hosts.size()) +
      " hosts (" + names + "), --nnodes=" + std::to_string(plan.value().min_nodes) + ":" +
      std::to_string(plan.value().max_nodes) + ", rendezvous " + o.rdzv_backend + " at " +
      facts.endpoint + (server ? " (hosted here)" : ""));

  std::vector<std::string> host_names;
  for (const auto& h : plan.value().hosts) host_names.push_back(h.host);
  ClusterJob job(host_names, plan.value().min_nodes);
  std::vector<std::unique_ptr<SshSession>> sessions;
  asio::steady_timer grace(io);
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.add(SIGHUP);
  std::optional<int> exit_code;
  int exit_signal = 0;

  std::function<void(ClusterActions)> act = [&](ClusterActions a) {
    for (const auto& line : a.lines) log(line);
    for (int i : a.close_input) sessions[i]->close_input();
    for (int i : a.kill) sessions[i]->terminate();
    if (a.arm_stop_grace) {
      // The agents' own grace for their workers, and time to say so.
      grace.expires_after(std::chrono::seconds(static_cast<long>(o.shutdown_timeout) + 15));
      grace.async_wait([&](boost::system::error_code e) {
        if (!e) act(job.stop_grace_over());
      });
    }
    if (a.exit_code) {
      exit_code = a.exit_code;
      exit_signal = a.exit_signal;
      grace.cancel();
      signals.cancel();
      if (server) server->stop();
      io.stop();
    }
  };
  std::function<void()> arm_signals = [&] {
    signals.async_wait([&](boost::system::error_code e, int signo) {
      if (e) return;
      act(job.signal(signo));
      arm_signals();
    });
  };
  arm_signals();

  for (std::size_t i = 0; i < plan.value().hosts.size(); ++i) {
    const HostPlan& h = plan.value().hosts[i];
    sessions.push_back(std::make_unique<SshSession>(io, h.host + ": ", h.log_file));
    auto started = sessions.back()->start(h.ssh_argv, [&, i](const SessionEnd& end) {
      act(job.session_ended(static_cast<int>(i), end));
    });
    if (!started) {
      // ssh itself cannot run here: nothing can start anywhere.
      log("error: host " + h.host + ": " + started.error().message);
      for (std::size_t k = 0; k < i; ++k) sessions[k]->terminate();
      return 2;
    }
  }
  io.run();
  sessions.clear();
  if (exit_signal != 0) {
    std::signal(exit_signal, SIG_DFL);
    ::raise(exit_signal);
  }
  return exit_code.value_or(1);
}

}  // namespace ctrun::launcher

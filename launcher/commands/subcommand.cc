#include "launcher/commands/subcommand.h"

#include <cstdio>

#include "ctrun/rendezvous/endpoint.h"
#include "launcher/agent/rendezvous_plan.h"
#include "rendezvous/base/token.h"

namespace ctrun::launcher {

void add_rendezvous_options(CLI::App& app, RendezvousTarget& target, const std::string& id_help) {
  app.add_option("--rdzv_endpoint,--rdzv-endpoint", target.endpoint,
                 "HOST[:PORT] of the rendezvous");
  app.add_option("--rdzv_id,--rdzv-id", target.id, id_help);
  app.add_option("--rdzv_backend,--rdzv-backend", target.backend,
                 "c10d, ctrund, etcd or etcd-v2 (default c10d)");
  app.add_option("--token_file", target.token_file,
                 "the daemon's shared token (else $CTRUN_RDZV_TOKEN)");
  app.add_option("--rdzv_conf,--rdzv-conf", target.rdzv_conf,
                 "TLS (protocol, cacert, cert, key) and etcd's user (user, password_file), as "
                 "the job's agents");
  app.add_option("--timeout", target.timeout, "seconds to keep trying to reach the rendezvous (5)")
      ->check(CLI::PositiveNumber);
}

rendezvous::Result<rendezvous::StoreAccess> target_store_access(const RendezvousTarget& target) {
  auto conf = parse_rdzv_conf(target.rdzv_conf);
  if (!conf) return conf.error();
  return store_access(target.etcd(), target.endpoint, conf.value());
}

rendezvous::Result<std::unique_ptr<rendezvous::StoreClient>> connect_job_store(
    const RendezvousTarget& target,
    const std::function<std::optional<std::string>(const std::string&)>& env) {
  namespace rdzv = ctrun::rendezvous;
  auto access = target_store_access(target);
  if (!access) return access.error();
  rdzv::StoreAddress address;
  if (target.etcd()) {
    auto members = rdzv::parse_endpoint_list(target.endpoint);
    if (!members) return members.error();
    address = rdzv::etcd_store_address(members.value(), "", access.value());
  } else {
    auto ep = rdzv::parse_endpoint(target.endpoint, rdzv::kDefaultPort);
    if (!ep) return ep.error();
    address.host = ep.value().host;
    address.port = ep.value().port;
    address.access = access.value();
    auto token = rdzv::resolve_token(target.token_file, env(rdzv::kTokenVariable));
    if (!token) return token.error();
    address.token = token.value();
  }
  const auto limit =
      std::chrono::duration_cast<rdzv::Duration>(std::chrono::duration<double>(target.timeout));
  auto store = rdzv::connect_store(address, target.id, limit);
  if (!store) {
    return rdzv::Error{
        rdzv::ErrorCode::kConnection,
        "cannot reach the rendezvous at " + target.endpoint + ": " + store.error().message};
  }
  return std::move(store).value();
}

std::optional<int> parse_subcommand(
    CLI::App& app, const std::vector<std::string>& args, const RendezvousTarget& target,
    const std::function<int(const std::string& message, int code)>& fail) {
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    return fail(e.what(), 2);
  }
  const std::string& backend = target.backend;
  if (backend != "c10d" && backend != "ctrund" && backend != "etcd" && backend != "etcd-v2") {
    return fail("--rdzv_backend: expected c10d, ctrund, etcd or etcd-v2, got '" + backend + "'", 2);
  }
  if (target.endpoint.empty()) return fail("--rdzv_endpoint is required", 2);
  return std::nullopt;
}

}  // namespace ctrun::launcher

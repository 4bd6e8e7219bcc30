#include "launcher/agent/rendezvous_plan.h"

#include "ctrun/rendezvous/endpoint.h"

namespace ctrun::launcher {

namespace rdzv = ctrun::rendezvous;

namespace {

bool tls_protocol(const std::string& protocol) { return protocol == "https" || protocol == "tls"; }

rdzv::Result<rdzv::StoreAccess> etcd_access(const std::string& endpoint,
                                            const RendezvousConf& conf) {
  auto https = rdzv::endpoint_list_https(endpoint);
  if (!https) return https.error();
  if (https.value() && !conf.protocol.empty() && !tls_protocol(conf.protocol)) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest, "--rdzv_conf: protocol=" + conf.protocol +
                                                         ", but the endpoints are https:// ones"};
  }
  rdzv::StoreAccess access;
  if (https.value() || tls_protocol(conf.protocol)) {
    access.tls = rdzv::TlsClientFiles{conf.cacert, conf.cert, conf.key};
  } else if (!conf.cacert.empty() || !conf.cert.empty() || !conf.key.empty()) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       "--rdzv_conf: cacert, cert and key are TLS settings: give https:// "
                       "endpoints or protocol=https"};
  }
  if (conf.user.empty() != conf.password_file.empty()) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       "--rdzv_conf: an etcd user needs both user and password_file"};
  }
  access.user = conf.user;
  access.password_file = conf.password_file;
  return access;
}

// ctrund: TLS when protocol=tls (or https) or a TLS file is named; no user (the token proves
// the agent).
rdzv::Result<rdzv::StoreAccess> ctrund_access(const RendezvousConf& conf) {
  if (!conf.user.empty() || !conf.password_file.empty()) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       "--rdzv_conf: user and password_file are etcd's; ctrund takes the job's "
                       "token (token_file, --token_file or CTRUN_RDZV_TOKEN)"};
  }
  const bool files = !conf.cacert.empty() || !conf.cert.empty() || !conf.key.empty();
  rdzv::StoreAccess access;
  if (tls_protocol(conf.protocol) || files) {
    if (!conf.protocol.empty() && !tls_protocol(conf.protocol)) {
      return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                         "--rdzv_conf: protocol=" + conf.protocol +
                             " with cacert, cert or key: TLS needs protocol=tls (or none)"};
    }
    access.tls = rdzv::TlsClientFiles{conf.cacert, conf.cert, conf.key};
  }
  return access;
}

}  // namespace

rdzv::Result<rdzv::StoreAccess> store_access(bool etcd, const std::string& endpoint,
                                             const RendezvousConf& conf) {
  auto access = etcd ? etcd_access(endpoint, conf) : ctrund_access(conf);
  if (access && access.value().tls) {
    const rdzv::TlsClientFiles& tls = *access.value().tls;
    if (tls.cert_file.empty() != tls.key_file.empty()) {
      return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                         "--rdzv_conf: a client certificate needs both cert and key"};
    }
  }
  return access;
}

rdzv::Result<RendezvousPlan> plan_rendezvous(
    const LaunchOptions& o, const std::function<bool(const std::string&)>& is_local_host) {
  RendezvousPlan plan;
  const bool etcd = o.rdzv_backend == "etcd" || o.rdzv_backend == "etcd-v2";
  if (o.standalone) {
    // A free port: two standalone jobs on one machine do not collide.
    plan.backend.endpoints = {{"127.0.0.1", 0}};
    plan.try_host = plan.must_host = true;
    return plan;
  }
  if (o.rdzv_backend == "static") {
    plan.backend.endpoints = {{o.master_addr, static_cast<std::uint16_t>(o.master_port)}};
    plan.try_host = plan.must_host = o.node_rank == 0;
    plan.requested_rank = o.node_rank;
    return plan;
  }
  if (o.rdzv_endpoint.empty()) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       "--rdzv_endpoint is required with --rdzv_backend=" + o.rdzv_backend};
  }
  if (o.node_rank_given) plan.requested_rank = o.node_rank;
  if (etcd) {
    auto endpoints = rdzv::parse_endpoint_list(o.rdzv_endpoint);
    if (!endpoints) return endpoints.error();
    auto access = store_access(true, o.rdzv_endpoint, o.rdzv_conf);
    if (!access) return access.error();
    plan.backend.service = rdzv::BackendSpec::Service::kEtcd;
    plan.backend.endpoints = std::move(endpoints).value();
    plan.backend.access = std::move(access).value();
    return plan;
  }
  auto access = store_access(false, o.rdzv_endpoint, o.rdzv_conf);
  if (!access) return access.error();
  auto endpoint = parse_rdzv_endpoint(o.rdzv_endpoint, rdzv::kDefaultPort);
  if (!endpoint) return endpoint.error();
  plan.backend.endpoints = {endpoint.value()};
  plan.backend.access = std::move(access).value();
  if (plan.backend.access.tls) {
    // An agent hosts its rendezvous in plain TCP (it has no server certificate): TLS means a
    // ctrund --tls_cert of its own, which every agent reaches as a client.
    if (o.rdzv_conf.is_host.value_or(false)) {
      return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                         "--rdzv_conf: is_host=true with TLS: an agent hosts its rendezvous "
                         "without TLS; run ctrund --tls_cert at the endpoint instead"};
    }
    return plan;
  }
  plan.must_host = o.rdzv_conf.is_host.value_or(false);
  plan.try_host = o.rdzv_conf.is_host.value_or(is_local_host(endpoint.value().host));
  return plan;
}

}  // namespace ctrun::launcher

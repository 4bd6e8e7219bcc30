// make_backend: the service a BackendSpec names, built.
#include "rendezvous/backend/backend.h"

#include "ctrun/rendezvous/client.h"
#include "rendezvous/etcd/etcd_client.h"

namespace ctrun::rendezvous {

Status read_backend_secrets(BackendSpec& spec) {
  if (spec.access.user.empty()) return ok_status();
  auto options = etcd::with_access({}, spec.access);
  if (!options) return options.error();
  spec.etcd_password = options.value().password;
  return ok_status();
}

std::unique_ptr<Backend> make_backend(boost::asio::io_context& io, BackendSpec spec) {
  if (spec.service == BackendSpec::Service::kEtcd) {
    return make_etcd_backend(io, std::move(spec));
  }
  ClientOptions options;
  options.host = spec.endpoints.front().host;
  options.port = spec.endpoints.front().port;
  options.job = std::move(spec.job);
  options.token = std::move(spec.token);
  options.connect_timeout = spec.connect_timeout;
  options.want_worker_store = true;
  options.tls = std::move(spec.access.tls);
  return make_ctrund_backend(io, std::move(options));
}

}  // namespace ctrun::rendezvous

// Where a worker finds its job's store for its round: what the agent passes in CTRUN_STORE_*
// and CTRUN_RDZV_TOKEN (docs/env.md), and what the worker runtime reads back.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/endpoint.h"
#include "ctrun/rendezvous/tls.h"

namespace ctrun::rendezvous {

// How to get into a secured rendezvous beyond its address: TLS (etcd's https, or ctrund
// --tls_cert) and, on etcd, a user. ctrund proves the job's token instead of a user.
struct StoreAccess {
  std::optional<TlsClientFiles> tls;  // set: TLS
  std::string user;                   // etcd: its auth, as this user
  std::string password_file;          // its password, read where a client is made; never logged
};

struct StoreAddress {
  std::string host;  // ctrund; with etcd the first member (where the worker's traffic goes)
  int port = 0;
  std::string prefix;  // the round's key prefix, "rdzv/<generation>/<round>/"
  std::optional<std::string> token;
  enum class Backend { kCtrund, kEtcd };
  Backend backend = Backend::kCtrund;
  std::vector<Endpoint> etcd_endpoints;  // kEtcd: every member, tried in turn
  StoreAccess access;                    // TLS (and etcd's user), as the agent reaches it
};

// The job's store on etcd: `members` (at least one; the first is `host`:`port`), round `prefix`.
inline StoreAddress etcd_store_address(std::vector<Endpoint> members, std::string prefix,
                                       StoreAccess access = {}) {
  StoreAddress a;
  a.host = members.front().host;
  a.port = members.front().port;
  a.prefix = std::move(prefix);
  a.backend = StoreAddress::Backend::kEtcd;
  a.etcd_endpoints = std::move(members);
  a.access = std::move(access);
  return a;
}

}  // namespace ctrun::rendezvous

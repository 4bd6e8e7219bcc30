// Where the agent's rendezvous is, which service keeps it, whether this agent hosts it, and the
// node rank it asks for: decided from the command line alone, with torchrun's rules
// (--standalone, --rdzv_backend=static, c10d and ctrund, etcd and etcd-v2). Pure: whether a host
// is this machine is asked of `is_local_host`.
#pragma once

#include <functional>
#include <string>

#include "ctrun/launcher/options.h"
#include "ctrun/rendezvous/error.h"
#include "rendezvous/backend/backend_spec.h"

namespace ctrun::launcher {

struct RendezvousPlan {
  // The service and its endpoints; the agent adds the job, token, timeouts and logs. A hosted
  // rendezvous on port 0 (--standalone) gets its port when the agent's server is listening.
  rendezvous::BackendSpec backend;
  bool try_host = false;    // start a rendezvous here; when that fails, another agent hosts it
  bool must_host = false;   // ... and failing to start it is an error
  int requested_rank = -1;  // a static or given --node_rank, or -1 for any
};

// How to get into the rendezvous at `endpoint` (--rdzv_endpoint) with `conf`'s keys. etcd:
// TLS when its members are https:// ones or protocol=https (then cacert, cert and key), and a
// user. ctrund (`etcd` false): TLS when protocol=tls or cacert, cert or key is given. An error
// says what does not fit (a CA without TLS, a user without a password file, a user on ctrund).
rendezvous::Result<rendezvous::StoreAccess> store_access(bool etcd, const std::string& endpoint,
                                                         const RendezvousConf& conf);

rendezvous::Result<RendezvousPlan> plan_rendezvous(
    const LaunchOptions& options, const std::function<bool(const std::string&)>& is_local_host);

}  // namespace ctrun::launcher

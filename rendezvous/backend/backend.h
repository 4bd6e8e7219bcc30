// The agent's view of a rendezvous, whichever service keeps it: ctrund (a daemon that runs the
// Rendezvous and pushes notices) or etcd (the agents run the Rendezvous themselves on a shared
// key, by compare-and-swap). The agent's logic is written against this and does not know which.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/endpoint.h"
#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"
#include "ctrun/rendezvous/round.h"
#include "ctrun/rendezvous/store_address.h"
#include "ctrun/rendezvous/task.h"
#include "rendezvous/backend/backend_spec.h"

namespace ctrun::rendezvous {

struct ClientOptions;  // ctrun/rendezvous/client.h: make_ctrund_backend's callers include it

namespace etcd {
class Kv;
struct ClientOptions;
}  // namespace etcd

// What a backend tells its agent unasked.
struct BackendEvent {
  enum class Kind {
    kRoundReopened,         // stop the workers and join round `round`
    kJobEnded,              // the job is over: `state` is "succeeded", "failed" or "closed"
    kConnectionLost,        // connect() again and resume()
    kConnectAttemptFailed,  // connect() goes on trying; `reason` says why this attempt failed
  };
  Kind kind = Kind::kConnectionLost;
  int round = 0;
  std::string state{};  // (braced: designated initializers may leave it out without a warning)
  std::string reason{};
};

class Backend {
 public:
  using EventHandler = std::function<void(const BackendEvent&)>;

  virtual ~Backend() = default;

  // Reaches the service, retrying until the connect timeout. After a connection_lost event,
  // connect() again and resume().
  virtual Task<Status> connect() = 0;
  virtual bool connected() const = 0;
  // This host's address towards the service: where peers can reach it too.
  virtual std::string local_address() const = 0;
  // Where workers can use the job's store as torch's TCPStore (TORCHELASTIC_USE_AGENT_STORE=True):
  // a port on the service's host (ctrund embedded in an agent: its own port; a ctrund with
  // --worker_store_ports: the job's own); nullopt when not served (never on etcd).
  virtual std::optional<std::uint16_t> worker_store_port() const = 0;
  // Where this node's workers reach the job's store, under the round's `prefix`
  // (RoundAssignment::store_prefix): what the agent passes to them in CTRUN_STORE_*.
  virtual StoreAddress store_address(const std::string& prefix) const = 0;
  virtual void set_event_handler(EventHandler handler) = 0;
  // Proves this node alive every `interval`. When the service stops hearing it (ctrund:
  // `max_missed` keep-alives unanswered in a row; etcd: no lease renewal for the lease's TTL) or
  // says the node is gone, a connection_lost event follows.
  virtual void start_keep_alive(Duration interval, int max_missed) = 0;
  // Says goodbye without leaving the job (the agent is exiting): the service forgets this
  // connection now instead of when its keep-alives run out.
  virtual Task<void> release() = 0;
  // Drops the connections to the service as a broken network would, without a goodbye (ctrund
  // sees them close; etcd's lease runs out unless renewed in time), and tells nobody: an
  // injected cut-off (launcher/faults/cut_off_backend.h). connect() reaches the service again.
  virtual void drop_connections() = 0;

  // Returns when the round forms with this node in it, or the join fails.
  virtual Task<Result<RoundAssignment>> join(NodeInfo node, RendezvousConfig config) = 0;
  // Takes this node's place up again after connect(): {"round", "formed", "state"}, or
  // kNotFound when the rendezvous no longer has the node.
  virtual Task<Result<Json>> resume(std::string node_id) = 0;
  virtual Task<Status> report(bool succeeded, std::string message) = 0;
  virtual Task<Status> leave() = 0;

  // The job's store, as the agents use it (c10d semantics; get's timeout as AsyncClient::get).
  virtual Task<Status> set(std::string key, std::string value) = 0;
  virtual Task<Result<std::string>> get(std::string key, std::optional<Duration> timeout) = 0;
  virtual Task<Result<std::int64_t>> add(std::string key, std::int64_t delta) = 0;
};

// ctrund, through an AsyncClient.
std::unique_ptr<Backend> make_ctrund_backend(boost::asio::io_context& io, ClientOptions options);
// A frame ctrund pushed, as the event it means; nullopt for a kind the agent does not act on. A
// frame that cannot be read is as good as a lost daemon (kConnectionLost, saying why).
std::optional<BackendEvent> backend_event_from_frame(const Json& frame);

// etcd, through its HTTP gateway (docs/etcd_gateway.md); the keys it uses: etcd_jobs.h. Of
// `spec`: the members, the job, TLS and the user (with etcd_password read), the connect
// timeout, the lease's TTL, the log and events, and connect_kv (tests: an in-memory etcd).
std::unique_ptr<Backend> make_etcd_backend(boost::asio::io_context& io, BackendSpec spec);

// Reads the secrets `spec` names from their files into it (etcd's password, from
// access.password_file): an error names the file, never its contents.
Status read_backend_secrets(BackendSpec& spec);

// The Backend `spec` names: the agent's one way in, so that it never branches on the service.
// A ctrund backend asks for the job's worker-store port (TORCHELASTIC_USE_AGENT_STORE).
std::unique_ptr<Backend> make_backend(boost::asio::io_context& io, BackendSpec spec);

}  // namespace ctrun::rendezvous

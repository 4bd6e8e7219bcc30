// Everything the daemon does, without sockets: it is fed the bytes each connection receives and
// answers through a Transport. The Asio server is a thin shell that moves bytes in and out.
// Single-threaded: call it from one thread (the server's event loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/frame.h"
#include "rendezvous/core/metrics.h"
#include "rendezvous/core/rendezvous.h"
#include "rendezvous/core/state_log.h"
#include "rendezvous/core/store.h"

namespace ctrun::rendezvous {

using ConnectionId = std::uint64_t;

// What the service needs from the network: queue bytes for a connection, close it (after what
// is queued is sent). The service never calls either for a connection it has closed.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual void send(ConnectionId id, std::string bytes) = 0;
  virtual void close(ConnectionId id) = 0;
  // ServiceOptions::worker_store_per_job: listens on a port of `job`'s own, whose connections
  // the service is given with that job (on_connect's worker_store_job); returns the port.
  virtual Result<std::uint16_t> open_worker_store(const std::string& job) {
    return Error{ErrorCode::kInternal,
                 "this transport has no worker store listeners (" + job + ")"};
  }
  // Stops listening on the job's port (the job was dropped); its open connections stay.
  virtual void close_worker_store(const std::string& /*job*/) {}
};

// How many of torch's TCPStore connections a job's worker store admits. Every rank of the job
// comes, from whatever address (one big host, or every pod behind one SNAT address), so there is
// no limit per address: the bound is against floods and follows the job's size.
struct WorkerStoreLimits {
  // Fixed (ctrund --worker_store_max_connections, an agent's --rdzv_conf
  // worker_store_max_connections); 0: derived from the job's rendezvous, `per_rank` for each
  // worker of every node it knows (torch 1.13 opens two connections a store, 2.x one, and a
  // script may open a second store) and `margin` more, never fewer than `minimum`.
  std::size_t max_connections = 0;
  std::size_t per_rank = 4;
  std::size_t margin = 1024;
  std::size_t minimum = 16384;
};

struct ServiceOptions {
  std::optional<std::string> token;  // when set, every hello must prove it
  std::size_t max_frame_bytes = kDefaultMaxFrameBytes;
  // Connections of ctrun's own protocol (agents, workers of C++ trainers, tools), in all and
  // from one address: a flood from one host cannot take every slot from the others' agents.
  // TCPStore connections count against their job's WorkerStoreLimits instead.
  std::size_t max_connections = 16384;
  std::size_t max_connections_per_host = 1024;
  WorkerStoreLimits worker_store_limits;
  // The process's open-file limit (0: unknown): a job whose worker store would need more is
  // named in the log with the numbers when its round forms. Server::create fills it in.
  std::size_t open_file_limit = 0;
  std::size_t max_waiters_per_connection = 4096;
  std::size_t max_job_bytes = 256;  // length of a job id
  StoreLimits store_limits;
  Duration hello_timeout = std::chrono::seconds(10);         // connect to hello
  Duration frame_timeout = std::chrono::seconds(10);         // first to last byte of a frame
  Duration idle_job_timeout = std::chrono::minutes(5);       // a job with no connections is dropped
  std::function<std::string(std::size_t)> random = nullptr;  // nonce source; OpenSSL when null
  std::function<void(const std::string&)> log = nullptr;
  EventSink events = nullptr;  // --event_log: each job's rendezvous events, and dropped jobs
  // --state_dir: where every change is recorded before it is acknowledged (not owned; null:
  // state lives in memory only). The journal is rewritten as a snapshot once it passes
  // compact_bytes and is larger than the last snapshot.
  StateLog* state = nullptr;
  std::uint64_t compact_bytes = 64u << 20;
  // The job whose store this daemon also serves to torch's TCPStore clients, on the same port
  // (an agent that hosts the rendezvous names its own job: TORCHELASTIC_USE_AGENT_STORE=True).
  // Connections are then told apart by their first bytes, and each TCPStore connection keeps its
  // keys under the prefix of the job's round at the time it connected (docs/protocol.md).
  std::optional<std::string> worker_store_job;
  // ctrund --worker_store_ports: every job whose agent asks for it (hello's "worker_store") has
  // its store served to torch's TCPStore clients on a port of its own, opened by the Transport
  // at the first such hello and closed when the job is dropped; the hello answer names it.
  bool worker_store_per_job = false;
};

class Service {
 public:
  Service(ServiceOptions options, const Clock& clock, Transport& transport);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  // Rebuilds the jobs recorded in options.state (call once, before the first connection). Each
  // restored node gets a fresh keep-alive window to come back and `resume` on a new connection.
  Status restore();

  // The daemon is going away (SIGTERM, Server::stop): the connections it closes now do not
  // take their nodes out of the rendezvous, so a daemon restarted from --state_dir finds them.
  void shutdown();

  // `worker_store_job`: the connection came to that job's own worker-store port and speaks
  // torch's TCPStore wire from its first byte.
  void on_connect(ConnectionId id, std::string peer,
                  std::optional<std::string> worker_store_job = std::nullopt);
  void on_data(ConnectionId id, const char* data, std::size_t size);
  void on_disconnect(ConnectionId id);
  // Applies every deadline: store waits, rendezvous timers, slow or silent connections.
  void tick();

  std::size_t num_connections() const;
  std::size_t num_jobs() const;
  // Counters since start and the jobs as they are now (ctrund --metrics_port).
  ServiceMetrics metrics() const;

 private:
  // Everything else (ctrund's ops, the jobs, the journal, the TCPStore wire) is the part's own:
  // service_impl.h.
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ctrun::rendezvous

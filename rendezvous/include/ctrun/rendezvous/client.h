// The client every other part uses to talk to ctrund.
//   AsyncClient: lives on the caller's io_context (the agent's event loop); C++20 coroutines;
//     requests are pipelined by id; events pushed by the daemon go to an event handler.
//   Client: blocking and thread-safe, its I/O done in the calling thread with no event loop
//     (the worker runtime, tests, tools); pushed events are skipped.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>

#include "ctrun/rendezvous/clock.h"
#include "ctrun/rendezvous/endpoint.h"
#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/frame.h"
#include "ctrun/rendezvous/quorum.h"
#include "ctrun/rendezvous/quorum_client.h"
#include "ctrun/rendezvous/round.h"
#include "ctrun/rendezvous/store_client.h"
#include "ctrun/rendezvous/task.h"
#include "ctrun/rendezvous/tls.h"

namespace ctrun::rendezvous {

struct ClientOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = kDefaultPort;
  std::string job = "default";       // the job (rdzv_id) whose store and rendezvous to use
  std::optional<std::string> token;  // proves the daemon's shared token
  Duration connect_timeout = std::chrono::seconds(60);  // keep retrying this long
  Duration initial_backoff = std::chrono::milliseconds(50);
  Duration max_backoff = std::chrono::seconds(2);
  Duration handshake_timeout = std::chrono::seconds(10);
  std::size_t max_frame_bytes = kDefaultMaxFrameBytes;
  // Asks a daemon that serves each job's store on a port of its own (ctrund
  // --worker_store_ports) for this job's: the agent's workers will use it.
  bool want_worker_store = false;
  // Set: TLS to a ctrund --tls_cert, its certificate checked against tls->ca_file (the
  // system's CAs when empty) and to name `host`; tls->cert_file and key_file presented when
  // given (ctrund --tls_client_ca).
  std::optional<TlsClientFiles> tls{};
};

class AsyncClient {
 public:
  // Receives every frame the daemon pushes ({"event": ...}); a lost connection arrives as
  // {"event": "connection_lost", "reason": ...}, and each failed attempt of a connect() that
  // goes on retrying as {"event": "connect_attempt_failed", "reason": ...}.
  using EventHandler = std::function<void(const Json&)>;

  AsyncClient(boost::asio::io_context& io, ClientOptions options);
  ~AsyncClient();
  AsyncClient(const AsyncClient&) = delete;
  AsyncClient& operator=(const AsyncClient&) = delete;

  // Connects with retry and backoff until connect_timeout, then says hello (proving the token
  // and checking the daemon's proof when there is one).
  Task<Status> connect();
  bool connected() const;
  // This side's address on the connection (e.g. "10.0.0.2"): where peers that reach the daemon
  // can reach this host too. Empty when not connected.
  std::string local_address() const;
  // The port where the daemon serves this job's store to torch's TCPStore clients, as its hello
  // answer said: its own port (an agent's embedded daemon) or one of the job's own (ctrund
  // --worker_store_ports, when want_worker_store asked); nullopt when it does not.
  std::optional<std::uint16_t> worker_store_port() const;
  void close();
  void set_event_handler(EventHandler handler);

  // Sends one request (an "id" is added) and returns the response, or its error. `timeout`
  // bounds the wait on this side; absent, the daemon's own deadlines apply.
  Task<Result<Json>> call(Json request, std::optional<Duration> timeout = std::nullopt);

  // Store operations (c10d TCPStore's set). For get/wait/multi_get, `timeout` absent waits as
  // long as the connection lives, zero does not wait, positive is a deadline.
  Task<Status> set(const std::string& key, const std::string& value);
  Task<Result<std::string>> get(const std::string& key, std::optional<Duration> timeout = {});
  Task<Result<std::int64_t>> add(const std::string& key, std::int64_t delta);
  Task<Result<std::string>> compare_set(const std::string& key, const std::string& expected,
                                        const std::string& desired);
  Task<Result<bool>> check(const std::vector<std::string>& keys);
  Task<Status> wait(const std::vector<std::string>& keys, std::optional<Duration> timeout = {});
  Task<Result<bool>> erase(const std::string& key);
  Task<Result<std::int64_t>> num_keys();
  Task<Result<std::vector<std::string>>> multi_get(const std::vector<std::string>& keys,
                                                   std::optional<Duration> timeout = {});
  Task<Status> multi_set(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values);
  Task<Status> ping();

  // Rendezvous. join() returns when the round forms (or fails); while it waits, keep-alives
  // must flow: start_keep_alive() sends one every `interval` until close(), and closes the
  // connection (a connection_lost event) when `max_missed` in a row go unanswered.
  Task<Result<RoundAssignment>> join(const NodeInfo& node, const RendezvousConfig& config);
  Task<Status> leave();
  // After connect() again on a lost connection: takes this node's place up on the new one
  // without asking for a new round. Answers {"round", "formed", "state"}; kNotFound when the
  // daemon no longer knows the node (it was dropped, or the daemon restarted without state).
  Task<Result<Json>> resume(const std::string& node_id);
  Task<Status> report(bool succeeded, const std::string& message);
  Task<Status> close_job();
  Task<Result<Json>> status();
  void start_keep_alive(Duration interval, int max_missed);

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;
};

class Client final : public StoreClient, public QuorumClient {
 public:
  // Connects (with retry) and says hello.
  static Result<std::unique_ptr<Client>> connect(ClientOptions options);
  ~Client() override;

  Result<Json> call(Json request, std::optional<Duration> timeout = std::nullopt);
  Status set(const std::string& key, const std::string& value) override;
  // A set that does not wait for its answer: the next call reads it on the way to its own, so
  // a set and the get after it take one round trip (set() then get() take two). Posted sets
  // and calls are answered in order: a later get sees the value. c10d's TCPStore set is
  // one-way too, but never reports an error; here an error the daemon gave a posted set is
  // returned, once, by flush() or by the first call that starts after the answer was read
  // (that call then sends nothing). A call that read it on the way returns its own answer.
  Status post_set(const std::string& key, const std::string& value);
  // Waits for the answers to every post_set so far; the first error among them, if any.
  Status flush();
  Result<std::string> get(const std::string& key, std::optional<Duration> timeout = {}) override;
  Result<std::int64_t> add(const std::string& key, std::int64_t delta) override;
  Result<std::string> compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) override;
  Result<bool> check(const std::vector<std::string>& keys) override;
  Status wait(const std::vector<std::string>& keys, std::optional<Duration> timeout = {}) override;
  Result<bool> erase(const std::string& key) override;
  Result<std::int64_t> num_keys() override;
  Result<std::vector<std::string>> multi_get(const std::vector<std::string>& keys,
                                             std::optional<Duration> timeout = {});
  Status multi_set(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  Status ping();
  Result<Json> status();
  // --fault_tolerance=step: asks for the next step's quorum and waits for it to form (up to
  // `timeout`; then kTimeout, and the next ask supersedes this one). The connection speaks for
  // the replica from then on: when it closes, the replica is gone from the quorum.
  Result<QuorumAssignment> quorum(const QuorumRequest& request,
                                  std::optional<Duration> timeout = {}) override;
  Status quorum_heartbeat(const std::string& replica, Duration timeout) override;

 private:
  class Impl;
  explicit Client(ClientOptions options);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ctrun::rendezvous

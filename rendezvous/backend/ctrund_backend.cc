// The Backend over ctrund: every call is the AsyncClient's own; pushed frames become events.
#include "rendezvous/backend/backend.h"

#include "ctrun/rendezvous/client.h"
#include "rendezvous/protocol/message.h"

namespace ctrun::rendezvous {

std::optional<BackendEvent> backend_event_from_frame(const Json& frame) {
  auto lost = [](std::string why) {
    return BackendEvent{.kind = BackendEvent::Kind::kConnectionLost, .reason = std::move(why)};
  };
  auto name = get_string(frame, "event");
  auto reason = get_string_or(frame, "reason", "");
  if (!name || !reason) return lost("malformed event from the rendezvous");
  if (name.value() == "round_reopened") {
    auto round = get_int(frame, "round");
    if (!round) return lost(round.error().message);
    return BackendEvent{.kind = BackendEvent::Kind::kRoundReopened,
                        .round = static_cast<int>(round.value()),
                        .reason = reason.value()};
  }
  if (name.value() == "job_ended") {
    auto state = get_string(frame, "state");
    if (!state) return lost(state.error().message);
    return BackendEvent{
        .kind = BackendEvent::Kind::kJobEnded, .state = state.value(), .reason = reason.value()};
  }
  if (name.value() == "connection_lost") return lost(reason.value());
  if (name.value() == "connect_attempt_failed") {
    return BackendEvent{.kind = BackendEvent::Kind::kConnectAttemptFailed,
                        .reason = reason.value()};
  }
  return std::nullopt;
}

namespace {

class CtrundBackend final : public Backend {
 public:
  CtrundBackend(boost::asio::io_context& io, ClientOptions options)
      : options_(options), client_(io, std::move(options)) {}

  Task<Status> connect() override { return client_.connect(); }
  bool connected() const override { return client_.connected(); }
  std::string local_address() const override { return client_.local_address(); }
  std::optional<std::uint16_t> worker_store_port() const override {
    return client_.worker_store_port();
  }
  StoreAddress store_address(const std::string& prefix) const override {
    StoreAddress a;
    a.host = options_.host;
    a.port = options_.port;
    a.prefix = prefix;
    a.token = options_.token;
    a.access.tls = options_.tls;
    return a;
  }
  void set_event_handler(EventHandler handler) override {
    client_.set_event_handler([handler = std::move(handler)](const Json& frame) {
      if (auto event = backend_event_from_frame(frame)) handler(*event);
    });
  }
  void start_keep_alive(Duration interval, int max_missed) override {
    client_.start_keep_alive(interval, max_missed);
  }
  Task<void> release() override {
    client_.close();
    co_return;
  }
  void drop_connections() override { client_.close(); }

  Task<Result<RoundAssignment>> join(NodeInfo node, RendezvousConfig config) override {
    co_return co_await client_.join(node, config);
  }
  Task<Result<Json>> resume(std::string node_id) override {
    co_return co_await client_.resume(node_id);
  }
  Task<Status> report(bool succeeded, std::string message) override {
    co_return co_await client_.report(succeeded, message);
  }
  Task<Status> leave() override { return client_.leave(); }

  Task<Status> set(std::string key, std::string value) override {
    co_return co_await client_.set(key, value);
  }
  Task<Result<std::string>> get(std::string key, std::optional<Duration> timeout) override {
    co_return co_await client_.get(key, timeout);
  }
  Task<Result<std::int64_t>> add(std::string key, std::int64_t delta) override {
    co_return co_await client_.add(key, delta);
  }

 private:
  const ClientOptions options_;
  AsyncClient client_;
};

}  // namespace

std::unique_ptr<Backend> make_ctrund_backend(boost::asio::io_context& io, ClientOptions options) {
  return std::make_unique<CtrundBackend>(io, std::move(options));
}

}  // namespace ctrun::rendezvous

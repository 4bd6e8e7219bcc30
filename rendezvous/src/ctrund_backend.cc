// The Backend over ctrund: every call is the AsyncClient's own.
#include "ctrun/rendezvous/backend.h"

namespace ctrun::rendezvous {

namespace {

class CtrundBackend final : public Backend {
 public:
  CtrundBackend(boost::asio::io_context& io, ClientOptions options)
      : client_(io, std::move(options)) {}

  Task<Status> connect() override { return client_.connect(); }
  bool connected() const override { return client_.connected(); }
  std::string local_address() const override { return client_.local_address(); }
  std::optional<std::uint16_t> worker_store_port() const override {
    return client_.worker_store_port();
  }
  void set_event_handler(EventHandler handler) override {
    client_.set_event_handler(std::move(handler));
  }
  void start_keep_alive(Duration interval, int max_missed) override {
    client_.start_keep_alive(interval, max_missed);
  }
  Task<void> release() override {
    client_.close();
    co_return;
  }

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
  AsyncClient client_;
};

}  // namespace

std::unique_ptr<Backend> make_ctrund_backend(boost::asio::io_context& io, ClientOptions options) {
  return std::make_unique<CtrundBackend>(io, std::move(options));
}

}  // namespace ctrun::rendezvous

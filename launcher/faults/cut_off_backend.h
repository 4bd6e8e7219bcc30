// The agent's rendezvous with a switch in front of it, for the `cut_off` fault (fault_plan.h):
// cut off, the node's connections to the rendezvous are dropped (the service sees them close, as
// when a network fails), every call fails as a call into a dead network does, and every attempt
// to connect is refused until the cut-off ends; then connect() reaches the service again and the
// agent resumes its place (or learns it lost it) as after any lost connection. Otherwise it only
// passes everything through.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "rendezvous/backend/backend.h"

namespace ctrun::launcher {

class CutOffBackend final : public rendezvous::Backend {
 public:
  using Clock = std::chrono::steady_clock;

  CutOffBackend(boost::asio::io_context& io, std::unique_ptr<rendezvous::Backend> inner);

  // Drops the connections now and refuses the rendezvous for `length`; `why` ("cut off by fault
  // 3") is in every refusal. The agent hears of it as of a lost connection.
  void cut_off(rendezvous::Duration length, const std::string& why);
  bool is_cut_off() const { return Clock::now() < until_; }

  rendezvous::Task<rendezvous::Status> connect() override;
  bool connected() const override { return !is_cut_off() && inner_->connected(); }
  std::string local_address() const override { return inner_->local_address(); }
  std::optional<std::uint16_t> worker_store_port() const override {
    return inner_->worker_store_port();
  }
  rendezvous::StoreAddress store_address(const std::string& prefix) const override {
    return inner_->store_address(prefix);
  }
  void set_event_handler(EventHandler handler) override;
  void start_keep_alive(rendezvous::Duration interval, int max_missed) override {
    inner_->start_keep_alive(interval, max_missed);
  }
  rendezvous::Task<void> release() override;
  void drop_connections() override { inner_->drop_connections(); }

  rendezvous::Task<rendezvous::Result<rendezvous::RoundAssignment>> join(
      rendezvous::NodeInfo node, rendezvous::RendezvousConfig config) override;
  rendezvous::Task<rendezvous::Result<rendezvous::Json>> resume(std::string node_id) override;
  rendezvous::Task<rendezvous::Status> report(bool succeeded, std::string message) override;
  rendezvous::Task<rendezvous::Status> leave() override;
  rendezvous::Task<rendezvous::Status> set(std::string key, std::string value) override;
  rendezvous::Task<rendezvous::Result<std::string>> get(
      std::string key, std::optional<rendezvous::Duration> timeout) override;
  rendezvous::Task<rendezvous::Result<std::int64_t>> add(std::string key,
                                                         std::int64_t delta) override;

 private:
  // What a call made while cut off gets: the error a dead network gives.
  rendezvous::Error refused() const;
  // The agent's waiting lines say why its attempt failed (outside the coroutine: g++ 12
  // miscompiles braced initializers inside coroutines).
  void tell_refused();

  std::unique_ptr<rendezvous::Backend> inner_;
  boost::asio::steady_timer timer_;
  EventHandler handler_;
  Clock::time_point until_{};
  std::string why_;
};

}  // namespace ctrun::launcher

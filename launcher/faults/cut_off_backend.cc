#include "launcher/faults/cut_off_backend.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <cmath>

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = rendezvous;

namespace {
template <class T>
rdzv::Task<T> ready(T value) {
  co_return value;
}
rdzv::Task<void> ready() { co_return; }
}  // namespace

CutOffBackend::CutOffBackend(asio::io_context& io, std::unique_ptr<rdzv::Backend> inner)
    : inner_(std::move(inner)), timer_(io) {}

void CutOffBackend::set_event_handler(EventHandler handler) {
  handler_ = std::move(handler);
  // While cut off, nothing comes from the service: whatever the dropped connections still say
  // is not heard.
  inner_->set_event_handler([this](const rdzv::BackendEvent& e) {
    if (!is_cut_off() && handler_) handler_(e);
  });
}

void CutOffBackend::cut_off(rdzv::Duration length, const std::string& why) {
  const bool was_connected = inner_->connected();
  until_ = Clock::now() + length;
  why_ = why;
  inner_->drop_connections();
  if (was_connected && handler_) {
    handler_({.kind = rdzv::BackendEvent::Kind::kConnectionLost, .reason = refused().message});
  }
}

rdzv::Error CutOffBackend::refused() const {
  const auto left = std::chrono::duration<double>(until_ - Clock::now()).count();
  return {rdzv::ErrorCode::kConnection,
          "connection refused: " + why_ + " (" +
              std::to_string(static_cast<long>(std::ceil(std::max(left, 0.0)))) + " s left)"};
}

void CutOffBackend::tell_refused() {
  if (handler_) {
    handler_(
        {.kind = rdzv::BackendEvent::Kind::kConnectAttemptFailed, .reason = refused().message});
  }
}

rdzv::Task<rdzv::Status> CutOffBackend::connect() {
  // Refused, attempt after attempt (one a second, as a node retrying a dead network), until the
  // cut-off ends.
  while (is_cut_off()) {
    tell_refused();
    timer_.expires_after(std::min<rdzv::Duration>(std::chrono::seconds(1), until_ - Clock::now()));
    co_await timer_.async_wait(asio::as_tuple(asio::use_awaitable));
  }
  co_return co_await inner_->connect();
}

rdzv::Task<void> CutOffBackend::release() {
  if (is_cut_off()) return ready();
  return inner_->release();
}

// Not coroutines themselves: each returns the inner call, or an answer made ready (g++ 12
// destroys a temporary converted in a co_return twice).
rdzv::Task<rdzv::Result<rdzv::RoundAssignment>> CutOffBackend::join(rdzv::NodeInfo node,
                                                                    rdzv::RendezvousConfig config) {
  if (is_cut_off()) return ready<rdzv::Result<rdzv::RoundAssignment>>(refused());
  return inner_->join(std::move(node), std::move(config));
}

rdzv::Task<rdzv::Result<rdzv::Json>> CutOffBackend::resume(std::string node_id) {
  if (is_cut_off()) return ready<rdzv::Result<rdzv::Json>>(refused());
  return inner_->resume(std::move(node_id));
}

rdzv::Task<rdzv::Status> CutOffBackend::report(bool succeeded, std::string message) {
  if (is_cut_off()) return ready<rdzv::Status>(refused());
  return inner_->report(succeeded, std::move(message));
}

rdzv::Task<rdzv::Status> CutOffBackend::leave() {
  if (is_cut_off()) return ready<rdzv::Status>(refused());
  return inner_->leave();
}

rdzv::Task<rdzv::Status> CutOffBackend::set(std::string key, std::string value) {
  if (is_cut_off()) return ready<rdzv::Status>(refused());
  return inner_->set(std::move(key), std::move(value));
}

rdzv::Task<rdzv::Result<std::string>> CutOffBackend::get(std::string key,
                                                         std::optional<rdzv::Duration> timeout) {
  if (is_cut_off()) return ready<rdzv::Result<std::string>>(refused());
  return inner_->get(std::move(key), timeout);
}

rdzv::Task<rdzv::Result<std::int64_t>> CutOffBackend::add(std::string key, std::int64_t delta) {
  if (is_cut_off()) return ready<rdzv::Result<std::int64_t>>(refused());
  return inner_->add(std::move(key), delta);
}

}  // namespace ctrun::launcher

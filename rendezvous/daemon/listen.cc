#include "rendezvous/daemon/listen.h"

#include "ctrun/rendezvous/endpoint.h"
#include "rendezvous/base/open_files.h"

#include <boost/asio.hpp>

#include <vector>

namespace ctrun::rendezvous {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr int kAcceptBurst = 256;

}  // namespace

void accept_loop(tcp::acceptor& acceptor, std::function<bool()> keep_going,
                 std::function<void(tcp::socket)> on_accept,
                 std::function<void(const std::string&)> on_error) {
  acceptor.async_accept([&acceptor, keep_going = std::move(keep_going),
                         on_accept = std::move(on_accept), on_error = std::move(on_error)](
                            boost::system::error_code ec, tcp::socket socket) mutable {
    if (!keep_going()) return;
    if (ec) {
      std::string line = "accept failed: " + ec.message();
      if (ec == asio::error::no_descriptors) {
        const OpenFileLimit files = open_file_limit();
        line += " (the open-file limit is " + open_file_limit_text(files.soft) + ", hard limit " +
                open_file_limit_text(files.hard) +
                ": raise it, e.g. LimitNOFILE= for the ctrund service)";
      }
      on_error(line);
      auto retry = std::make_shared<asio::steady_timer>(acceptor.get_executor(),
                                                        std::chrono::milliseconds(100));
      retry->async_wait([&acceptor, retry, keep_going, on_accept,
                         on_error](boost::system::error_code) mutable {
        if (keep_going()) {
          accept_loop(acceptor, std::move(keep_going), std::move(on_accept), std::move(on_error));
        }
      });
      return;
    }
    on_accept(std::move(socket));
    // Then whatever else the accept queue holds, before anything else runs: under a storm of
    // connects (every rank of a job at once) a queue accepted one per turn of the loop fills,
    // and each SYN the kernel then drops costs its client a second.
    acceptor.non_blocking(true, ec);
    for (int more = 0; !ec && more < kAcceptBurst && keep_going(); ++more) {
      tcp::socket next(acceptor.get_executor());
      acceptor.accept(next, ec);
      if (!ec) on_accept(std::move(next));
    }
    accept_loop(acceptor, std::move(keep_going), std::move(on_accept), std::move(on_error));
  });
}

std::string endpoint_text(const tcp::endpoint& ep) {
  return format_endpoint({ep.address().to_string(), ep.port()});
}

Status listen_on(tcp::acceptor& acceptor, const std::string& host, std::uint16_t port) {
  boost::system::error_code ec;
  std::vector<tcp::endpoint> candidates;
  if (host.empty()) {
    candidates = {tcp::endpoint(asio::ip::address_v6::any(), port),
                  tcp::endpoint(asio::ip::address_v4::any(), port)};
  } else {
    tcp::resolver resolver(acceptor.get_executor());
    auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::numeric_service, ec);
    if (ec) {
      return Error{ErrorCode::kConnection,
                   "cannot resolve listen address '" + host + "': " + ec.message()};
    }
    for (const auto& r : results) candidates.push_back(r.endpoint());
  }
  std::string last_error = "no address";
  for (const auto& ep : candidates) {
    acceptor.close(ec);
    if (acceptor.open(ep.protocol(), ec)) {
      last_error = ec.message();
      continue;
    }
    acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (ep.address().is_v6() && host.empty()) acceptor.set_option(asio::ip::v6_only(false), ec);
    if (acceptor.bind(ep, ec) || acceptor.listen(asio::socket_base::max_listen_connections, ec)) {
      last_error = ec.message();
      continue;
    }
    return ok_status();
  }
  acceptor.close(ec);
  return Error{ErrorCode::kConnection, "cannot listen on " + (host.empty() ? "*" : host) + ":" +
                                           std::to_string(port) + ": " + last_error};
}

}  // namespace ctrun::rendezvous

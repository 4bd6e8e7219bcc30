// A diagnostic client for ctrund: one blocking socket, one frame out and one frame in per op,
// no event loop or timers. It speaks the same protocol as ctrun::rendezvous::Client (the wire
// format of frame.h and message.h), so the gap between the two is the client library's cost.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "ctrun/rendezvous/frame.h"
#include "rendezvous/protocol/message.h"
#include "store_client.h"

namespace store_bench {
namespace {

namespace rdzv = ctrun::rendezvous;
using rdzv::Json;

class RawCtrunClient final : public StoreClient {
 public:
  explicit RawCtrunClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      throw std::runtime_error(std::string("connect: ") + std::strerror(errno));
    }
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Json challenge = read_frame();
    if (challenge.value("event", "") != "challenge")
      throw std::runtime_error("no challenge from ctrund");
    call(Json{{"op", "hello"}, {"version", rdzv::kProtocolVersion}, {"job", "store_bench"}});
  }
  ~RawCtrunClient() override { ::close(fd_); }

  void set(const std::string& key, const std::string& value) override {
    call(Json{{"op", "set"}, {"key", key}, {"value", rdzv::to_binary(value)}});
  }

  std::string get(const std::string& key) override {
    auto value = rdzv::get_bytes(call(Json{{"op", "get"}, {"key", key}}), "value");
    if (!value) throw std::runtime_error("get: " + value.error().message);
    return std::move(value).value();
  }

 private:
  Json call(Json request) {
    request["id"] = next_id_++;
    const std::string bytes = rdzv::encode_frame(request);
    for (std::size_t sent = 0; sent < bytes.size();) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw std::runtime_error(std::string("send: ") + std::strerror(errno));
      sent += static_cast<std::size_t>(n);
    }
    auto payload = rdzv::response_payload(read_frame());
    if (!payload) throw std::runtime_error("ctrund: " + payload.error().message);
    return std::move(payload).value();
  }

  Json read_frame() {
    while (true) {
      auto frame = decoder_.next();
      if (!frame) throw std::runtime_error("bad frame: " + frame.error().message);
      if (frame.value()) return std::move(*frame.value());
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw std::runtime_error("connection to ctrund lost");
      decoder_.feed(buf, static_cast<std::size_t>(n));
    }
  }

  int fd_ = -1;
  std::uint64_t next_id_ = 0;
  rdzv::FrameDecoder decoder_;
};

}  // namespace

std::unique_ptr<StoreClient> connect_ctrun_raw(int port) {
  return std::make_unique<RawCtrunClient>(port);
}

}  // namespace store_bench

#include "join_storm.h"

#include <boost/asio.hpp>

#include <netinet/in.h>

#include <memory>
#include <vector>

#include "ctrun/rendezvous/frame.h"
#include "rendezvous/core/rendezvous.h"
#include "rendezvous/protocol/auth.h"
#include "rendezvous/protocol/message.h"

namespace rdzv_bench {
namespace {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;
using asio::ip::tcp;
using rdzv::Json;
using Clock = std::chrono::steady_clock;

constexpr int kMaxConnecting = 128;  // connects in flight: stay well inside the listen backlog
constexpr int kConnectAttempts = 5;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

class Storm {
 public:
  explicit Storm(const StormOptions& o)
      : o_(o),
        timer_(io_),
        endpoint_(asio::ip::address_v4::loopback(), static_cast<unsigned short>(o.port)) {}

  StormResult run();

 private:
  enum class Stage { kConnecting, kChallenge, kHello, kReady, kJoined, kAnswered };
  struct Node {
    explicit Node(asio::io_context& io) : socket(io) {}
    tcp::socket socket;
    Stage stage = Stage::kConnecting;
    int attempts = 0;
    rdzv::FrameDecoder decoder;
    std::string outbox;  // the frame being written
  };

  void connect_more();
  void start_connect(std::size_t i);
  void on_connected(std::size_t i, const boost::system::error_code& ec);
  void wait_readable(std::size_t i);
  void on_readable(std::size_t i);
  bool handle_frame(std::size_t i, const Json& frame);
  bool handle_answer(std::size_t i, const Json& frame);
  void send(std::size_t i, std::string bytes);
  void start_joins();
  void arm_deadline(std::chrono::seconds d, const char* phase);
  bool fail(std::size_t i, const std::string& why) {
    return fail("node " + std::to_string(i) + ": " + why);
  }
  bool fail(const std::string& why);

  StormOptions o_;
  asio::io_context io_;
  asio::steady_timer timer_;
  tcp::endpoint endpoint_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::string> joins_;  // pre-encoded, so encoding stays out of the timed window
  std::vector<bool> rank_taken_;
  std::size_t next_to_connect_ = 0;
  int connecting_ = 0;
  int ready_ = 0;
  int answered_ = 0;
  Clock::time_point joins_sent_;
  StormResult result_;
};

StormResult Storm::run() {
  const auto n = static_cast<std::size_t>(o_.nodes);
  rank_taken_.assign(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    nodes_.push_back(std::make_unique<Node>(io_));
    joins_.push_back(rdzv::encode_frame(Json{{"op", "join"},
                                             {"id", 1},
                                             {"node", "node-" + std::to_string(i)},
                                             {"host", "127.0.0.1"},
                                             {"local_world_size", 1},
                                             {"master_port", 29500},
                                             {"min_nodes", o_.nodes},
                                             {"max_nodes", o_.nodes}}));
  }
  arm_deadline(o_.connect_deadline, "connect and hello");
  connect_more();
  io_.run();
  for (auto& node : nodes_) {
    boost::system::error_code ignored;
    node->socket.close(ignored);
  }
  return result_;
}

void Storm::arm_deadline(std::chrono::seconds d, const char* phase) {
  timer_.expires_after(d);
  timer_.async_wait([this, phase](const boost::system::error_code& ec) {
    if (ec) return;  // re-armed or finished
    fail(std::string(phase) + " did not finish in time: " + std::to_string(ready_) + " ready, " +
         std::to_string(answered_) + " answered of " + std::to_string(o_.nodes));
  });
}

bool Storm::fail(const std::string& why) {
  if (result_.error.empty()) result_.error = why;
  result_.ok = false;
  io_.stop();
  return false;
}

void Storm::connect_more() {
  while (connecting_ < kMaxConnecting && next_to_connect_ < nodes_.size()) {
    const std::size_t i = next_to_connect_++;
    ++connecting_;
    start_connect(i);
  }
}

// Node i connects from 127.1.x.y, `nodes_per_address` nodes to an address (the port is chosen at
// connect, per destination).
void Storm::start_connect(std::size_t i) {
  Node& node = *nodes_[i];
  boost::system::error_code ec;
  node.socket.close(ec);
  node.socket.open(tcp::v4(), ec);
  const int one = 1;
  setsockopt(node.socket.native_handle(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  const auto k = static_cast<std::uint32_t>(i / static_cast<std::size_t>(o_.nodes_per_address));
  const asio::ip::address_v4 from((127u << 24) | (1u << 16) | ((k / 254) << 8) | (k % 254 + 1));
  node.socket.bind(tcp::endpoint(from, 0), ec);
  if (ec) {
    fail(i, "bind " + from.to_string() + ": " + ec.message());
    return;
  }
  node.socket.async_connect(endpoint_,
                            [this, i](const boost::system::error_code& e) { on_connected(i, e); });
}

void Storm::on_connected(std::size_t i, const boost::system::error_code& ec) {
  Node& node = *nodes_[i];
  boost::system::error_code ignored;
  if (ec) {
    if (++node.attempts >= kConnectAttempts) {
      fail(i, "connect: " + ec.message());
      return;
    }
    start_connect(i);
    return;
  }
  --connecting_;
  node.socket.set_option(tcp::no_delay(true), ignored);
  node.socket.non_blocking(true, ignored);
  node.stage = Stage::kChallenge;
  wait_readable(i);
  connect_more();
}

// Waits for readiness, then reads into a buffer on the stack: waiting nodes hold no read buffer.
void Storm::wait_readable(std::size_t i) {
  auto on_ready = [this, i](const boost::system::error_code& ec) {
    if (!ec) return on_readable(i);
    fail(i, "wait: " + ec.message());
  };
  nodes_[i]->socket.async_wait(tcp::socket::wait_read, on_ready);
}

void Storm::on_readable(std::size_t i) {
  Node& node = *nodes_[i];
  char buffer[16 * 1024];
  while (true) {
    boost::system::error_code ec;
    const std::size_t n = node.socket.read_some(asio::buffer(buffer), ec);
    if (ec == asio::error::would_block) break;
    if (ec) {
      fail(i, "read: " + ec.message());
      return;
    }
    if (node.stage == Stage::kJoined) result_.answer_bytes += n;
    node.decoder.feed(buffer, n);
    if (n < sizeof buffer) break;
  }
  while (true) {
    auto frame = node.decoder.next();
    if (!frame) {
      fail(i, frame.error().message);
      return;
    }
    if (!frame.value()) break;  // needs more bytes
    if (!handle_frame(i, *frame.value())) return;
  }
  if (answered_ == o_.nodes) return;  // io_ is stopping
  wait_readable(i);
}

bool Storm::handle_frame(std::size_t i, const Json& frame) {
  Node& node = *nodes_[i];
  if (frame.contains("event")) {  // the challenge, or a push such as round_reopened
    if (node.stage != Stage::kChallenge || frame["event"] != "challenge") return true;
    node.stage = Stage::kHello;
    Json hello{{"op", "hello"}, {"id", 0}, {"version", rdzv::kProtocolVersion}, {"job", o_.job}};
    if (o_.token) {
      const auto& nonce = frame["nonce"].get_binary();
      hello["proof"] = rdzv::to_binary(
          rdzv::client_proof(*o_.token, std::string(nonce.begin(), nonce.end()), o_.job));
    }
    send(i, rdzv::encode_frame(hello));
    return true;
  }
  if (frame.contains("error")) return fail(i, "error answer " + frame.dump().substr(0, 300));
  if (node.stage == Stage::kJoined && frame.value("id", -1) == 1) return handle_answer(i, frame);
  if (node.stage == Stage::kHello && frame.value("id", -1) == 0) {
    node.stage = Stage::kReady;
    if (++ready_ == o_.nodes) start_joins();
    return true;
  }
  return fail(i, "unexpected frame " + frame.dump().substr(0, 200));
}

// An answer counts if it is ok, decodes to a whole assignment for a round of N, and its rank is
// in 0..N-1 and not yet taken (with N answers, that makes the ranks a permutation of 0..N-1).
bool Storm::handle_answer(std::size_t i, const Json& frame) {
  const auto a = rdzv::round_assignment_from_json(frame);
  if (!a) return fail(i, "join answer: " + a.error().message);
  const int n = o_.nodes;
  const int rank = a->group_rank;
  if (!frame.value("ok", false) || a->group_world_size != n || a->world_size != n || rank < 0 ||
      rank >= n || rank_taken_[static_cast<std::size_t>(rank)]) {
    return fail(i, "bad join answer " + frame.dump().substr(0, 300));
  }
  rank_taken_[static_cast<std::size_t>(rank)] = true;
  nodes_[i]->stage = Stage::kAnswered;
  const auto now = Clock::now();
  if (answered_ == 0) result_.first_answer_s = seconds(now - joins_sent_);
  if (++answered_ == n) {
    result_.join_wall_s = seconds(now - joins_sent_);
    result_.ok = true;
    timer_.cancel();
    io_.stop();
  }
  return true;
}

void Storm::send(std::size_t i, std::string bytes) {
  Node& node = *nodes_[i];
  node.outbox = std::move(bytes);
  asio::async_write(node.socket, asio::buffer(node.outbox),
                    [this, i](const boost::system::error_code& ec, std::size_t) {
                      if (ec) fail(i, "write: " + ec.message());
                    });
}

void Storm::start_joins() {
  arm_deadline(o_.join_deadline, "join");
  joins_sent_ = Clock::now();
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    nodes_[i]->stage = Stage::kJoined;
    send(i, std::move(joins_[i]));
  }
}

}  // namespace

StormResult run_join_storm(const StormOptions& options) { return Storm(options).run(); }

}  // namespace rdzv_bench

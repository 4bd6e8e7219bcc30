#include "join_storm.h"

#include <boost/asio.hpp>

#include <array>
#include <memory>
#include <string_view>
#include <vector>

#include "ctrun/rendezvous/frame.h"
#include "ctrun/rendezvous/message.h"

namespace rdzv_bench {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using ctrun::rendezvous::Json;
using Clock = std::chrono::steady_clock;

constexpr int kMaxConnecting = 128;  // connects in flight: stay well inside the listen backlog
constexpr int kConnectAttempts = 5;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Reads the top-level numbers of a join answer, and stops at a "members" roster if the daemon
// sends one: a roster makes every answer O(N) bytes, and decoding all N of them in full would
// make this one process do O(N^2) work on the same cores as the daemon. ctrund encodes maps
// with sorted keys (nlohmann::json), so group_rank, group_world_size and id come before it.
struct AnswerScan {
  int depth = 0;
  std::string top_key;
  bool has_error = false;
  bool is_event = false;
  std::int64_t id = -1;
  std::int64_t group_rank = -1;
  std::int64_t group_world_size = -1;

  bool number(std::int64_t v) {
    if (depth != 1) return true;
    if (top_key == "id") id = v;
    if (top_key == "group_rank") group_rank = v;
    if (top_key == "group_world_size") group_world_size = v;
    return true;
  }
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(Json::number_integer_t v) { return number(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return number(static_cast<std::int64_t>(v)); }
  bool number_float(Json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(Json::binary_t&) { return true; }
  bool start_object(std::size_t) { return ++depth, true; }
  bool end_object() { return --depth, true; }
  bool start_array(std::size_t) { return ++depth, true; }
  bool end_array() { return --depth, true; }
  bool key(std::string& k) {
    if (depth != 1) return true;
    top_key = k;
    if (k == "error") has_error = true;
    if (k == "event") is_event = true;
    if (k == "members") {
      return false;  // stop: the rest is the roster
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    return false;
  }
};

class Storm {
 public:
  explicit Storm(const StormOptions& o)
      : o_(o), timer_(io_), endpoint_(asio::ip::address_v4::loopback(), static_cast<unsigned short>(o.port)) {}

  StormResult run();

 private:
  enum class Stage { kIdle, kConnecting, kChallenge, kHello, kReady, kJoined, kAnswered };
  struct Node {
    explicit Node(asio::io_context& io) : socket(io) {}
    tcp::socket socket;
    Stage stage = Stage::kIdle;
    int attempts = 0;
    std::string inbox;   // received bytes not yet consumed as frames
    std::string outbox;  // the frame being written
  };

  void connect_more();
  void on_connected(std::size_t i, const boost::system::error_code& ec);
  void wait_readable(std::size_t i);
  void on_readable(std::size_t i);
  bool handle_frame(std::size_t i, std::string_view body);
  bool handle_answer(std::size_t i, std::string_view body);
  void send(std::size_t i, std::string bytes);
  void start_joins();
  void arm_deadline(std::chrono::seconds d, const char* phase);
  void fail(const std::string& why);

  StormOptions o_;
  asio::io_context io_;
  asio::steady_timer timer_;
  tcp::endpoint endpoint_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::string> joins_;  // pre-encoded, so encoding stays out of the timed window
  std::vector<bool> rank_taken_;
  std::array<char, 256 * 1024> buffer_;  // shared: reads are synchronous inside handlers
  std::size_t next_to_connect_ = 0;
  int connecting_ = 0;
  int ready_ = 0;
  int answered_ = 0;
  Clock::time_point started_, joins_sent_;
  StormResult result_;
};

StormResult Storm::run() {
  const auto n = static_cast<std::size_t>(o_.nodes);
  rank_taken_.assign(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    nodes_.push_back(std::make_unique<Node>(io_));
    Json join{{"op", "join"},
              {"id", 1},
              {"node", "node-" + std::to_string(i)},
              {"host", "127.0.0.1"},
              {"local_world_size", 1},
              {"master_port", 29500},
              {"min_nodes", o_.nodes},
              {"max_nodes", o_.nodes},
              {"join_timeout_ms", 1000 * o_.join_deadline.count()},
              // Nodes stay silent while they wait: keep the daemon from dropping them.
              {"keep_alive_interval_ms", 1000 * o_.join_deadline.count()}};
    joins_.push_back(ctrun::rendezvous::encode_frame(join));
  }
  started_ = Clock::now();
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

void Storm::fail(const std::string& why) {
  if (result_.error.empty()) result_.error = why;
  result_.ok = false;
  io_.stop();
}

void Storm::connect_more() {
  while (connecting_ < kMaxConnecting && next_to_connect_ < nodes_.size()) {
    const std::size_t i = next_to_connect_++;
    ++connecting_;
    nodes_[i]->stage = Stage::kConnecting;
    nodes_[i]->socket.async_connect(endpoint_, [this, i](const boost::system::error_code& ec) {
      on_connected(i, ec);
    });
  }
}

void Storm::on_connected(std::size_t i, const boost::system::error_code& ec) {
  Node& node = *nodes_[i];
  if (ec) {
    if (++node.attempts >= kConnectAttempts) return fail("connect: " + ec.message());
    boost::system::error_code ignored;
    node.socket.close(ignored);
    node.socket.async_connect(endpoint_, [this, i](const boost::system::error_code& e) { on_connected(i, e); });
    return;
  }
  --connecting_;
  boost::system::error_code ignored;
  node.socket.set_option(tcp::no_delay(true), ignored);
  node.socket.non_blocking(true, ignored);
  node.stage = Stage::kChallenge;
  wait_readable(i);
  connect_more();
}

void Storm::wait_readable(std::size_t i) {
  nodes_[i]->socket.async_wait(tcp::socket::wait_read, [this, i](const boost::system::error_code& ec) {
    if (ec) return fail("wait: " + ec.message());
    on_readable(i);
  });
}

void Storm::on_readable(std::size_t i) {
  Node& node = *nodes_[i];
  while (true) {
    boost::system::error_code ec;
    const std::size_t n = node.socket.read_some(asio::buffer(buffer_), ec);
    if (ec == asio::error::would_block) break;
    if (ec) return fail("node " + std::to_string(i) + ": read: " + ec.message());
    node.inbox.append(buffer_.data(), n);
    if (n < buffer_.size()) break;
  }
  // Split off whole frames: a 4-byte big-endian length, then the MessagePack body.
  std::size_t offset = 0;
  while (node.inbox.size() - offset >= ctrun::rendezvous::kFrameHeaderBytes) {
    const auto* p = reinterpret_cast<const unsigned char*>(node.inbox.data() + offset);
    const std::size_t length = (std::size_t{p[0]} << 24) | (std::size_t{p[1]} << 16) |
                               (std::size_t{p[2]} << 8) | std::size_t{p[3]};
    if (node.inbox.size() - offset < 4 + length) break;
    if (!handle_frame(i, std::string_view(node.inbox).substr(offset + 4, length))) return;
    offset += 4 + length;
  }
  node.inbox.erase(0, offset);
  if (answered_ == o_.nodes) return;  // io_ is stopping
  wait_readable(i);
}

bool Storm::handle_frame(std::size_t i, std::string_view body) {
  Node& node = *nodes_[i];
  if (node.stage == Stage::kJoined) return handle_answer(i, body);
  Json frame = Json::from_msgpack(body.begin(), body.end(), /*strict=*/true, /*allow_exceptions=*/false);
  if (frame.is_discarded()) {
    fail("node " + std::to_string(i) + ": undecodable frame");
    return false;
  }
  if (auto payload = ctrun::rendezvous::response_payload(frame); !payload) {
    fail("node " + std::to_string(i) + ": " + payload.error().message);
    return false;
  }
  if (node.stage == Stage::kChallenge && frame.value("event", "") == "challenge") {
    node.stage = Stage::kHello;
    send(i, ctrun::rendezvous::encode_frame(Json{{"op", "hello"},
                                                 {"id", 0},
                                                 {"version", ctrun::rendezvous::kProtocolVersion},
                                                 {"job", o_.job}}));
  } else if (node.stage == Stage::kHello && frame.value("id", -1) == 0) {
    node.stage = Stage::kReady;
    if (++ready_ == o_.nodes) start_joins();
  } else if (!frame.contains("event")) {
    fail("node " + std::to_string(i) + ": unexpected frame " + frame.dump().substr(0, 200));
    return false;
  }
  return true;
}

bool Storm::handle_answer(std::size_t i, std::string_view body) {
  AnswerScan scan;
  Json::sax_parse(body.begin(), body.end(), &scan, Json::input_format_t::msgpack, /*strict=*/false);
  if (scan.is_event) return true;  // e.g. a round_reopened push; not an answer
  if (scan.has_error) {
    Json frame = Json::from_msgpack(body.begin(), body.end(), true, false);
    fail("node " + std::to_string(i) + ": join failed: " + frame.dump().substr(0, 300));
    return false;
  }
  const auto n = static_cast<std::int64_t>(o_.nodes);
  if (scan.id != 1 || scan.group_world_size != n || scan.group_rank < 0 || scan.group_rank >= n ||
      rank_taken_[static_cast<std::size_t>(scan.group_rank)]) {
    fail("node " + std::to_string(i) + ": bad assignment (id " + std::to_string(scan.id) + ", rank " +
         std::to_string(scan.group_rank) + " of " + std::to_string(scan.group_world_size) + ")");
    return false;
  }
  rank_taken_[static_cast<std::size_t>(scan.group_rank)] = true;
  nodes_[i]->stage = Stage::kAnswered;
  result_.answer_bytes += body.size() + 4;
  const auto now = Clock::now();
  if (answered_ == 0) {
    result_.first_answer_s = seconds(now - joins_sent_);
    // Check one answer in full: it decodes, and a roster, if there is one, lists every node.
    Json full = Json::from_msgpack(body.begin(), body.end(), true, false);
    if (full.is_discarded() || full.value("world_size", -1) != n ||
        (full.contains("members") && full["members"].size() != static_cast<std::size_t>(n))) {
      fail("first answer is malformed: " + full.dump().substr(0, 300));
      return false;
    }
  }
  if (++answered_ == o_.nodes) {
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
                      if (ec) fail("node " + std::to_string(i) + ": write: " + ec.message());
                    });
}

void Storm::start_joins() {
  result_.connect_s = seconds(Clock::now() - started_);
  arm_deadline(o_.join_deadline, "join");
  joins_sent_ = Clock::now();
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    nodes_[i]->stage = Stage::kJoined;
    send(i, std::move(joins_[i]));
  }
}

}  // namespace

StormResult run_join_storm(const StormOptions& options) {
  auto storm = std::make_unique<Storm>(options);  // large: keep it off the stack
  return storm->run();
}

}  // namespace rdzv_bench

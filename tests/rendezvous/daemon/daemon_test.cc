// Integration tests: the real ctrund binary (and the embeddable Server) on 127.0.0.1 with
// ephemeral ports, driven by real client connections.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "catch.h"
#include "ctrun/rendezvous/client.h"
#include "ctrund_daemon.h"
#include "process.h"
#include "rendezvous/core/metrics.h"
#include "rendezvous/daemon/server.h"
#include "rendezvous/protocol/fault_keys.h"
#include "rendezvous/protocol/message.h"
#include "rendezvous/protocol/step_keys.h"
#include "skip.h"

using namespace ctrun::rendezvous;
using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

using Daemon = CtrundDaemon;

// PREFIX followed by the number. (Not "k" + std::to_string(i): g++ 12 at -O3 warns falsely on a
// literal plus a temporary string, -Wrestrict, GCC bug 105651.)
std::string numbered(const char* prefix, int n) {
  return std::string(prefix).append(std::to_string(n));
}

std::unique_ptr<Client> connect(const ClientOptions& options) {
  auto c = Client::connect(options);
  if (!c) throw std::runtime_error("connect failed: " + c.error().message);
  return std::move(c).value();
}

// Connects an AsyncClient by running `io` (bounded); true when connected.
bool connect_async(boost::asio::io_context& io, AsyncClient& client) {
  std::optional<Status> connected;
  boost::asio::co_spawn(
      io, [&]() -> Task<void> { connected = co_await client.connect(); }, boost::asio::detached);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!connected && std::chrono::steady_clock::now() < deadline) io.run_for(10ms);
  return connected && connected->ok();
}

// A plain TCP socket for speaking bytes that no client library would send.
class RawSocket {
 public:
  RawSocket(const std::string& host, std::uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    timeval tv{5, 0};  // every read is bounded
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawSocket() { close(fd_); }
  bool connected() const { return connected_; }
  void write(const std::string& bytes) {
    (void)::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  // Reads frames until the peer closes (or 5 s pass); returns them.
  std::vector<Json> read_until_closed() {
    FrameDecoder decoder;
    std::vector<Json> frames;
    char buf[4096];
    while (true) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = n == 0;
        return frames;
      }
      decoder.feed(buf, static_cast<std::size_t>(n));
      while (auto f = decoder.next()) {
        if (!f.value()) break;
        frames.push_back(*f.value());
      }
    }
  }
  bool closed() const { return closed_; }
  // Raw bytes until the peer closes (or a 5 s recv timeout).
  std::string read_all() {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd_, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<std::size_t>(n));
    return out;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
};

// GET (or HEAD) http://127.0.0.1:PORT/TARGET over a plain socket, reading until the server
// closes (Connection: close) with every recv bounded: the status and the body.
std::pair<int, std::string> http_get(std::uint16_t port, const std::string& target,
                                     const std::string& method = "GET") {
  RawSocket s("127.0.0.1", port);
  REQUIRE(s.connected());
  s.write(method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  const std::string answer = s.read_all();
  const auto head_end = answer.find("\r\n\r\n");
  REQUIRE(head_end != std::string::npos);
  REQUIRE(answer.rfind("HTTP/1.1 ", 0) == 0);
  return {std::stoi(answer.substr(9, 3)), answer.substr(head_end + 4)};
}

// The value of one sample ("name" or "name{labels}") in Prometheus text; -1 when absent.
double sample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

}  // namespace

TEST_CASE("daemon: sixteen concurrent clients keep the store consistent") {
  Daemon daemon;
  constexpr int kClients = 16;
  constexpr int kAdds = 200;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kClients; ++t) {
    threads.emplace_back([&, t] {
      auto client = connect(daemon.options());
      for (int i = 0; i < kAdds; ++i) {
        if (!client->add("counter", 1)) ++failures;
        const std::string key = numbered("k", t) + "_" + std::to_string(i);
        if (!client->set(key, std::string(32, static_cast<char>('a' + t)))) ++failures;
        auto v = client->get(key);
        if (!v || v.value() != std::string(32, static_cast<char>('a' + t))) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  auto client = connect(daemon.options());
  CHECK(client->get("counter").value() == std::to_string(kClients * kAdds));
  CHECK(client->num_keys().value() == kClients * kAdds + 1);
}

TEST_CASE("daemon: a blocking get returns when another process sets the key") {
  Daemon daemon;
  auto waiter = connect(daemon.options());
  auto setter = connect(daemon.options());
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    REQUIRE(setter->set("master_addr", "10.0.0.7"));
  });
  const auto start = std::chrono::steady_clock::now();
  auto v = waiter->get("master_addr", 5s);
  t.join();
  REQUIRE(v);
  CHECK(v.value() == "10.0.0.7");
  CHECK(std::chrono::steady_clock::now() - start < 4s);
  auto timed_out = waiter->get("never", 200ms);
  REQUIRE_FALSE(timed_out);
  CHECK(timed_out.error().code == ErrorCode::kTimeout);
  CHECK(waiter->wait({"master_addr"}, 1s).ok());
  CHECK(waiter->compare_set("master_addr", "10.0.0.7", "10.0.0.8").value() == "10.0.0.8");
  CHECK(waiter->multi_set({"a", "b"}, {"1", "2"}).ok());
  CHECK(waiter->multi_get({"b", "a"}).value() == std::vector<std::string>{"2", "1"});
  CHECK(waiter->check({"a", "b"}).value());
  CHECK(waiter->erase("a").value());
  CHECK_FALSE(waiter->check({"a", "b"}).value());
}

TEST_CASE("daemon: eight nodes rendezvous and a lost node is pushed to the others") {
  Daemon daemon;
  boost::asio::io_context io;
  constexpr int kNodes = 8;
  std::vector<std::unique_ptr<AsyncClient>> clients;
  std::vector<std::optional<Result<RoundAssignment>>> results(kNodes);
  std::vector<std::vector<Json>> events(kNodes);
  RendezvousConfig config;
  config.min_nodes = kNodes;
  config.max_nodes = kNodes;
  for (int i = 0; i < kNodes; ++i) {
    clients.push_back(std::make_unique<AsyncClient>(io, daemon.options("train")));
    clients[i]->set_event_handler([&events, i](const Json& e) { events[i].push_back(e); });
    boost::asio::co_spawn(
        io,
        [&, i]() -> Task<void> {
          Status s = co_await clients[i]->connect();
          if (!s) {
            results[i] = s.error();
            co_return;
          }
          clients[i]->start_keep_alive(1s, 3);
          NodeInfo node{"node" + std::to_string(i), "127.0.0.1", 2, 29500 + i, -1};
          results[i] = co_await clients[i]->join(node, config);
        },
        boost::asio::detached);
  }
  auto all_joined = [&] {
    return std::all_of(results.begin(), results.end(), [](const auto& r) { return r.has_value(); });
  };
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!all_joined() && std::chrono::steady_clock::now() < deadline) io.run_for(10ms);
  REQUIRE(all_joined());
  std::set<int> ranks;
  for (int i = 0; i < kNodes; ++i) {
    REQUIRE(results[i]->ok());
    const auto& a = results[i]->value();
    ranks.insert(a.group_rank);
    CHECK(a.world_size == 2 * kNodes);
    CHECK(a.rank_offset == 2 * a.group_rank);
    CHECK(a.group_world_size == kNodes);
  }
  CHECK(ranks.size() == kNodes);

  // Node 3 dies: the other seven hear of it from the daemon, not by polling.
  clients[3]->close();
  auto all_told = [&] {
    for (int i = 0; i < kNodes; ++i) {
      if (i != 3 && events[i].empty()) return false;
    }
    return true;
  };
  const auto start = std::chrono::steady_clock::now();
  while (!all_told() && std::chrono::steady_clock::now() - start < 5s) io.run_for(10ms);
  REQUIRE(all_told());
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  CHECK(events[0][0]["event"] == "round_reopened");
  CHECK(events[0][0]["round"] == 1);
  CHECK(daemon.log().find("round 0 formed: 8 nodes, world size 16") != std::string::npos);
  CHECK(daemon.log().find("node 'node3' left") != std::string::npos);
}

TEST_CASE("daemon: bad input is refused and the daemon keeps serving") {
  Daemon daemon;
  auto good = connect(daemon.options());
  REQUIRE(good->set("precious", "data"));

  SECTION("garbage instead of a frame") {
    RawSocket s("127.0.0.1", daemon.port());
    REQUIRE(s.connected());
    s.write(std::string("\x00\x00\x00\x05hello", 9));
    auto frames = s.read_until_closed();
    REQUIRE(frames.size() == 2);  // the challenge, then the error
    CHECK(frames[1]["error"]["code"] == "bad_frame");
    CHECK(s.closed());
  }
  SECTION("a length prefix over the limit") {
    RawSocket s("127.0.0.1", daemon.port());
    s.write(std::string("\x40\x00\x00\x00", 4));  // 1 GiB announced
    auto frames = s.read_until_closed();
    REQUIRE(frames.size() == 2);
    CHECK(frames[1]["error"]["code"] == "frame_too_large");
  }
  SECTION("an op before hello") {
    RawSocket s("127.0.0.1", daemon.port());
    s.write(encode_frame(Json{{"op", "get"}, {"id", 1}, {"key", "precious"}}));
    auto frames = s.read_until_closed();
    REQUIRE(frames.size() == 2);
    CHECK(frames[1]["error"]["code"] == "not_authenticated");
  }
  SECTION("a wrong protocol version") {
    RawSocket s("127.0.0.1", daemon.port());
    s.write(encode_frame(Json{{"op", "hello"}, {"id", 0}, {"version", 2}, {"job", "job"}}));
    auto frames = s.read_until_closed();
    REQUIRE(frames.size() == 2);
    CHECK(frames[1]["error"]["code"] == "bad_version");
  }
  CHECK(good->get("precious").value() == "data");
  auto fresh = connect(daemon.options());
  CHECK(fresh->get("precious").value() == "data");
  CHECK(daemon.log().find("closed:") != std::string::npos);  // the reason was logged
}

TEST_CASE("daemon: token authentication end to end") {
  const std::string token_file = temp_path("token");
  std::ofstream(token_file) << "correct horse battery staple\n";
  Daemon daemon({"--token_file", token_file});
  auto options = daemon.options();

  auto none = Client::connect(options);
  REQUIRE_FALSE(none);
  CHECK(none.error().code == ErrorCode::kAuthFailed);
  CHECK(none.error().message.find("requires a token") != std::string::npos);

  options.token = "wrong";
  auto wrong = Client::connect(options);
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().code == ErrorCode::kAuthFailed);

  options.token = "correct horse battery staple";
  auto right = Client::connect(options);
  REQUIRE(right);
  CHECK(right.value()->set("k", "v").ok());
  // The token never appears in the daemon's log.
  CHECK(daemon.log().find("correct horse") == std::string::npos);
  std::remove(token_file.c_str());
}

TEST_CASE("daemon: a client holding a token will not talk to a daemon without one") {
  Daemon daemon;
  auto options = daemon.options();
  options.token = "mine";
  auto c = Client::connect(options);
  REQUIRE_FALSE(c);
  CHECK(c.error().code == ErrorCode::kAuthFailed);
  CHECK(c.error().message.find("holds no token") != std::string::npos);
}

TEST_CASE("daemon: a full daemon is retried until a connection frees up") {
  Daemon daemon({"--max_connections", "1"});
  auto first = connect(daemon.options());
  std::thread releaser([&] {
    std::this_thread::sleep_for(300ms);
    first.reset();
  });
  auto options = daemon.options();
  options.connect_timeout = 5s;
  auto second = Client::connect(options);
  releaser.join();
  REQUIRE(second);
  CHECK(second.value()->ping().ok());
  CHECK(daemon.log().find("connections already open") != std::string::npos);
}

TEST_CASE("daemon: binds only the address it is given") {
  Daemon daemon;  // 127.0.0.1
  RawSocket other("127.0.0.2", daemon.port());
  CHECK_FALSE(other.connected());
  RawSocket same("127.0.0.1", daemon.port());
  CHECK(same.connected());
}

TEST_CASE(
    "daemon: started at a soft open-file limit of 256, it takes the hard limit and serves "
    "more connections than the soft one allowed") {
  rlimit mine{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &mine) == 0);
  if (mine.rlim_max != RLIM_INFINITY && mine.rlim_max < 1024) {
    CTRUN_SKIP("the hard open-file limit here is below 1024");
  }
  rlimit low = mine;
  low.rlim_cur = 256;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::unique_ptr<Daemon> daemon;
  try {
    daemon = std::make_unique<Daemon>();  // inherits the low soft limit
  } catch (...) {
    setrlimit(RLIMIT_NOFILE, &mine);
    throw;
  }
  REQUIRE(setrlimit(RLIMIT_NOFILE, &mine) == 0);
  // /proc/PID/limits: "Max open files  <soft>  <hard>  files".
  std::ifstream limits("/proc/" + std::to_string(daemon->process().pid()) + "/limits");
  std::string line, soft, hard;
  while (std::getline(limits, line)) {
    if (line.rfind("Max open files", 0) != 0) continue;
    std::istringstream words(line.substr(14));
    words >> soft >> hard;
  }
  CHECK(soft == hard);
  CHECK(daemon->log().find("open files " + soft + ")") != std::string::npos);
  // 400 connections (under the per-host limit), then a client is still served.
  std::vector<std::unique_ptr<RawSocket>> held;
  for (int i = 0; i < 400; ++i) {
    held.push_back(std::make_unique<RawSocket>("127.0.0.1", daemon->port()));
    REQUIRE(held.back()->connected());
  }
  auto client = connect(daemon->options());
  CHECK(client->ping().ok());
  CHECK(daemon->log().find("accept failed") == std::string::npos);
}

TEST_CASE("daemon: SIGTERM and SIGINT stop it cleanly") {
  for (int signo : {SIGTERM, SIGINT}) {
    Daemon daemon;
    auto client = connect(daemon.options());
    daemon.process().signal(signo);
    auto code = daemon.process().wait(5s);
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    CHECK(daemon.log().find(signo == SIGTERM ? "stopping on SIGTERM" : "stopping on SIGINT") !=
          std::string::npos);
  }
}

TEST_CASE("daemon: bad flags give one clear line and exit 2") {
  const std::string log = temp_path("badflags.log");
  for (auto args : std::vector<std::vector<std::string>>{{"--port", "http"},
                                                         {"--max_frame_bytes", "1"},
                                                         {"--token_file", "/nonexistent/token"},
                                                         {"--worker_store_ports", "9-8"},
                                                         {"--frobnicate"}}) {
    std::remove(log.c_str());
    std::vector<std::string> argv = {CTRUND_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    ChildProcess p(argv, log);
    auto code = p.wait(5s);
    REQUIRE(code.has_value());
    CHECK(*code == 2);
    const std::string out = read_file(log);
    INFO(out);
    CHECK(out.rfind("ctrund: error: ", 0) == 0);
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  }
  std::remove(log.c_str());
}

TEST_CASE("daemon: --worker_store_ports reads auto, a port or a range") {
  CHECK(parse_port_range("auto").value().first == 0);
  CHECK(parse_port_range("auto").value().last == 0);
  CHECK(parse_port_range("30000").value().last == 30000);
  auto range = parse_port_range("30000-30099");
  REQUIRE(range.ok());
  CHECK(range.value().first == 30000);
  CHECK(range.value().last == 30099);
  for (const char* bad : {"", "0", "65536", "30-20", "1-", "-5", "a-b", " 80", "80 "}) {
    INFO(bad);
    CHECK_FALSE(parse_port_range(bad).ok());
  }
}

TEST_CASE("daemon: a busy port is a clear error") {
  Daemon first;
  const std::string log = temp_path("busy.log");
  ChildProcess second({CTRUND_PATH, "--host", "127.0.0.1", "--port", std::to_string(first.port())},
                      log);
  auto code = second.wait(5s);
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK(read_file(log).find("cannot listen on 127.0.0.1:" + std::to_string(first.port())) !=
        std::string::npos);
  std::remove(log.c_str());
}

TEST_CASE("client: posted sets are answered in order, and their errors reported once, later") {
  Daemon daemon;
  auto client = Client::connect(daemon.options("posted"));
  REQUIRE(client);
  Client& c = *client.value();
  // More than the client keeps unanswered (256): it reads answers as it goes.
  for (int i = 0; i < 600; ++i) {
    REQUIRE(c.post_set(numbered("k", i), numbered("v", i)).ok());
  }
  // A call after posted sets sees their values (one connection, answered in order).
  auto last = c.get("k599", 0s);
  REQUIRE(last);
  CHECK(last.value() == "v599");
  CHECK(c.num_keys().value() == 600);
  CHECK(c.flush().ok());

  // The daemon refuses a key over its limit: post_set does not wait to hear it; the next call
  // reads the refusal on the way to its own answer, and the call after reports it instead of
  // sending its own request.
  REQUIRE(c.post_set(std::string(9000, 'x'), "v").ok());
  REQUIRE(c.post_set("after", "1").ok());
  CHECK(c.get("k0", 0s).value() == "v0");
  auto refused = c.get("k1", 0s);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == ErrorCode::kLimit);
  CHECK(refused.error().message.rfind("an earlier post_set failed: key of 9000 bytes", 0) == 0);
  // Reported once; the set posted after it went through.
  CHECK(c.get("after", 0s).value() == "1");
  CHECK(c.flush().ok());
  REQUIRE(c.post_set(std::string(9000, 'y'), "v").ok());
  auto flushed = c.flush();
  REQUIRE_FALSE(flushed);
  CHECK(flushed.error().code == ErrorCode::kLimit);
  CHECK(c.flush().ok());

  // A set posted to a daemon that is gone is an error too, not silence: at once, or at flush.
  daemon.process().signal(SIGKILL);
  REQUIRE(daemon.process().wait(10s));
  Status lost = c.post_set("lost", "1");
  if (lost.ok()) lost = c.flush();
  REQUIRE_FALSE(lost);
  CHECK(lost.error().code == ErrorCode::kConnection);
  INFO(lost.error().message);
  CHECK(c.flush().ok());  // reported once
}

TEST_CASE("client: connect retries until the daemon is up, and gives up with a clear error") {
  // Find a free port, then start the daemon on it only after the client began retrying.
  std::uint16_t port = 0;
  {
    boost::asio::io_context io;
    boost::asio::ip::tcp::acceptor probe(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
    port = probe.local_endpoint().port();
  }
  ClientOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.connect_timeout = 10s;
  std::unique_ptr<ChildProcess> late;
  const std::string log = temp_path("late.log");
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    late =
        std::make_unique<ChildProcess>(std::vector<std::string>{CTRUND_PATH, "--host", "127.0.0.1",
                                                                "--port", std::to_string(port)},
                                       log);
  });
  auto client = Client::connect(options);
  starter.join();
  REQUIRE(client);
  CHECK(client.value()->ping().ok());
  client.value().reset();
  late.reset();
  std::remove(log.c_str());

  options.connect_timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  auto nobody = Client::connect(options);
  REQUIRE_FALSE(nobody);
  CHECK(nobody.error().code == ErrorCode::kConnection);
  CHECK(nobody.error().message.find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
}

TEST_CASE("client: a killed daemon is reported as connection_lost") {
  Daemon daemon;
  boost::asio::io_context io;
  AsyncClient client(io, daemon.options());
  std::vector<Json> events;
  client.set_event_handler([&](const Json& e) { events.push_back(e); });
  REQUIRE(connect_async(io, client));
  daemon.process().signal(SIGKILL);
  REQUIRE(daemon.process().wait(5s));
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (events.empty() && std::chrono::steady_clock::now() < deadline) io.run_for(10ms);
  REQUIRE(events.size() == 1);
  CHECK(events[0]["event"] == "connection_lost");
  CHECK_FALSE(client.connected());
}

TEST_CASE("client: a daemon that stops answering keep-alives is reported as connection_lost") {
  Daemon daemon;
  boost::asio::io_context io;
  AsyncClient client(io, daemon.options());
  std::vector<Json> events;
  client.set_event_handler([&](const Json& e) { events.push_back(e); });
  REQUIRE(connect_async(io, client));
  client.start_keep_alive(50ms, 3);
  // Frozen, not dead: the socket stays open, only answers stop.
  daemon.process().signal(SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  while (events.empty() && std::chrono::steady_clock::now() - start < 5s) io.run_for(10ms);
  daemon.process().signal(SIGCONT);
  REQUIRE(events.size() == 1);
  CHECK(events[0]["event"] == "connection_lost");
  CHECK(events[0]["reason"].get<std::string>().find("keep-alives") != std::string::npos);
  CHECK_FALSE(client.connected());
}

TEST_CASE("server: embedded, silent and slow clients are cut off on its own timers") {
  boost::asio::io_context io;
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.tick_interval = 10ms;
  options.service.hello_timeout = 200ms;
  options.service.frame_timeout = 300ms;
  auto server = Server::create(io, options);
  REQUIRE(server);
  server.value()->start();
  const std::uint16_t port = server.value()->port();
  std::thread loop([&] { io.run_for(5s); });

  RawSocket silent("127.0.0.1", port);
  const auto start = std::chrono::steady_clock::now();
  auto frames = silent.read_until_closed();
  CHECK(silent.closed());
  CHECK(std::chrono::steady_clock::now() - start < 2s);
  REQUIRE(frames.size() == 2);
  CHECK(frames[1]["error"]["code"] == "timeout");

  // One byte every 100 ms: the frame never completes within 300 ms.
  RawSocket slow("127.0.0.1", port);
  const std::string hello =
      encode_frame(Json{{"op", "hello"}, {"id", 0}, {"version", 1}, {"job", "j"}});
  std::size_t sent = 0;
  for (; sent < hello.size() && sent < 8; ++sent) {
    slow.write(hello.substr(sent, 1));
    std::this_thread::sleep_for(100ms);
  }
  auto slow_frames = slow.read_until_closed();
  CHECK(slow.closed());
  REQUIRE_FALSE(slow_frames.empty());
  CHECK(slow_frames.back()["error"]["code"] == "timeout");

  boost::asio::post(io, [&] { server.value()->stop(); });
  io.stop();
  loop.join();
}

TEST_CASE("daemon: SIGKILLed and restarted with --state_dir, nothing acknowledged is lost") {
  ScratchDir dir("state_dir");
  const std::string state = dir.path("state");
  const std::uint16_t port = free_port();
  auto first =
      std::make_unique<Daemon>(std::vector<std::string>{"--state_dir", state}, "127.0.0.1", port);
  ClientOptions options = first->options();
  options.connect_timeout = 10s;
  {
    auto client = connect(options);
    for (int i = 0; i < 200; ++i) {
      REQUIRE(client->set(numbered("k", i), std::string(100, char('a' + i % 26))));
    }
    REQUIRE(client->add("counter", 7).value() == 7);
    REQUIRE(client->erase("k0").value());
    // One node in a 1:1 job: its round forms at once.
    auto joined = client->call(Json{{"op", "join"},
                                    {"node", "n0"},
                                    {"host", "127.0.0.1"},
                                    {"local_world_size", 2},
                                    {"min_nodes", 1},
                                    {"max_nodes", 1},
                                    {"keep_alive_interval_ms", 5000}});
    REQUIRE(joined);
    REQUIRE(joined.value()["group_rank"] == 0);
    first->process().signal(SIGKILL);
    REQUIRE(first->process().wait(5s).has_value());
  }
  // A record the dying daemon was half-way through: dropped, with a line that says so.
  {
    std::ofstream journal(state + "/journal", std::ios::app | std::ios::binary);
    journal << std::string("\x40\x00\x00\x00\x12\x34", 6);
  }

  Daemon second({"--state_dir", state}, "127.0.0.1", port);
  auto client = connect(options);
  const std::string log = second.log();
  INFO(log);
  CHECK(log.find("dropped 6 bytes at the journal's end") != std::string::npos);
  CHECK(log.find("restored 1 job(s), 200 key(s), 1 node(s)") != std::string::npos);
  CHECK(client->get("k1", 0ms).value() == std::string(100, 'b'));
  CHECK(client->get("k199", 0ms).value() == std::string(100, char('a' + 199 % 26)));
  CHECK(client->get("k0", 0ms).error().code == ErrorCode::kNotFound);
  CHECK(client->add("counter", 1).value() == 8);
  auto resumed = client->call(Json{{"op", "resume"}, {"node", "n0"}});
  REQUIRE(resumed);
  CHECK(resumed.value()["round"] == 0);
  CHECK(resumed.value()["formed"] == true);

  // The directory is this daemon's while it runs.
  ChildProcess third({CTRUND_PATH, "--host", "127.0.0.1", "--port", "0", "--state_dir", state},
                     dir.path("third.log"));
  auto code = third.wait(5s);
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK(read_file(dir.path("third.log")).find("is in use by another ctrund") != std::string::npos);
}

TEST_CASE("daemon: under a connection flood from one host, agents elsewhere still rendezvous") {
  Daemon daemon({"--max_connections", "150", "--max_connections_per_host", "100"});
  // 300 connections from 127.0.0.2 that never say hello: without the per-host limit they would
  // hold every slot until the hello timeout (10 s).
  std::vector<int> flood;
  for (int i = 0; i < 300; ++i) {
    const int fd = connect_from("127.0.0.2", daemon.port());
    REQUIRE(fd >= 0);
    flood.push_back(fd);
  }
  // Two nodes from 127.0.0.1 form a round, each on its own connection.
  const auto start = std::chrono::steady_clock::now();
  const auto errors = join_round_of_two(daemon.options("flooded"));
  const auto took = std::chrono::steady_clock::now() - start;
  for (int fd : flood) close(fd);
  INFO(daemon.log());
  for (const auto& e : errors) CHECK(e.empty());  // each in a round of 2
  CHECK(took < 3s);
  CHECK(daemon.log().find("100 connections already open from 127.0.0.2") != std::string::npos);
  CHECK(connect(daemon.options())->ping().ok());  // and it goes on serving
}

TEST_CASE(
    "daemon: --metrics_port counts a scripted job, promtool accepts it, --event_log tells it") {
  ScratchDir dir("metrics");
  std::ofstream(dir.path("token")) << "metrics token\n";
  Daemon daemon({"--token_file", dir.path("token"), "--metrics_port", "0", "--metrics_port_file",
                 dir.path("metrics.port"), "--event_log", dir.path("events.jsonl")});
  auto port_text = wait_for_file(dir.path("metrics.port"), 10s);
  REQUIRE(port_text);
  const auto metrics_port = static_cast<std::uint16_t>(std::stoi(*port_text));

  // One wrong token, one malformed frame.
  auto options = daemon.options("m");
  options.token = "wrong";
  REQUIRE_FALSE(Client::connect(options));
  {
    RawSocket raw("127.0.0.1", daemon.port());
    raw.write(std::string("\x00\x00\x00\x05hello", 9));
    raw.read_until_closed();
  }

  // A two-node job: round formed, one restart taken, both nodes succeed.
  options.token = "metrics token";
  boost::asio::io_context io;
  AsyncClient a(io, options), b(io, options);
  RendezvousConfig config;
  config.min_nodes = config.max_nodes = 2;
  int finished = 0;
  // The node id by value and NodeInfo built before co_await: a coroutine keeps references, and
  // g++ 12 mishandles temporaries inside a co_await operand.
  auto node = [&](AsyncClient& c, std::string id, bool takes_restart) -> Task<void> {
    if (!co_await c.connect()) co_return;
    const NodeInfo info{id, "127.0.0.1", 1, 29500, -1};
    auto joined = co_await c.join(info, config);
    if (!joined) co_return;
    if (takes_restart) {
      (void)co_await c.add(kRestartsKey, 1);
      (void)co_await c.add(kFaultsInjectedKey, 1);  // as an agent that injected one
      // As node 0's agent judges its job's step times: rank 1 three times the median.
      const std::string verdict =
          R"({"round": 0, "factor": 2, "median_seconds_per_step": 0.25, "stragglers": [1],)"
          R"( "ranks": [{"rank": 0, "seconds_per_step": 0.25, "slowdown": 1, "straggler": false},)"
          R"( {"rank": 1, "seconds_per_step": 0.75, "slowdown": 3, "straggler": true}]})";
      (void)co_await c.set(kStragglersKey, verdict);
    }
    if (co_await c.report(true, "")) ++finished;
  };

  boost::asio::co_spawn(io, node(a, "a", true), boost::asio::detached);
  boost::asio::co_spawn(io, node(b, "b", false), boost::asio::detached);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (finished < 2 && std::chrono::steady_clock::now() < deadline) io.run_for(10ms);
  REQUIRE(finished == 2);

  auto [status, text] = http_get(metrics_port, "/metrics");
  INFO(text);
  REQUIRE(status == 200);
  CHECK(sample(text, "ctrund_auth_failures_total") == 1);
  CHECK(sample(text, "ctrund_frame_errors_total") == 1);
  CHECK(sample(text, "ctrund_connections_accepted_total") == 4);
  CHECK(sample(text, "ctrund_connections") == 2);
  CHECK(sample(text, "ctrund_rounds_formed_total") == 1);
  CHECK(sample(text, "ctrund_restarts_total") == 1);
  CHECK(sample(text, "ctrund_requests_total{op=\"join\"}") == 2);
  CHECK(sample(text, "ctrund_requests_total{op=\"report\"}") == 2);
  CHECK(sample(text, "ctrund_jobs{state=\"succeeded\"}") == 1);
  CHECK(sample(text, "ctrund_jobs{state=\"running\"}") == 0);
  CHECK(sample(text, "ctrund_nodes") == 2);
  CHECK(sample(text, "ctrund_job_restarts{job=\"m\"}") == 1);
  CHECK(sample(text, "ctrund_faults_injected_total") == 1);
  CHECK(sample(text, "ctrund_job_faults_injected{job=\"m\"}") == 1);
  CHECK(sample(text, "ctrund_job_round{job=\"m\"}") == 0);
  CHECK(sample(text, "ctrund_job_step_seconds_median{job=\"m\"}") == 0.25);
  CHECK(sample(text, "ctrund_job_stragglers{job=\"m\"}") == 1);
  CHECK(sample(text, "ctrund_job_straggler_slowdown{job=\"m\",rank=\"1\"}") == 3);
  CHECK(text.find("ctrund_job_straggler_slowdown{job=\"m\",rank=\"0\"}") == std::string::npos);
  // A verdict without own times (an agent before them): its median is the pace; rank 1 holds
  // every step of the others for 0.75 - 0.25 s.
  CHECK(sample(text, "ctrund_job_straggler_holds_seconds{job=\"m\",rank=\"1\"}") == 0.5);

  // Prometheus's own linter accepts the exposition (where it is installed: scripts/setup.sh
  // installs it; a GPU machine built with scripts/gpu-build.sh may lack it).
  if (std::filesystem::exists("/usr/bin/promtool")) {
    std::ofstream(dir.path("scrape.txt")) << text;
    const std::string check = "promtool check metrics < " + dir.path("scrape.txt") + " 2>&1";
    std::FILE* p = popen(check.c_str(), "r");
    REQUIRE(p != nullptr);
    std::string promtool_output;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) promtool_output += buf;
    const int rc = pclose(p);
    INFO(promtool_output);
    CHECK(rc == 0);
  } else {
    WARN("promtool check skipped: /usr/bin/promtool is not installed (Debian's prometheus)");
  }

  CHECK(http_get(metrics_port, "/nope").first == 404);
  auto head = http_get(metrics_port, "/metrics", "HEAD");
  CHECK(head.first == 200);
  CHECK(head.second.empty());

  std::vector<std::string> events;
  std::istringstream lines(read_file(dir.path("events.jsonl")));
  for (std::string line; std::getline(lines, line);) {
    const Json e = Json::parse(line);
    CHECK(e.at("source") == "ctrund");
    events.push_back(e.at("event"));
  }
  CHECK(events == std::vector<std::string>{"daemon_start", "join", "join", "round",
                                           "node_succeeded", "node_succeeded", "job_end"});
}

TEST_CASE("client: three replicas form each step's quorum through ctrund, a killed one is let go") {
  Daemon daemon;
  std::vector<std::unique_ptr<Client>> replicas;
  for (int i = 0; i < 3; ++i) {
    auto c = Client::connect(daemon.options("ft"));
    REQUIRE(c);
    replicas.push_back(std::move(c).value());
  }
  auto request = [](const std::string& replica, std::int64_t step) {
    QuorumRequest r;
    r.member = QuorumMember{replica, step, replica + ":7000"};
    r.config.max_replicas = 3;
    r.config.join_timeout = 5s;
    return r;
  };
  // Blocking calls: each replica asks from a thread of its own, as each worker would.
  auto step = [&](std::int64_t n, int count) {
    std::vector<std::optional<Result<QuorumAssignment>>> got(count);
    std::vector<std::thread> threads;
    for (int i = 0; i < count; ++i) {
      threads.emplace_back(
          [&, i] { got[i] = replicas[i]->quorum(request(std::string(1, char('a' + i)), n), 10s); });
    }
    for (auto& t : threads) t.join();
    return got;
  };
  auto first = step(0, 3);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(first[i]->ok());
    CHECK(first[i]->value().rank == i);
    CHECK(first[i]->value().quorum_id == 1);
  }
  // c's process dies: its connection closes, and a and b's next quorum does not wait 5 s for it.
  replicas[2].reset();
  const auto start = std::chrono::steady_clock::now();
  auto second = step(1, 2);
  CHECK(std::chrono::steady_clock::now() - start < 2s);
  for (int i = 0; i < 2; ++i) {
    REQUIRE(second[i]->ok());
    CHECK(second[i]->value().quorum_id == 2);
    CHECK(second[i]->value().members.size() == 2);
  }
  CHECK(replicas[0]->quorum_heartbeat("a", 5s).ok());
  // An ask the quorum cannot answer in time is a timeout, not a hang.
  auto alone = replicas[0]->quorum(request("a", 2), 300ms);
  REQUIRE_FALSE(alone.ok());
  CHECK(alone.error().code == ErrorCode::kTimeout);
}

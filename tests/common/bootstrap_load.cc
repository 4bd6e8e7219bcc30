#include "bootstrap_load.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

namespace bootstrap_load {
namespace {

namespace ts = ctrun::rendezvous::tcpstore;
using Clock = std::chrono::steady_clock;

// Keys as torch's client writes them: TCPStore puts "/" before every key but its own "init/"
// (which every client adds 1 to as it connects). The barrier is torch 2.x's store-based barrier.
constexpr const char* kInitKey = "init/";
constexpr const char* kUniqueIdKey = "/default_pg/0";
constexpr const char* kBarrierKey = "/store_based_barrier_key:1";
constexpr const char* kLastWorkerKey = "/store_based_barrier_key:1:last_worker";

constexpr std::uint32_t kPingNonce = 0x5eed1234;
constexpr int kFirstSourcePort = 1024;
constexpr int kConnectAttempts = 5;
constexpr auto kRetryDelay = std::chrono::milliseconds(50);

enum class Stage {
  kQueued,        // not connected yet (or waiting to retry)
  kConnecting,    // connect() in flight
  kPing,          // torch 2.2+: VALIDATE and PING sent, as its client connects
  kInit,          // ADD init/ 1 sent
  kUniqueIdWait,  // WAIT [unique id] sent
  kUniqueIdGet,   // GET unique id sent
  kBarrierAdd,    // ADD barrier 1 sent
  kBarrierWait,   // WAIT [last worker] sent
  kDone,          // through the barrier
};
constexpr int kStages = static_cast<int>(Stage::kDone) + 1;

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::kQueued:
      return "not connected";
    case Stage::kConnecting:
      return "connecting";
    case Stage::kPing:
      return "PING";
    case Stage::kInit:
      return "ADD init/";
    case Stage::kUniqueIdWait:
      return "WAIT unique id";
    case Stage::kUniqueIdGet:
      return "GET unique id";
    case Stage::kBarrierAdd:
      return "ADD barrier";
    case Stage::kBarrierWait:
      return "WAIT last worker";
    case Stage::kDone:
      return "done";
  }
  return "?";
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

std::string encode(ts::Dialect d, ts::Op op, std::vector<std::string> keys,
                   std::vector<std::string> values = {}, std::int64_t number = 0) {
  ts::Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.number = number;
  return ts::encode_request(d, r);
}

struct Rank {
  int fd = -1;
  Stage stage = Stage::kQueued;
  int attempts = 0;
  bool want_write = false;  // EPOLLOUT armed
  std::string in;           // answer bytes not yet consumed
  std::string out;          // request bytes not yet written
  Clock::time_point connected, unique_id, done;
};

class Load {
 public:
  explicit Load(const LoadOptions& o);
  ~Load();
  Load(const Load&) = delete;
  Load& operator=(const Load&) = delete;
  LoadResult run();

 private:
  void start_connect(std::size_t i);
  void on_event(std::size_t i, std::uint32_t events);
  void on_connected(std::size_t i);
  void on_readable(std::size_t i);
  void advance(std::size_t i);
  void send(std::size_t i, const std::string& bytes);
  void set_interest(std::size_t i, bool write);
  void retry_or_fail(std::size_t i, const std::string& why);
  bool bind_next_port(int fd);
  void fail(std::size_t i, const std::string& why);
  std::string progress() const;

  LoadOptions o_;
  int epoll_ = -1;
  sockaddr_in addr_{};
  std::vector<Rank> ranks_;
  std::string unique_id_;  // rank 0's value, which every other rank must read back
  // The requests, encoded before the clock starts.
  std::string ping_, init_, set_id_, wait_id_, get_id_, barrier_add_, set_last_, wait_last_;
  std::size_t next_ = 0;
  int connecting_ = 0;
  int done_ = 0;
  int retries_ = 0;
  int next_port_ = kFirstSourcePort;
  long requests_ = 0;
  std::deque<std::pair<Clock::time_point, std::size_t>> retry_queue_;
  Clock::time_point t0_;
  std::string error_;
};

Load::Load(const LoadOptions& o) : o_(o), ranks_(static_cast<std::size_t>(o.ranks)) {
  const ts::Dialect d = o.dialect;
  unique_id_.resize(static_cast<std::size_t>(o.value_bytes));
  for (std::size_t i = 0; i < unique_id_.size(); ++i) unique_id_[i] = static_cast<char>(i % 251);
  if (d == ts::Dialect::kValidated) {
    ts::Request ping;
    ping.op = ts::Op::kPing;
    ping.nonce = kPingNonce;
    ping_ = ts::encode_validate() + ts::encode_request(d, ping);
  }
  init_ = encode(d, ts::Op::kAdd, {kInitKey}, {}, 1);
  set_id_ = encode(d, ts::Op::kSet, {kUniqueIdKey}, {unique_id_});
  wait_id_ = encode(d, ts::Op::kWait, {kUniqueIdKey});
  get_id_ = encode(d, ts::Op::kGet, {kUniqueIdKey});
  barrier_add_ = encode(d, ts::Op::kAdd, {kBarrierKey}, {}, 1);
  set_last_ = encode(d, ts::Op::kSet, {kLastWorkerKey}, {"1"});
  wait_last_ = encode(d, ts::Op::kWait, {kLastWorkerKey});
  addr_.sin_family = AF_INET;
  addr_.sin_port = htons(static_cast<std::uint16_t>(o.port));
  if (inet_pton(AF_INET, o.host.c_str(), &addr_.sin_addr) != 1) {
    error_ = "not an IPv4 address: '" + o.host + "'";
  }
}

// Rank i's source address when the ranks come from many: 127.1.0.1 onwards, skipping .0 and .255.
in_addr source_address(std::size_t i, int count) {
  const auto k = static_cast<std::uint32_t>(i % static_cast<std::size_t>(count));
  in_addr a{};
  a.s_addr = htonl((127u << 24) | (1u << 16) | ((k / 254) << 8) | (k % 254 + 1));
  return a;
}

Load::~Load() {
  for (auto& r : ranks_) {
    if (r.fd < 0) continue;
    // Reset rather than close: no TIME_WAIT left behind by thousands of connections per run.
    const linger reset{1, 0};
    setsockopt(r.fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    ::close(r.fd);
  }
  if (epoll_ >= 0) ::close(epoll_);
}

void Load::start_connect(std::size_t i) {
  Rank& r = ranks_[i];
  r.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (r.fd < 0) return fail(i, std::string("socket: ") + std::strerror(errno));
  const int one = 1;
  setsockopt(r.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // as torch's client does
  if (o_.source_addresses > 1) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr = source_address(i, o_.source_addresses);
    // The port is chosen at connect, per destination: no address runs out of ephemeral ports.
    setsockopt(r.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    if (::bind(r.fd, reinterpret_cast<const sockaddr*>(&from), sizeof from) != 0)
      return fail(i, std::string("bind: ") + std::strerror(errno));
  } else if (!bind_next_port(r.fd)) {
    return fail(i, std::string("bind: ") + std::strerror(errno));
  }
  r.stage = Stage::kConnecting;
  ++connecting_;
  epoll_event ev{};
  ev.events = EPOLLOUT;
  ev.data.u64 = i;
  if (epoll_ctl(epoll_, EPOLL_CTL_ADD, r.fd, &ev) != 0)
    return fail(i, std::string("epoll_ctl: ") + std::strerror(errno));
  r.want_write = true;
  if (::connect(r.fd, reinterpret_cast<const sockaddr*>(&addr_), sizeof addr_) == 0) {
    if (!o_.paced) --connecting_;
    on_connected(i);
  } else if (errno != EINPROGRESS) {
    const int err = errno;
    --connecting_;
    ::close(r.fd);
    r.fd = -1;
    retry_or_fail(i, std::strerror(err));
  }
}

// From one address, each connection's source port is picked here, in turn, rather than by the
// kernel's search for a free ephemeral port, which grows with the ports in use and would make
// the generator, not the server, what a run of thousands of ranks measures.
bool Load::bind_next_port(int fd) {
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr = addr_.sin_addr;  // the address the server sees: the one it listens on
  for (int tries = 0; tries < 1000; ++tries) {
    next_port_ = next_port_ >= 65535 ? kFirstSourcePort : next_port_ + 1;
    from.sin_port = htons(static_cast<std::uint16_t>(next_port_));
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&from), sizeof from) == 0) return true;
    if (errno != EADDRINUSE) return false;
  }
  return false;
}

void Load::retry_or_fail(std::size_t i, const std::string& why) {
  Rank& r = ranks_[i];
  if (++r.attempts >= kConnectAttempts)
    return fail(i, "connect: " + why + " (" + std::to_string(r.attempts) + " attempts)");
  ++retries_;
  r.stage = Stage::kQueued;
  retry_queue_.emplace_back(Clock::now() + kRetryDelay, i);
}

void Load::fail(std::size_t i, const std::string& why) {
  if (!error_.empty()) return;
  error_ = "rank " + std::to_string(i) + " (" + stage_name(ranks_[i].stage) + ") after " +
           std::to_string(static_cast<int>(seconds(Clock::now() - t0_) * 1e3)) + " ms: " + why;
}

void Load::set_interest(std::size_t i, bool write) {
  Rank& r = ranks_[i];
  if (r.want_write == write) return;
  epoll_event ev{};
  ev.events = EPOLLIN | (write ? EPOLLOUT : 0u);
  ev.data.u64 = i;
  if (epoll_ctl(epoll_, EPOLL_CTL_MOD, r.fd, &ev) != 0)
    return fail(i, std::string("epoll_ctl: ") + std::strerror(errno));
  r.want_write = write;
}

void Load::send(std::size_t i, const std::string& bytes) {
  Rank& r = ranks_[i];
  r.out += bytes;
  while (!r.out.empty()) {
    const ssize_t n = ::send(r.fd, r.out.data(), r.out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      r.out.erase(0, static_cast<std::size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      return fail(i, std::string("send: ") + std::strerror(errno));
    }
  }
  set_interest(i, !r.out.empty());
}

void Load::on_event(std::size_t i, std::uint32_t events) {
  Rank& r = ranks_[i];
  if (r.stage == Stage::kConnecting) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(r.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == 0) {
      if (!o_.paced) --connecting_;
      return on_connected(i);
    }
    --connecting_;
    ::close(r.fd);  // also leaves the epoll set
    r.fd = -1;
    return retry_or_fail(i, std::strerror(err));
  }
  if ((events & EPOLLOUT) != 0) send(i, std::string());
  if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) on_readable(i);
}

void Load::on_connected(std::size_t i) {
  Rank& r = ranks_[i];
  r.connected = Clock::now();
  r.stage = ping_.empty() ? Stage::kInit : Stage::kPing;
  set_interest(i, false);
  requests_ += ping_.empty() ? 1 : 2;
  send(i, ping_.empty() ? init_ : ping_);
}

void Load::on_readable(std::size_t i) {
  Rank& r = ranks_[i];
  char buf[16384];
  const ssize_t n = ::recv(r.fd, buf, sizeof buf, 0);
  if (n == 0) return fail(i, "the server closed the connection");
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
    return fail(i, std::string("recv: ") + std::strerror(errno));
  }
  r.in.append(buf, static_cast<std::size_t>(n));
  advance(i);
}

// Consumes whole answers and sends each next request, as torch's blocking client would.
void Load::advance(std::size_t i) {
  Rank& r = ranks_[i];
  auto take_i64 = [&r](std::int64_t& v) {
    if (r.in.size() < 8) return false;
    std::memcpy(&v, r.in.data(), 8);
    r.in.erase(0, 8);
    return true;
  };
  auto take_stop_waiting = [&](bool& got) {
    got = false;
    if (r.in.empty()) return true;
    if (static_cast<std::uint8_t>(r.in[0]) != ts::kStopWaiting) {
      fail(i, "WAIT answered " + std::to_string(static_cast<std::uint8_t>(r.in[0])));
      return false;
    }
    r.in.erase(0, 1);
    got = true;
    return true;
  };
  const auto n = static_cast<std::int64_t>(o_.ranks);
  while (error_.empty() && !r.in.empty()) {
    switch (r.stage) {
      case Stage::kPing: {
        if (r.in.size() < 4) return;
        std::uint32_t nonce = 0;
        std::memcpy(&nonce, r.in.data(), 4);
        if (nonce != kPingNonce) return fail(i, "PING answered " + std::to_string(nonce));
        r.in.erase(0, 4);
        r.stage = Stage::kInit;
        ++requests_;
        send(i, init_);
        break;
      }
      case Stage::kInit: {
        std::int64_t v = 0;
        if (!take_i64(v)) return;
        if (v < 1 || v > n) return fail(i, "ADD init/ answered " + std::to_string(v));
        if (o_.paced) --connecting_;
        if (i == 0) {  // rank 0 publishes the id (SET has no answer) and goes on
          r.unique_id = Clock::now();
          r.stage = Stage::kBarrierAdd;
          requests_ += 2;
          send(i, set_id_ + barrier_add_);
        } else {
          r.stage = Stage::kUniqueIdWait;
          ++requests_;
          send(i, wait_id_);
        }
        break;
      }
      case Stage::kUniqueIdWait: {
        bool got = false;
        if (!take_stop_waiting(got) || !got) return;
        r.stage = Stage::kUniqueIdGet;
        ++requests_;
        send(i, get_id_);
        break;
      }
      case Stage::kUniqueIdGet: {
        if (r.in.size() < 8) return;
        std::uint64_t len = 0;
        std::memcpy(&len, r.in.data(), 8);
        if (len != unique_id_.size())
          return fail(i, "GET answered " + std::to_string(len) + " bytes");
        if (r.in.size() < 8 + len) return;
        if (r.in.compare(8, len, unique_id_) != 0) return fail(i, "GET answered another value");
        r.in.erase(0, 8 + len);
        r.unique_id = Clock::now();
        r.stage = Stage::kBarrierAdd;
        ++requests_;
        send(i, barrier_add_);
        break;
      }
      case Stage::kBarrierAdd: {
        std::int64_t v = 0;
        if (!take_i64(v)) return;
        if (v < 1 || v > n) return fail(i, "ADD barrier answered " + std::to_string(v));
        r.stage = Stage::kBarrierWait;
        requests_ += v == n ? 2 : 1;
        send(i, v == n ? set_last_ + wait_last_ : wait_last_);  // the last one in opens it
        break;
      }
      case Stage::kBarrierWait: {
        bool got = false;
        if (!take_stop_waiting(got) || !got) return;
        r.done = Clock::now();
        r.stage = Stage::kDone;
        ++done_;
        break;
      }
      default:
        return fail(i, std::to_string(r.in.size()) + " unexpected bytes");
    }
  }
}

std::string Load::progress() const {
  int count[kStages] = {};
  for (const auto& r : ranks_) ++count[static_cast<int>(r.stage)];
  std::string out;
  for (int s = 0; s < kStages; ++s) {
    if (count[s] == 0) continue;
    out += (out.empty() ? "" : ", ") + std::to_string(count[s]) + " " +
           stage_name(static_cast<Stage>(s));
  }
  return out;
}

LoadResult Load::run() {
  LoadResult result;
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_ < 0) {
    result.error = std::string("epoll_create1: ") + std::strerror(errno);
    return result;
  }
  if (!error_.empty()) {
    result.error = error_;
    return result;
  }
  std::vector<epoll_event> events(1024);
  const double cpu0 = cpu_seconds();
  t0_ = Clock::now();
  const auto deadline = t0_ + o_.timeout;
  while (done_ < o_.ranks && error_.empty()) {
    while (error_.empty() && connecting_ < o_.connect_window && next_ < ranks_.size())
      start_connect(next_++);
    const auto now = Clock::now();
    while (error_.empty() && !retry_queue_.empty() && retry_queue_.front().first <= now) {
      const std::size_t i = retry_queue_.front().second;
      retry_queue_.pop_front();
      start_connect(i);
    }
    if (!error_.empty()) break;
    if (now > deadline) {
      error_ = "timed out after " + std::to_string(o_.timeout.count()) + " s";
      break;
    }
    const int wait_ms = retry_queue_.empty() ? 100 : 5;
    const int got = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), wait_ms);
    if (got < 0 && errno != EINTR) {
      error_ = std::string("epoll_wait: ") + std::strerror(errno);
      break;
    }
    for (int k = 0; k < got && error_.empty(); ++k)
      on_event(static_cast<std::size_t>(events[static_cast<std::size_t>(k)].data.u64),
               events[static_cast<std::size_t>(k)].events);
  }
  result.generator_cpu_s = cpu_seconds() - cpu0;
  result.connect_retries = retries_;
  result.requests = requests_;
  if (!error_.empty()) {
    result.error = error_ + "; ranks: " + progress();
    return result;
  }
  for (const auto& r : ranks_) {
    result.connected_s = std::max(result.connected_s, seconds(r.connected - t0_));
    result.unique_id_s = std::max(result.unique_id_s, seconds(r.unique_id - t0_));
    result.wall_s = std::max(result.wall_s, seconds(r.done - t0_));
  }
  result.ok = true;
  return result;
}

}  // namespace

LoadResult run_bootstrap(const LoadOptions& options) {
  Load load(options);
  return load.run();
}

}  // namespace bootstrap_load

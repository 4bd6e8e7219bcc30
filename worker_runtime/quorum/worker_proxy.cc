#include "worker_runtime/quorum/worker_proxy.h"

#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <iostream>
#include <mutex>
#include <thread>

#include "worker_runtime/quorum/proxy_messages.h"
#include "worker_runtime/quorum/quorum_asker.h"

namespace ctrun::worker {

using rendezvous::Error;
using rendezvous::ErrorCode;
using rendezvous::Json;

namespace {

// Requests for one thread, in order.
class RequestQueue {
 public:
  void push(ProxyRequest r) {
    {
      std::lock_guard lock(mutex_);
      requests_.push_back(std::move(r));
    }
    ready_.notify_one();
  }
  ProxyRequest pop() {
    std::unique_lock lock(mutex_);
    ready_.wait(lock, [this] { return !requests_.empty(); });
    ProxyRequest r = std::move(requests_.front());
    requests_.pop_front();
    return r;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<ProxyRequest> requests_;
};

class Proxy {
 public:
  Proxy(WorkerEnv env, int out_fd)
      : env_(std::move(env)), job_(env_.run_id.empty() ? "default" : env_.run_id), out_(out_fd) {}

  void dispatch(ProxyRequest r) {
    if (is_store_op(r.op)) {
      store_requests_.push(std::move(r));
    } else {
      quorum_requests_.push(std::move(r));
    }
  }

  void write_line(const std::string& line) {
    std::lock_guard lock(out_mutex_);
    const std::string text = line + "\n";
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(out_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // the worker is gone: its input closes next
      done += static_cast<std::size_t>(n);
    }
  }

  [[noreturn]] void serve_quorum() {
    for (;;) {
      ProxyRequest r = quorum_requests_.pop();
      auto answer = guarded([&] { return answer_quorum(r); });
      write_line(answer ? proxy_reply(r.id, std::move(answer).value())
                        : proxy_error(r.id, answer.error()));
    }
  }

  [[noreturn]] void serve_store() {
    for (;;) {
      ProxyRequest r = store_requests_.pop();
      if (!store_) {
        auto connected = rendezvous::connect_store(*env_.store, job_, std::chrono::seconds(30));
        if (!connected) {
          write_line(proxy_error(r.id, connected.error()));
          continue;
        }
        store_ = std::move(connected).value();
      }
      auto answer = guarded([&] { return answer_store_request(*store_, r); });
      if (!answer && answer.error().code == ErrorCode::kConnection) store_.reset();
      write_line(answer ? proxy_reply(r.id, std::move(answer).value())
                        : proxy_error(r.id, answer.error()));
    }
  }

  // Between asks the replica beats, four times per heartbeat timeout, as FaultTolerance does.
  [[noreturn]] void beat() {
    for (;;) {
      std::chrono::milliseconds period(100);
      {
        std::unique_lock lock(asker_mutex_);
        asker_ready_.wait(lock, [this] { return asker_ != nullptr; });
        period = std::chrono::duration_cast<std::chrono::milliseconds>(
            asker_->config().heartbeat_timeout / 4);
      }
      std::this_thread::sleep_for(period);
      asker_->heartbeat_if_idle();
    }
  }

 private:
  // A field of an unexpected type (nlohmann's value() throws) is the request's mistake: an
  // error answer, never the end of the proxy.
  template <typename Answer>
  static rendezvous::Result<Json> guarded(Answer answer) {
    try {
      return answer();
    } catch (const std::exception& e) {
      return Error{ErrorCode::kBadRequest, std::string("a field of the request: ") + e.what()};
    }
  }

  rendezvous::Result<Json> answer_quorum(const ProxyRequest& r) {
    const Json& b = r.body;
    const auto within = std::chrono::milliseconds(b.value("timeout_ms", std::int64_t{300000}));
    if (r.op == "connect") {
      auto config = proxy_quorum_config(b);
      if (!config) return config.error();
      if (asker_) return Error{ErrorCode::kBadRequest, "connect: already connected"};
      auto asker = QuorumAsker::connect(env_, config.value(), within);
      if (!asker) return asker.error();
      {
        std::lock_guard lock(asker_mutex_);
        asker_ = std::move(asker).value();
      }
      asker_ready_.notify_all();
      return Json::object();
    }
    if (!asker_) return Error{ErrorCode::kBadRequest, r.op + ": connect first"};
    if (r.op == "quorum") {
      if (!b.contains("committed") || !b["committed"].is_number_integer()) {
        return Error{ErrorCode::kBadRequest, "the request's 'committed' must be an integer"};
      }
      auto a = asker_->ask(b["committed"].get<std::int64_t>(), b.value("rebuild", false), within);
      if (!a) return a.error();
      return proxy_quorum_answer(a.value());
    }
    if (!b.contains("step") || !b["step"].is_number_integer()) {
      return Error{ErrorCode::kBadRequest, "the request's 'step' must be an integer"};
    }
    if (auto s = asker_->finish(b["step"].get<std::int64_t>(), within); !s) return s.error();
    return Json::object();
  }

  const WorkerEnv env_;
  const std::string job_;
  const int out_;
  std::mutex out_mutex_;
  RequestQueue quorum_requests_;
  RequestQueue store_requests_;
  std::unique_ptr<rendezvous::StoreClient> store_;  // the store thread's
  std::mutex asker_mutex_;                          // asker_ is set once, then only read
  std::condition_variable asker_ready_;
  std::unique_ptr<QuorumAsker> asker_;
};

}  // namespace

int run_worker_proxy(const EnvLookup& lookup, int in_fd, int out_fd) {
  auto env = read_worker_env(lookup);
  if (!env) {
    std::cerr << "ctrun worker-proxy: " << env.error().message << std::endl;
    return 2;
  }
  if (!env.value().fault_tolerant || !env.value().store) {
    std::cerr << "ctrun worker-proxy: not a worker of ctrun --fault_tolerance=step with the "
                 "job's store (CTRUN_FAULT_TOLERANCE=step and CTRUN_STORE_ADDR or "
                 "CTRUN_STORE_BACKEND=etcd)"
              << std::endl;
    return 2;
  }
  // Not freed: threads that block in asks and store waits are not joined (worker_proxy.h).
  auto* proxy = new Proxy(std::move(env).value(), out_fd);
  std::thread([proxy] { proxy->serve_quorum(); }).detach();
  std::thread([proxy] { proxy->serve_store(); }).detach();
  std::thread([proxy] { proxy->beat(); }).detach();

  std::string pending;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(in_fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, static_cast<std::size_t>(n));
    for (std::size_t end; (end = pending.find('\n')) != std::string::npos;) {
      const std::string line = pending.substr(0, end);
      pending.erase(0, end + 1);
      if (line.empty()) continue;
      auto request = parse_proxy_request(line);
      if (!request) {
        // No id to answer to: the worker's side is broken, and says so on its stderr.
        std::cerr << "ctrun worker-proxy: " << request.error().message << std::endl;
        proxy->write_line(proxy_error(-1, request.error()));
        continue;
      }
      proxy->dispatch(std::move(request).value());
    }
  }
  return 0;
}

void exit_with_parent() {
  const pid_t parent = ::getppid();
  std::thread([parent] {
    for (;;) {
      if (::getppid() != parent) ::_exit(0);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }).detach();
}

}  // namespace ctrun::worker

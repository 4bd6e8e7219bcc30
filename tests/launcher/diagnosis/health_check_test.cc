// TORCHELASTIC_HEALTH_CHECK_PORT (issue 43): the agent answers a scheduler's liveness probe over
// HTTP from its start (before any round forms) to its exit, saying where it is; a value that is
// no port is a warning, as in torch's agent; a port the agent cannot have is an error at start.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "catch.h"
#include "process.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;

namespace {

// One GET over a fresh connection to 127.0.0.1:`port`: the whole answer, or "" when nothing
// answers.
std::string http_get(std::uint16_t port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  timeval limit{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request =
        "GET " + path + " HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n";
    if (::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n = 0;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) answer.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return answer;
}

// Polls (bounded) until an answer holds `text`; the last answer.
std::string wait_for_answer(std::uint16_t port, const std::string& text,
                            std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string answer;
  while (std::chrono::steady_clock::now() < deadline) {
    answer = http_get(port, "/healthz");
    if (answer.find(text) != std::string::npos) break;
    std::this_thread::sleep_for(50ms);
  }
  return answer;
}

}  // namespace

TEST_CASE("health port: alive before the round forms, with the workers while they run") {
  ScratchDir s("health_port");
  const std::uint16_t port = free_port();
  const std::uint16_t rdzv = free_port();
  // Two nodes asked for, one started: the agent waits for the round.
  ChildProcess waiting(
      {"/usr/bin/env", "TORCHELASTIC_HEALTH_CHECK_PORT=" + std::to_string(port), CTRUN_PATH,
       "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
       "--rdzv_endpoint=127.0.0.1:" + std::to_string(rdzv), TEST_WORKER_PATH, "sleep", "30"},
      s.path("waiting.log"));
  std::string answer = wait_for_answer(port, "\"phase\":\"joining\"", 10s);
  INFO(read_file(s.path("waiting.log")));
  INFO(answer);
  CHECK(answer.rfind("HTTP/1.1 200 OK", 0) == 0);
  CHECK(answer.find("Content-Type: application/json") != std::string::npos);
  CHECK(answer.find("\"status\":\"alive\"") != std::string::npos);
  CHECK(answer.find("\"phase\":\"joining\"") != std::string::npos);
  CHECK(answer.find("\"workers\"") == std::string::npos);  // none yet
  waiting.signal(SIGTERM);
  REQUIRE(waiting.wait(10s).has_value());
  CHECK(http_get(port, "/").empty());  // gone with the agent

  ChildProcess running(
      {"/usr/bin/env", "TORCHELASTIC_HEALTH_CHECK_PORT=" + std::to_string(port), CTRUN_PATH,
       "--standalone", "--nproc_per_node=2", TEST_WORKER_PATH, "sleep", "30"},
      s.path("running.log"));
  answer = wait_for_answer(port, "\"workers\"", 10s);
  INFO(read_file(s.path("running.log")));
  INFO(answer);
  CHECK(answer.find("\"phase\":\"running\"") != std::string::npos);
  CHECK(answer.find("\"local_rank\":1") != std::string::npos);
  CHECK(answer.find("\"pid\":0") == std::string::npos);  // every worker has its pid
  // Any path answers (a probe's path is the operator's choice); HEAD too.
  CHECK(http_get(port, "/livez").rfind("HTTP/1.1 200 OK", 0) == 0);
  running.signal(SIGTERM);
  REQUIRE(running.wait(10s).has_value());
}

TEST_CASE("health port: a value that is no port is a warning, a port in use is an error") {
  ScratchDir s("health_port_bad");
  ChildProcess warned({"/usr/bin/env", "TORCHELASTIC_HEALTH_CHECK_PORT=http", CTRUN_PATH,
                       "--standalone", "--nproc_per_node=1", TEST_WORKER_PATH, "exit", "0"},
                      s.path("warned.log"));
  CHECK(warned.wait(30s) == std::optional<int>(0));
  CHECK(read_file(s.path("warned.log"))
            .find("TORCHELASTIC_HEALTH_CHECK_PORT='http' is not a port number (1-65535): no "
                  "health check server") != std::string::npos);

  // Someone else listens there: the probe would be answered by them, so the agent refuses.
  SilentListener other(/*every_interface=*/true);
  const std::string taken = std::to_string(other.port());
  ChildProcess refused({"/usr/bin/env", "TORCHELASTIC_HEALTH_CHECK_PORT=" + taken, CTRUN_PATH,
                        "--standalone", "--nproc_per_node=1", TEST_WORKER_PATH, "exit", "0"},
                       s.path("refused.log"));
  CHECK(refused.wait(30s) == std::optional<int>(1));
  const std::string log = read_file(s.path("refused.log"));
  INFO(log);
  CHECK(log.find("error: TORCHELASTIC_HEALTH_CHECK_PORT=" + taken + ": ") != std::string::npos);
  CHECK(log.find("worker") == std::string::npos);  // no worker started
}

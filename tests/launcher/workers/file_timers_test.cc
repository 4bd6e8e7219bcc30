// torch's file timer: the requests' parsing and the timers' bookkeeping (file_timers.h), and the
// agent's pipe end (file_timer_server.h) with real processes and a pipe in a temporary directory.
#include "launcher/workers/file_timers.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <chrono>
#include <filesystem>

#include "catch.h"
#include "launcher/workers/file_timer_server.h"
#include "process.h"

using namespace ctrun::launcher;
using namespace std::chrono_literals;

TEST_CASE("file timers: requests as torch's FileTimerClient writes them") {
  auto acquire = parse_file_timer_request(
      R"({"version": 1, "pid": 4242, "scope_id": "train_step", "expiration_time": 1764288000.5, "signal": 9})");
  REQUIRE(acquire.ok());
  CHECK(acquire.value().pid == 4242);
  CHECK(acquire.value().scope_id == "train_step");
  CHECK(acquire.value().expiration_time == 1764288000.5);
  CHECK(acquire.value().signal == 9);
  auto release = parse_file_timer_request(
      R"({"version": 1, "pid": 4242, "scope_id": "train_step", "expiration_time": -1, "signal": 0})");
  REQUIRE(release.ok());
  CHECK(release.value().expiration_time < 0);
  // torch's client passes a negative signal through: no kill.
  auto negative = parse_file_timer_request(
      R"({"pid": 7, "scope_id": "s", "expiration_time": 10, "signal": -15})");
  REQUIRE(negative.ok());
  CHECK(negative.value().signal == 0);
}

TEST_CASE("file timers: a bad request is an error naming the field, never a crash") {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "not a JSON object"},
      {"[1, 2]", "not a JSON object"},
      {R"({"scope_id": "s", "expiration_time": 1, "signal": 9})", "\"pid\""},
      {R"({"pid": -3, "scope_id": "s", "expiration_time": 1, "signal": 9})", "\"pid\""},
      {R"({"pid": 99999999999, "scope_id": "s", "expiration_time": 1, "signal": 9})", "\"pid\""},
      {R"({"pid": 3, "scope_id": 5, "expiration_time": 1, "signal": 9})", "\"scope_id\""},
      {R"({"pid": 3, "scope_id": "s", "expiration_time": "soon", "signal": 9})",
       "\"expiration_time\""},
      {R"({"pid": 3, "scope_id": "s", "expiration_time": 1, "signal": 4096})", "\"signal\""},
      {R"({"pid": 3, "scope_id": "s", "expiration_time": 1})", "\"signal\""},
  };
  for (const auto& [line, field] : bad) {
    auto parsed = parse_file_timer_request(line);
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.error().message.find(field) != std::string::npos);
  }
}

TEST_CASE("file timers: expired timers come once per pid, earliest first, with the first signal") {
  FileTimers timers;
  timers.apply({.pid = 10, .scope_id = "b", .expiration_time = 105, .signal = 0});
  timers.apply({.pid = 10, .scope_id = "a", .expiration_time = 103, .signal = 0});
  timers.apply({.pid = 10, .scope_id = "c", .expiration_time = 104, .signal = SIGTERM});
  timers.apply({.pid = 11, .scope_id = "a", .expiration_time = 200, .signal = SIGKILL});
  CHECK(timers.size() == 4);
  CHECK(timers.take_expired(102.9).empty());
  auto expired = timers.take_expired(105);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].pid == 10);
  CHECK(expired[0].scopes == std::vector<std::string>{"a", "c", "b"});
  CHECK(expired[0].signal == SIGTERM);
  CHECK(expired[0].signal_scope == "c");
  CHECK(timers.pids() == std::vector<int>{11});  // pid 10's timers are all gone with it
  CHECK(timers.take_expired(150).empty());
}

TEST_CASE("file timers: a release or a new expiry replaces the timer of that pid and scope") {
  FileTimers timers;
  timers.apply({.pid = 5, .scope_id = "step", .expiration_time = 10, .signal = SIGKILL});
  timers.apply({.pid = 5, .scope_id = "step", .expiration_time = 20, .signal = SIGKILL});
  CHECK(timers.take_expired(15).empty());  // extended
  timers.apply({.pid = 5, .scope_id = "step", .expiration_time = -1, .signal = 0});
  CHECK(timers.size() == 0);
  CHECK(timers.take_expired(1e12).empty());
  // A timer that expires without a signal is still taken (and the worker left alone).
  timers.apply({.pid = 6, .scope_id = "quiet", .expiration_time = 1, .signal = 0});
  auto expired = timers.take_expired(2);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].signal == 0);
  timers.apply({.pid = 7, .scope_id = "x", .expiration_time = 1, .signal = SIGKILL});
  timers.apply({.pid = 8, .scope_id = "x", .expiration_time = 1, .signal = SIGKILL});
  timers.forget(7);
  CHECK(timers.pids() == std::vector<int>{8});
}

namespace {

// A child in a process group of its own, as the agent's workers are; it sleeps until killed.
pid_t start_sleeper() {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    for (;;) pause();
  }
  setpgid(pid, pid);
  return pid;
}

// Reaps `pid` within `limit`: its wait status, or -1 when it still runs (then it is killed).
int reap_within(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// What torch's client does: open without blocking, write one line, close.
bool send_line(const std::string& path, const std::string& line) {
  const int fd = open(path.c_str(), O_WRONLY | O_NONBLOCK);
  if (fd < 0) return false;
  const std::string text = line + "\n";
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  return ok;
}

std::string request(int pid, const std::string& scope, double expiration, int signal) {
  return "{\"version\": 1, \"pid\": " + std::to_string(pid) + ", \"scope_id\": \"" + scope +
         "\", \"expiration_time\": " + std::to_string(expiration) +
         ", \"signal\": " + std::to_string(signal) + "}";
}

}  // namespace

TEST_CASE("file timer server: a worker whose timer expires is killed, a stranger is not") {
  ctrun::testing::ScratchDir dir("file_timer");
  const std::string path = dir.path() + "/watchdog_timer_test";
  boost::asio::io_context io;
  const pid_t worker = start_sleeper();
  const pid_t stranger = start_sleeper();
  double now = 1000;
  std::vector<FileTimerReap> reaped;
  std::vector<std::string> said;
  FileTimerServer::Hooks hooks;
  hooks.worker_of_group = [&](int pgid) -> std::optional<int> {
    if (pgid == worker) return 3;
    return std::nullopt;
  };
  hooks.reaped = [&](const FileTimerReap& r) { reaped.push_back(r); };
  hooks.say = [&](const std::string& line) { said.push_back(line); };
  hooks.now = [&] { return now; };
  auto server = FileTimerServer::create(io, path, hooks);
  REQUIRE(server.ok());
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  CHECK((st.st_mode & 0777) == 0600);

  REQUIRE(send_line(path, request(worker, "released", 1001, SIGKILL)));
  REQUIRE(send_line(path, request(worker, "released", -1, 0)));
  REQUIRE(send_line(path, "garbage"));
  REQUIRE(send_line(path, request(worker, "step", 1002, SIGKILL)));
  REQUIRE(send_line(path, request(stranger, "step", 1002, SIGKILL)));
  io.run_for(300ms);
  CHECK(reaped.empty());  // nothing expired yet on the server's clock
  REQUIRE(said.size() == 1);
  CHECK(said[0].find("file timer request: not a JSON object") != std::string::npos);

  now = 1003;
  io.run_for(300ms);
  REQUIRE(reaped.size() == 1);
  CHECK(reaped[0].local_rank == 3);
  CHECK(reaped[0].pid == worker);
  CHECK(reaped[0].scopes == std::vector<std::string>{"step"});
  CHECK(reaped[0].signal == SIGKILL);
  const int status = reap_within(worker, 5s);
  CHECK((status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
  REQUIRE(said.size() == 2);
  CHECK(said[1].find("pid " + std::to_string(stranger)) != std::string::npos);
  CHECK(said[1].find("not a process of this agent's workers") != std::string::npos);
  CHECK(reap_within(stranger, 100ms) == -1);  // still running: killed here by the test

  server.value().reset();
  CHECK_FALSE(std::filesystem::exists(path));  // the pipe goes with the server
}

TEST_CASE("file timer server: a pipe that cannot be made is an error naming it") {
  boost::asio::io_context io;
  FileTimerServer::Hooks hooks;
  hooks.worker_of_group = [](int) { return std::nullopt; };
  hooks.reaped = [](const FileTimerReap&) {};
  hooks.say = [](const std::string&) {};
  auto server = FileTimerServer::create(io, "/nonexistent-dir/watchdog_timer_x", hooks);
  REQUIRE_FALSE(server.ok());
  CHECK(server.error().message.find("/nonexistent-dir/watchdog_timer_x") != std::string::npos);
}

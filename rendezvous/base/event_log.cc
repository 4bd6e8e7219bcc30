#include "rendezvous/base/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "rendezvous/base/durable_file.h"
#include "rendezvous/base/log.h"

namespace ctrun::rendezvous {

std::string utc_stamp(std::chrono::system_clock::time_point at) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(at);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(at.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[40];
  const std::size_t n = std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(stamp + n, sizeof stamp - n, ".%03dZ", static_cast<int>(ms < 0 ? ms + 1000 : ms));
  return stamp;
}

std::string format_event(std::chrono::system_clock::time_point at, const std::string& source,
                         const std::string& host, int pid, const std::string& event, Json fields) {
  // In this order, for people reading the file; the fields follow.
  nlohmann::ordered_json line;
  line["time"] = utc_stamp(at);
  line["source"] = source;
  line["host"] = host;
  line["pid"] = pid;
  line["event"] = event;
  if (fields.is_object()) {
    for (auto& [key, value] : fields.items()) {
      if (!line.contains(key)) line[key] = std::move(value);
    }
  }
  // Replace, not throw, on bytes that are not UTF-8 (a worker's message can hold anything).
  return line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

Result<std::unique_ptr<EventLog>> EventLog::open(const std::string& path, std::string source) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Error{ErrorCode::kInternal,
                 "cannot open event log '" + path + "': " + std::strerror(errno)};
  }
  return std::unique_ptr<EventLog>(new EventLog(fd, path, std::move(source)));
}

EventLog::EventLog(int fd, std::string path, std::string source)
    : fd_(fd), path_(std::move(path)), source_(std::move(source)), host_(local_host_name()) {}

EventLog::~EventLog() { ::close(fd_); }

void EventLog::write(const std::string& event, Json fields) {
  const std::string line = format_event(std::chrono::system_clock::now(), source_, host_,
                                        static_cast<int>(getpid()), event, std::move(fields));
  if (auto s = write_fully(fd_, line, path_); !s && !failed_) {
    failed_ = true;
    log_line(source_,
             "warning: event log: " + s.error().message + " (later failures are not reported)");
  }
}

EventSink EventLog::sink() {
  return [this](const std::string& event, Json fields) { write(event, std::move(fields)); };
}

}  // namespace ctrun::rendezvous

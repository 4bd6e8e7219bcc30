// A structured record of what happened to a job (--event_log FILE): one JSON object per line,
// {"time", "source", "host", "pid", "event", ...fields}, so that a failed job can be
// reconstructed afterwards from the agents' and the daemon's files. Lines are appended with one
// write() each, so several processes may share a file; a write that fails is reported once on
// stderr and never stops the job.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"

namespace ctrun::rendezvous {

// Where structured events go: the name of what happened and its details.
using EventSink = std::function<void(const std::string& event, Json fields)>;

// One line of the log, newline included; `fields` may not override the fixed keys.
// "2026-11-26T18:12:27.276Z": the event log's times (UTC, milliseconds), also the fault report's.
std::string utc_stamp(std::chrono::system_clock::time_point at);

std::string format_event(std::chrono::system_clock::time_point at, const std::string& source,
                         const std::string& host, int pid, const std::string& event, Json fields);

class EventLog {
 public:
  // Opens (creates, appends to) `path`; `source` names the program ("ctrun", "ctrund").
  static Result<std::unique_ptr<EventLog>> open(const std::string& path, std::string source);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  void write(const std::string& event, Json fields = Json::object());
  // A sink writing here: for the parts that only know EventSink.
  EventSink sink();

 private:
  EventLog(int fd, std::string path, std::string source);
  int fd_;
  std::string path_;
  std::string source_;
  std::string host_;
  bool failed_ = false;  // a write failed and was reported; later failures stay quiet
};

}  // namespace ctrun::rendezvous

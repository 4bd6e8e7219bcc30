// torchrun's --duplicate-stdout-filters / --duplicate-stderr-filters: one file per attempt and
// stream (LOG_DIR/RUN_ID/attempt_N/filtered_stdout.log), shared by every local rank, holding
// each console line of the workers' stream that contains one of the filters, with the line's
// console prefix ("[default0]:..."). OutputSink offers it exactly the lines it writes to the
// console. Used from the agent's single event-loop thread only; one write() per line, so the
// lines of different ranks never mix.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ctrun/rendezvous/error.h"
#include "launcher/workers/output_sink.h"

namespace ctrun::launcher {

class FilteredLog {
 public:
  // Creates or truncates `path` (torchrun opens it with mode "w"). `filters` is not empty; an
  // empty filter matches every line, as in torchrun.
  static rendezvous::Result<std::shared_ptr<FilteredLog>> open(const std::string& path,
                                                               std::vector<std::string> filters);
  ~FilteredLog();
  FilteredLog(const FilteredLog&) = delete;
  FilteredLog& operator=(const FilteredLog&) = delete;

  // One line as the worker wrote it, with its '\n' when it had one (torchrun matches the filters
  // against the line read with its newline). Written as prefix + line when the line contains a
  // filter; a line without its newline gets one.
  void offer(std::string_view prefix, std::string_view line);
  const std::string& path() const { return path_; }
  // As OutputSink's: told once when a write fails; the copy is given up, the console goes on.
  void set_file_error_handler(OutputSink::FileErrorHandler handler) {
    on_file_error_ = std::move(handler);
  }

 private:
  FilteredLog(int fd, std::string path, std::vector<std::string> filters);
  bool matches(std::string_view line) const;

  int fd_;  // -1 once a write failed
  std::string path_;
  std::vector<std::string> filters_;
  OutputSink::FileErrorHandler on_file_error_;
};

}  // namespace ctrun::launcher

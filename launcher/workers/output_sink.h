// Where one worker stream's bytes go: whole lines to the console with a "[role<rank>]:" prefix,
// and/or the raw bytes to a log file. Lines are written with one write() each batch, from the
// agent's single event-loop thread, so lines of different workers never interleave mid-line.
// Each console line may also be offered to a FilteredLog (--duplicate-std{out,err}-filters).
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace ctrun::launcher {

class FilteredLog;

class OutputSink {
 public:
  // console_fd: 1, 2 or -1 for none; file_path: empty for none; filtered: null for none, else it
  // is offered every worker line this sink writes to the console (not the agent's notes).
  OutputSink(int console_fd, std::string prefix, const std::string& file_path,
             std::shared_ptr<FilteredLog> filtered = nullptr);
  ~OutputSink();
  OutputSink(const OutputSink&) = delete;
  OutputSink& operator=(const OutputSink&) = delete;

  void write(const char* data, std::size_t size);
  // At end of stream: a last line without its newline still goes out, with one.
  void finish();
  // The agent's own text about this worker (a hung worker's native stacks), to the same console
  // (prefixed lines) and file, starting on a line of its own; a worker's unfinished line on the
  // console stays pending.
  void write_note(const std::string& text);
  bool file_ok() const { return file_fd_ >= 0 || file_path_.empty(); }
  // Told once, with the file and errno, when a write to the log file fails (a full disk, a
  // quota): the file is given up, the console goes on.
  using FileErrorHandler = std::function<void(const std::string& path, int error)>;
  void set_file_error_handler(FileErrorHandler handler) { on_file_error_ = std::move(handler); }

 private:
  int console_fd_;
  std::string prefix_;
  std::string file_path_;
  int file_fd_ = -1;
  std::shared_ptr<FilteredLog> filtered_;
  std::string partial_;
  bool file_at_line_start_ = true;
  FileErrorHandler on_file_error_;

  void write_file(const char* data, std::size_t size);
};

// Writes all of `data` to `fd`, retrying short writes and EINTR; false on error.
bool write_all(int fd, const char* data, std::size_t size);

}  // namespace ctrun::launcher

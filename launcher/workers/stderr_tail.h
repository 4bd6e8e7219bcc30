// The last lines a worker wrote to stderr, as the agent read them from its pipe: what the
// failure report shows when a worker left no error file (most scripts lack torch's @record),
// and where faulthandler's dump of a hung Python worker lands. Bounded in lines and bytes, so
// a chatty worker costs nothing; fed in arbitrary chunks. Pure: no I/O.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <vector>

namespace ctrun::launcher {

class StderrTail {
 public:
  static constexpr std::size_t kMaxLines = 64;
  static constexpr std::size_t kMaxBytes = 8192;
  static constexpr std::size_t kMaxLineBytes = 1024;  // longer lines are cut, marked with "..."

  void append(const char* data, std::size_t size);
  // The kept lines, oldest first; a last line still waiting for its newline is included.
  std::vector<std::string> lines() const;

 private:
  void push_line(std::string line);

  std::deque<std::string> lines_;
  std::size_t bytes_ = 0;
  std::string partial_;
  bool partial_cut_ = false;
  bool pending_return_ = false;  // a '\r' whose meaning depends on the next byte
};

}  // namespace ctrun::launcher

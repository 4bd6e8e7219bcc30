#include "launcher/workers/stderr_tail.h"

namespace ctrun::launcher {

void StderrTail::append(const char* data, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) {
    const char c = data[i];
    if (c == '\n') {
      // "\r\n" ends a line like "\n".
      pending_return_ = false;
      push_line(partial_cut_ ? partial_ + "..." : partial_);
      partial_.clear();
      partial_cut_ = false;
      continue;
    }
    if (pending_return_) {
      // A carriage return starts the line over, as on a terminal: a progress bar redrawn in
      // place (tqdm) is one line, its last state.
      pending_return_ = false;
      partial_.clear();
      partial_cut_ = false;
    }
    if (c == '\r') {
      pending_return_ = true;
    } else if (partial_.size() < kMaxLineBytes) {
      partial_.push_back(c);
    } else {
      partial_cut_ = true;
    }
  }
}

void StderrTail::push_line(std::string line) {
  bytes_ += line.size();
  lines_.push_back(std::move(line));
  while (lines_.size() > kMaxLines || (bytes_ > kMaxBytes && lines_.size() > 1)) {
    bytes_ -= lines_.front().size();
    lines_.pop_front();
  }
}

std::vector<std::string> StderrTail::lines() const {
  std::vector<std::string> out(lines_.begin(), lines_.end());
  if (!partial_.empty()) out.push_back(partial_cut_ ? partial_ + "..." : partial_);
  return out;
}

}  // namespace ctrun::launcher

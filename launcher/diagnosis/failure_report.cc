#include "ctrun/launcher/failure_report.h"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ctrun/launcher/options.h"
#include "launcher/diagnosis/native_stacks.h"

namespace ctrun::launcher {

std::optional<std::string> read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream content;
  content << in.rdbuf();
  auto j = nlohmann::json::parse(content.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto m = j.find("message");
  if (m == j.end()) return std::nullopt;
  if (m->is_string()) return m->get<std::string>();
  if (!m->is_object()) return std::nullopt;
  // Prefer the Python traceback: it names the failing line.
  auto extra = m->find("extraInfo");
  if (extra != m->end() && extra->is_object()) {
    auto stack = extra->find("py_callstack");
    if (stack != extra->end() && stack->is_string() && !stack->get<std::string>().empty()) {
      return stack->get<std::string>();
    }
  }
  auto text = m->find("message");
  if (text != m->end() && text->is_string()) return text->get<std::string>();
  return std::nullopt;
}

namespace {

constexpr const char* kTraceback = "Traceback (most recent call last):";
constexpr const char* kFaultHandler = "Fatal Python error: ";
constexpr const char* kErrorsDoc = "https://pytorch.org/docs/stable/elastic/errors.html";

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// The line before `i` that is not blank, or npos.
std::size_t previous_text(const std::vector<std::string>& lines, std::size_t i) {
  while (i > 0) {
    --i;
    if (lines[i].find_first_not_of(" \t") != std::string::npos) return i;
  }
  return std::string::npos;
}

// Where the last traceback or faulthandler dump starts; npos when there is none.
std::size_t python_report_start(const std::vector<std::string>& lines) {
  std::size_t start = std::string::npos;
  for (std::size_t i = lines.size(); i-- > 0;) {
    if (starts_with(lines[i], kTraceback) || starts_with(lines[i], kFaultHandler)) {
      start = i;
      break;
    }
  }
  // "During handling of the above exception ..." / "The above exception was the direct cause
  // ...": the chain is one report, from its first traceback.
  while (start != std::string::npos) {
    const std::size_t joint = previous_text(lines, start);
    if (joint == std::string::npos || (!starts_with(lines[joint], "During handling of the above") &&
                                       !starts_with(lines[joint], "The above exception was"))) {
      break;
    }
    std::size_t earlier = std::string::npos;
    for (std::size_t i = joint; i-- > 0;) {
      if (starts_with(lines[i], kTraceback)) {
        earlier = i;
        break;
      }
    }
    if (earlier == std::string::npos) break;
    start = earlier;
  }
  return start;
}

// A multi-line value under a "  key       : " label, continued at the value's column.
void write_field(std::ostringstream& out, const char* label, const std::string& first,
                 const std::vector<std::string>& more) {
  out << "  " << label << ": " << first << "\n";
  for (const auto& line : more) out << (line.empty() ? "" : "              ") << line << "\n";
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

StderrExcerpt stderr_excerpt(const std::vector<std::string>& tail) {
  std::vector<std::string> lines = tail;
  while (!lines.empty() && lines.back().find_first_not_of(" \t") == std::string::npos) {
    lines.pop_back();
  }
  StderrExcerpt excerpt;
  const std::size_t start = python_report_start(lines);
  if (start != std::string::npos) {
    excerpt.from_python = true;
    excerpt.lines.assign(lines.begin() + static_cast<std::ptrdiff_t>(start), lines.end());
  } else {
    const std::size_t keep = std::min(lines.size(), StderrExcerpt::kPlainLines);
    excerpt.lines.assign(lines.end() - static_cast<std::ptrdiff_t>(keep), lines.end());
  }
  return excerpt;
}

std::optional<std::string> exception_from_stderr(const std::vector<std::string>& tail) {
  const StderrExcerpt excerpt = stderr_excerpt(tail);
  if (!excerpt.from_python || excerpt.lines.empty() ||
      starts_with(excerpt.lines.front(), kFaultHandler) ||
      starts_with(excerpt.lines.back(), kTraceback) || starts_with(excerpt.lines.back(), " ")) {
    return std::nullopt;  // a dump of stacks, or a traceback cut before its exception line
  }
  return excerpt.lines.back();
}

namespace {

// One failed rank's block, "[index]:" and its fields, as torchrun lays it out.
void write_failure(std::ostringstream& out, std::size_t index, const FailureInfo& f) {
  const std::time_t t = std::chrono::system_clock::to_time_t(f.at);
  std::tm tm{};
  localtime_r(&t, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d_%H:%M:%S", &tm);
  out << "[" << index << "]:\n";
  out << "  time      : " << when << "\n";
  out << "  host      : " << f.host << "\n";
  out << "  rank      : " << f.rank << " (local_rank: " << f.local_rank << ")\n";
  if (f.signal != 0) {
    out << "  exitcode  : " << -f.signal << " (pid: " << f.pid << ")\n";
    out << "  signal    : " << f.signal << " (" << signal_name(f.signal) << ")\n";
  } else {
    out << "  exitcode  : " << f.exit_code << " (pid: " << f.pid << ")\n";
  }
  std::optional<std::string> message = read_error_file(f.error_file);
  out << "  error_file: " << (message ? f.error_file : "<N/A>") << "\n";
  if (!f.stderr_log.empty()) out << "  stderr    : " << f.stderr_log << "\n";
  const StderrExcerpt excerpt = stderr_excerpt(f.stderr_tail);
  if (message) {
    std::vector<std::string> lines = split_lines(*message);
    const std::string first = lines.empty() ? "" : lines.front();
    if (!lines.empty()) lines.erase(lines.begin());
    write_field(out, "traceback ", first, lines);
    // A hung worker's error file is the agent's one line; its stderr ends with the Python
    // stacks faulthandler wrote on the agent's SIGABRT.
    if (f.hung && !excerpt.lines.empty()) {
      write_field(out, "stderr_end", "the last lines of its stderr:", excerpt.lines);
    }
  } else if (!excerpt.lines.empty()) {
    write_field(out, "traceback ",
                "no error file (see " + std::string(kErrorsDoc) + "); the end of its stderr:",
                excerpt.lines);
  } else {
    out << "  traceback : To enable traceback see: " << kErrorsDoc << "\n";
  }
  if (!f.native_stacks.empty()) {
    write_field(out, "native    ",
                "stacks before the kill (eu-stack -p " + std::to_string(f.pid) + "):",
                split_lines(summarize_native_stacks(f.native_stacks)));
  }
}

}  // namespace

std::string format_failure_report(const std::vector<FailureInfo>& failures) {
  const std::string rule(60, '=');
  const std::string thin(60, '-');
  std::ostringstream out;
  out << rule << "\n"
      << (failures.empty() ? "" : failures.front().entrypoint) << " FAILED\n"
      << thin << "\n";
  out << "Failures:\n";
  if (failures.size() <= 1) out << "  <NO_OTHER_FAILURES>\n";
  for (std::size_t i = 1; i < failures.size(); ++i) write_failure(out, i, failures[i]);
  out << thin << "\n";
  out << "Root Cause (first observed failure):\n";
  if (!failures.empty()) write_failure(out, 0, failures.front());
  out << rule << "\n";
  return out.str();
}

std::string format_failure_report(const FailureInfo& failure) {
  return format_failure_report(std::vector<FailureInfo>{failure});
}

std::string failure_summary(const FailureInfo& f) {
  std::string why;
  if (auto message = read_error_file(f.error_file)) {
    // The last line of a traceback is the exception itself.
    std::string text = *message;
    while (!text.empty() && text.back() == '\n') text.pop_back();
    why = text.substr(text.find_last_of('\n') + 1).substr(0, 512);
  } else if (auto exception = exception_from_stderr(f.stderr_tail)) {
    why = exception->substr(0, 512);
  } else if (f.signal != 0) {
    why = signal_name(f.signal);
  } else {
    why = "exit code " + std::to_string(f.exit_code);
  }
  return "rank " + std::to_string(f.rank) + " on " + f.host + ": " + why;
}

}  // namespace ctrun::launcher

#include "ctrun/launcher/failure_report.h"

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ctrun/launcher/options.h"

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

std::string format_failure_report(const FailureInfo& f) {
  const std::string rule(60, '=');
  const std::string thin(60, '-');
  const std::time_t t = std::chrono::system_clock::to_time_t(f.at);
  std::tm tm{};
  localtime_r(&t, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d_%H:%M:%S", &tm);
  std::ostringstream out;
  out << rule << "\n" << f.entrypoint << " FAILED\n" << thin << "\n";
  out << "Failures:\n  <NO_OTHER_FAILURES>\n" << thin << "\n";
  out << "Root Cause (first observed failure):\n[0]:\n";
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
  if (message) {
    out << "  traceback : ";
    std::istringstream lines(*message);
    std::string line;
    bool first = true;
    while (std::getline(lines, line)) {
      out << (first ? "" : "              ") << line << "\n";
      first = false;
    }
  } else {
    out << "  traceback : To enable traceback see: "
           "https://pytorch.org/docs/stable/elastic/errors.html\n";
  }
  out << rule << "\n";
  return out.str();
}

}  // namespace ctrun::launcher

#include "ctrun/launcher/log_line_prefix.h"

#include <cctype>

namespace ctrun::launcher {
namespace {

// string.Template's identifier: [_a-z][_a-z0-9]*, ASCII, any case.
bool identifier_start(char ch) {
  return ch == '_' || std::isalpha(static_cast<unsigned char>(ch)) != 0;
}
bool identifier_char(char ch) {
  return identifier_start(ch) || std::isdigit(static_cast<unsigned char>(ch)) != 0;
}

}  // namespace

std::string console_prefix(const std::string& log_line_prefix_template, const std::string& role,
                           int rank, int local_rank) {
  if (log_line_prefix_template.empty()) return "[" + role + std::to_string(rank) + "]:";
  auto value_of = [&](const std::string& name, std::string& out) {
    if (name == "role_name") {
      out = role;
    } else if (name == "rank") {
      out = std::to_string(rank);
    } else if (name == "local_rank") {
      out = std::to_string(local_rank);
    } else {
      return false;
    }
    return true;
  };
  const std::string& t = log_line_prefix_template;
  std::string out;
  std::size_t i = 0;
  while (i < t.size()) {
    if (t[i] != '$' || i + 1 == t.size()) {
      out += t[i++];
      continue;
    }
    if (t[i + 1] == '$') {
      out += '$';
      i += 2;
      continue;
    }
    const bool braced = t[i + 1] == '{';
    const std::size_t start = i + (braced ? 2 : 1);
    std::size_t end = start;
    if (end < t.size() && identifier_start(t[end])) {
      while (end < t.size() && identifier_char(t[end])) ++end;
    }
    std::string value;
    const bool closed = !braced || (end < t.size() && t[end] == '}');
    if (end > start && closed && value_of(t.substr(start, end - start), value)) {
      out += value;
      i = end + (braced ? 1 : 0);
    } else {
      out += t[i++];  // kept as written, as safe_substitute does
    }
  }
  return out;
}

}  // namespace ctrun::launcher

// The text in front of each console line of a worker: "[default3]:" by default, or torchrun's
// TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE expanded as Python's string.Template.safe_substitute
// does it with role_name, rank and local_rank.
#pragma once

#include <string>

namespace ctrun::launcher {

// `log_line_prefix_template` empty: "[" + role + rank + "]:". Otherwise "$name" and "${name}"
// for role_name, rank and local_rank are replaced, "$$" is "$", and anything else (an unknown
// name, a lone "$") is kept as written.
std::string console_prefix(const std::string& log_line_prefix_template, const std::string& role,
                           int rank, int local_rank);

}  // namespace ctrun::launcher

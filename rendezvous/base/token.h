// The shared token every ctrun program proves (ctrund, the agent, workers, ctrun status):
// where it comes from and how it is read.
#pragma once

#include <optional>
#include <string>

#include "ctrun/rendezvous/error.h"

namespace ctrun::rendezvous {

// A token as given (file content or environment value) less surrounding whitespace; an error
// naming `source` when nothing is left.
Result<std::string> clean_token(std::string token, const std::string& source);
// Reads a token file: its content less surrounding whitespace; an error when unreadable or empty.
Result<std::string> read_token_file(const std::string& path);
// The token every ctrun program uses: the file's when `token_file` is not empty, else the value
// of $CTRUN_RDZV_TOKEN (`env_token`, as read by the caller), else none.
inline constexpr const char* kTokenVariable = "CTRUN_RDZV_TOKEN";
Result<std::optional<std::string>> resolve_token(const std::string& token_file,
                                                 const std::optional<std::string>& env_token);

}  // namespace ctrun::rendezvous

// The error file a failing worker leaves for its agent (TORCHELASTIC_ERROR_FILE), in the JSON
// layout torch's @record writes, so ctrun's and torchrun's root-cause reports quote it:
//   {"message": {"message": "<type>: <what>",
//                "extraInfo": {"py_callstack": "<details>", "timestamp": "<unix seconds>"}}}
#pragma once

#include <functional>
#include <string>

#include "ctrun/rendezvous/error.h"

namespace ctrun::worker {

// Written whole (temporary file, then rename), so a reader never sees half of it.
rendezvous::Status write_error_file(const std::string& path, const std::string& message,
                                    const std::string& details = "");

// Runs `body` (a trainer's main). An exception that escapes it is written to `error_file` when
// one is given, printed on stderr, and becomes exit code 1, as @record does for Python.
int run_recorded(const std::string& error_file, const std::function<int()>& body);

}  // namespace ctrun::worker

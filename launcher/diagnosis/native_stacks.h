// Native stacks of a hung worker as eu-stack (elfutils) prints them, shortened for the failure
// report: each thread's innermost frames, where it is stuck; the worker's log keeps them all.
// And the words for an eu-stack that could not attach. Pure: the agent runs eu-stack.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace ctrun::launcher {

// `eu-stack -p PID` output ("PID N - process", "TID N:", "#0  0x... function" lines) with at
// most `frames_per_thread` frames of each of the first `max_threads` threads; other lines
// (eu-stack's errors) are kept; what is left out is counted.
std::string summarize_native_stacks(const std::string& eu_stack_output,
                                    std::size_t frames_per_thread = 8, std::size_t max_threads = 8);

// When eu-stack's output says it was refused (ptrace permission), why that may be: the Yama
// setting (`ptrace_scope`, nullopt where the kernel has no Yama) and what would allow it.
std::optional<std::string> attach_refusal_hint(const std::string& eu_stack_output,
                                               std::optional<int> ptrace_scope);

}  // namespace ctrun::launcher

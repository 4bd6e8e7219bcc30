#include "launcher/diagnosis/native_stacks.h"

#include <sstream>

namespace ctrun::launcher {

namespace {

constexpr std::size_t kMaxOtherLines = 20;

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::string plural(std::size_t n, const char* what) {
  return std::to_string(n) + " more " + what + (n == 1 ? "" : "s");
}

}  // namespace

std::string summarize_native_stacks(const std::string& output, std::size_t frames_per_thread,
                                    std::size_t max_threads) {
  std::ostringstream out;
  std::istringstream in(output);
  std::size_t threads = 0;
  std::size_t frames = 0;           // of the current thread
  std::size_t frames_left_out = 0;  // of the current thread
  std::size_t threads_left_out = 0;
  std::size_t other_lines = 0;
  auto end_thread = [&] {
    if (frames_left_out > 0) out << "... " << plural(frames_left_out, "frame") << "\n";
    frames = frames_left_out = 0;
  };
  for (std::string line; std::getline(in, line);) {
    if (starts_with(line, "TID ")) {
      end_thread();
      if (++threads > max_threads) ++threads_left_out;
      if (threads <= max_threads) out << line << "\n";
    } else if (threads > max_threads) {
      continue;
    } else if (starts_with(line, "#")) {
      if (frames++ < frames_per_thread) {
        out << line << "\n";
      } else {
        ++frames_left_out;
      }
    } else if (other_lines++ < kMaxOtherLines) {
      out << line << "\n";
    }
  }
  end_thread();
  if (threads_left_out > 0) out << "... " << plural(threads_left_out, "thread") << "\n";
  return out.str();
}

std::optional<std::string> attach_refusal_hint(const std::string& output,
                                               std::optional<int> ptrace_scope) {
  if (output.find("Operation not permitted") == std::string::npos) return std::nullopt;
  std::string hint = "eu-stack was not allowed to attach (ptrace): ";
  if (ptrace_scope && *ptrace_scope >= 3) {
    return hint + "kernel.yama.ptrace_scope=3 forbids tracing until the next boot";
  }
  if (ptrace_scope && *ptrace_scope >= 1) {
    // 1: ancestors and declared tracers (workers declare the agent, PR_SET_PTRACER, so a
    // refusal here comes from elsewhere, e.g. a container's seccomp); 2: CAP_SYS_PTRACE only.
    hint += "kernel.yama.ptrace_scope=" + std::to_string(*ptrace_scope) + "; ";
  }
  return hint +
         "run ctrun with CAP_SYS_PTRACE (containers: --cap-add=SYS_PTRACE) or set "
         "kernel.yama.ptrace_scope=0";
}

}  // namespace ctrun::launcher

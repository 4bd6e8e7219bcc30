#include "launcher/workers/child_process.h"

#include <fcntl.h>
#include <linux/mempolicy.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <boost/process/v2/environment.hpp>

namespace ctrun::launcher {

namespace bp = boost::process::v2;
using rendezvous::Error;
using rendezvous::ErrorCode;

namespace {

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

// Marks every descriptor above stderr close-on-exec. Boost 1.81's close_all() skips the range
// between stderr and its own error pipe (it compares each whitelist entry with itself), so
// without this a child inherits the agent's sockets and pipes: the daemon would not see a
// SIGKILLed agent go while its workers' children still hold its connection.
void close_inherited_descriptors() {
  if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  for (int fd = 3; fd < 4096; ++fd) {  // kernels before 5.11; no allocation after fork
    const int flags = fcntl(fd, F_GETFD);
    if (flags >= 0 && !(flags & FD_CLOEXEC)) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  }
}

// A --numa-binding made ready in the agent, so that the child only makes two system calls
// (nothing that allocates may run between fork and exec).
class PreparedBinding {
 public:
  explicit PreparedBinding(const CpuBinding& b) {
    constexpr int kBits = 8 * sizeof(unsigned long);
    const int max_cpu = b.cpus.empty() ? 0 : b.cpus.back();
    cpu_mask_.assign(static_cast<std::size_t>(max_cpu / kBits + 1), 0);
    for (int cpu : b.cpus) cpu_mask_[cpu / kBits] |= 1UL << (cpu % kBits);
    node_mask_.assign(static_cast<std::size_t>(b.memory_node / kBits + 1), 0);
    node_mask_[b.memory_node / kBits] |= 1UL << (b.memory_node % kBits);
    failed_ =
        "ctrun: --numa-binding: cannot bind the worker to CPUs " + cpu_list_text(b.cpus) + "\n";
  }

  // In the child. Memory is only preferred from the node, not bound to it: a strict binding
  // would kill a worker whose node is full while the others have room.
  void apply() const {
    if (sched_setaffinity(0, cpu_mask_.size() * sizeof(unsigned long),
                          reinterpret_cast<const cpu_set_t*>(cpu_mask_.data())) != 0) {
      [[maybe_unused]] auto n = write(STDERR_FILENO, failed_.data(), failed_.size());
      _exit(127);
    }
    // A kernel without NUMA (ENOSYS) has nothing to prefer.
    syscall(SYS_set_mempolicy, MPOL_PREFERRED, node_mask_.data(),
            node_mask_.size() * 8 * sizeof(unsigned long) + 1);
  }

 private:
  std::vector<unsigned long> cpu_mask_;
  std::vector<unsigned long> node_mask_;
  std::string failed_;
};

// Runs in the child between fork and exec; it only makes system calls. on_exec_setup is const:
// Boost.Process v2 silently skips an initializer whose hook it cannot call on the object given
// (here a const one), and the child would start with none of this.
struct ChildSetup {
  pid_t agent;
  bool own_process_group;
  bool traceable_by_agent;
  const PreparedBinding* binding;
  const rlimit* open_files;
  template <typename Launcher>
  bp::error_code on_exec_setup(Launcher&, const bp::filesystem::path&, const char* const*&) const {
    if (own_process_group) setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != agent) _exit(127);  // the agent died before prctl took effect
    // Without Yama this fails, harmlessly.
    if (traceable_by_agent) prctl(PR_SET_PTRACER, agent, 0, 0, 0);
    close_inherited_descriptors();
    // Start as a fresh process would: dispositions the agent set to "ignore" (SIGPIPE) survive
    // exec, and so does a blocked mask.
    signal(SIGPIPE, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (binding) binding->apply();
    if (open_files) setrlimit(RLIMIT_NOFILE, open_files);
    return {};
  }
};

// Why exec failed, in our words (not Boost's "default_launcher: ... [system:2]").
std::string start_error(const std::string& exe, const boost::system::error_code& ec) {
  std::string why = "cannot start '" + exe + "': " + ec.message();
  if (ec == boost::system::errc::executable_format_error) {
    why += " (not a program this machine runs; a Python script needs no --no-python)";
  } else if (ec == boost::system::errc::permission_denied) {
    why += " (not executable: chmod +x, or run it through its interpreter)";
  }
  return why;
}

}  // namespace

rendezvous::Result<std::unique_ptr<bp::process>> start_child(boost::asio::any_io_executor executor,
                                                             const std::string& executable,
                                                             const std::vector<std::string>& args,
                                                             bp::process_stdio stdio,
                                                             const ChildOptions& options) {
  bp::filesystem::path exe = executable;
  if (executable.find('/') == std::string::npos) {
    exe = bp::environment::find_executable(executable);
    if (exe.empty()) {
      return Error{ErrorCode::kBadRequest, "cannot find executable '" + executable + "' on PATH"};
    }
  }
  std::optional<PreparedBinding> binding;
  if (options.binding) binding.emplace(*options.binding);
  const ChildSetup setup{getpid(), options.own_process_group, options.traceable_by_agent,
                         binding ? &*binding : nullptr,
                         options.open_files ? &*options.open_files : nullptr};
  try {
    std::unique_ptr<bp::process> child;
    if (options.environment) {
      child = std::make_unique<bp::process>(executor, exe, args,
                                            bp::process_environment(*options.environment),
                                            std::move(stdio), setup);
    } else {
      child = std::make_unique<bp::process>(executor, exe, args, std::move(stdio), setup);
    }
    // The child may not have called setpgid yet; doing it from this side too closes the race.
    if (options.own_process_group) setpgid(child->id(), child->id());
    return child;
  } catch (const boost::system::system_error& e) {
    return Error{ErrorCode::kBadRequest, start_error(exe.string(), e.code())};
  } catch (const std::exception& e) {
    return Error{ErrorCode::kBadRequest, "cannot start '" + exe.string() + "': " + e.what()};
  }
}

}  // namespace ctrun::launcher

// The agent's few questions to the operating system, kept out of its logic: whether a host is
// this machine, a free port, a file's modification time, the environment, a fresh run id.
#pragma once

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ctrun::launcher {

// A random UUID (version 4), the form torchrun gives a --standalone run id.
std::string random_uuid();
// The interpreter of Python entrypoints: $PYTHON_EXEC, else python3 (torchrun's rule).
std::string python_executable();
// This machine's fully qualified name as Python's socket.getfqdn() finds it (torch 2.x's
// MASTER_ADDR for --standalone): the host name's entry by address, its first name or alias
// holding a dot, else its name; the bare host name when the lookup fails.
std::string fully_qualified_host_name();
// True when `host` names an address of this machine (torchrun's test for hosting the store).
bool is_local_host(const std::string& host);
// A port nobody listens on right now, on `host` (torchrun picks MASTER_PORT the same way);
// 0 when none can be had.
int free_port(boost::asio::io_context& io, const std::string& host);
// A whole file's contents; nothing when it cannot be read (errno says why).
std::optional<std::string> read_text_file(const std::string& path);
// Writes `text` as the whole file at `path`, through a temporary file renamed over it, so a
// reader sees the old contents or the new, never a part; false when it cannot (errno says why).
bool write_text_file_atomically(const std::string& path, const std::string& text);
// Writes `message` as a worker's error file unless the worker wrote one itself, so that the
// failure report names the real cause of a kill the agent decided on.
void write_error_file_if_absent(const std::string& path, const std::string& message);
// This process's environment, NAME=VALUE each.
std::vector<std::string> current_environment();

// A system tool's run (nft): its exit code (-1: it could not be started, or ended by a signal)
// and what it printed on stdout and stderr.
struct ToolRun {
  int exit_code = -1;
  std::string output;
};
// Runs `argv` (argv[0] looked up in PATH, then /usr/sbin and /sbin) to its end; for tools that
// take milliseconds: the caller waits.
ToolRun run_tool(const std::vector<std::string>& argv);
// Whether this process may change the network's rules (CAP_NET_ADMIN, as root has).
bool can_admin_network();

}  // namespace ctrun::launcher

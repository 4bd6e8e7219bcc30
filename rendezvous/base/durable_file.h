// The OS calls behind files that must survive a crash, shared by ctrund's --state_dir and the
// worker runtime's checkpoints: write every byte, then make a rename in a directory durable.
#pragma once

#include <string>
#include <string_view>

#include "ctrun/rendezvous/error.h"

namespace ctrun::rendezvous {

// Writes all of `bytes` to `fd`, through short writes and EINTR. The error names `path`.
Status write_fully(int fd, std::string_view bytes, const std::string& path);
// fsyncs the directory itself, so that a file renamed into it is there after a crash.
Status sync_directory(const std::string& dir);

}  // namespace ctrun::rendezvous

// The Gloo backend: torch's c10d::ProcessGroupGloo (Gloo ring/halving-doubling algorithms on
// CPU tensors), bootstrapped through any c10d::Store.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "ctrun/worker/process_group.h"

namespace ctrun::worker {

// `host` is the address this rank's Gloo device binds, and peers connect to: a host name, an
// address, or empty for torch's choice (GLOO_SOCKET_IFNAME, else this host's name).
std::unique_ptr<ProcessGroup> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size, const std::string& host,
                                              std::chrono::milliseconds timeout);

}  // namespace ctrun::worker

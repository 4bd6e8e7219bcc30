// The daemon's StateLog on disk (ctrund --state_dir).
#pragma once

#include <memory>
#include <string>

#include "ctrun/rendezvous/error.h"
#include "rendezvous/core/state_log.h"

namespace ctrun::rendezvous {

// The files of --state_dir: DIR/snapshot (replaced atomically), DIR/journal (appended), and
// DIR/lock (held with flock, so two daemons never share a directory). Creates DIR if missing.
Result<std::unique_ptr<StateLog>> open_state_dir(const std::string& dir);

}  // namespace ctrun::rendezvous

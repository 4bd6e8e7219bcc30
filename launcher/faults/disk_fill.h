// The `disk_full` fault (fault_plan.h): the filesystem that holds a directory (the checkpoint
// directory) made full by one file in it that takes every free block, and freed again by
// removing that file. As a full disk is: any writer there, a worker's checkpoint included, gets
// ENOSPC; files already there are untouched.
#pragma once

#include <cstdint>
#include <string>

#include "ctrun/rendezvous/error.h"

namespace ctrun::launcher {

struct DiskFill {
  std::string file;         // "<dir>/.ctrun-fault-<fault>.fill"
  std::uint64_t bytes = 0;  // what it took
};

// Fills `dir`'s filesystem; an error names the directory and the reason (no such directory,
// not writable). Blocks until done: allocating is fast where the filesystem can (fallocate),
// else it writes.
rendezvous::Result<DiskFill> fill_disk(const std::string& dir, int fault_id);
// Removes the fill file: the space is free again.
rendezvous::Status free_disk(const DiskFill& fill);

}  // namespace ctrun::launcher

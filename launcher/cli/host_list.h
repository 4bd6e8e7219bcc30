// The hosts of `ctrun --hostfile FILE` / `--hosts LIST` and the slots picked with --include or
// --exclude, as DeepSpeed's launcher reads them; pure (docs/cluster.md, "One command for the
// whole cluster").
//
//   hostfile   one host per line: `NAME`, `NAME slots=N` (DeepSpeed, Open MPI; Open MPI's
//              max_slots=M is accepted and ignored) or `NAME:N` (MPICH); '#' starts a comment
//   --hosts    NAME[:N],NAME[:N],...
//   --include  NAME[:S,S...]@NAME...: only these hosts, and on a host given with slots only
//              those slots
//   --exclude  the same syntax: these hosts (without slots), or these slots of a host, left out
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"

namespace ctrun::launcher {

struct Host {
  std::string name;
  // The slots (GPU indices) the job uses on it; empty when the list gave no slot count: then
  // the host runs --nproc_per_node workers.
  std::vector<int> slots;
  // How many slots the list gave (0: none), so that a host narrowed by --include/--exclude
  // is told from one used whole.
  int listed_slots = 0;
  // Whether the job uses fewer slots than the list gave (CUDA_VISIBLE_DEVICES narrows them).
  bool narrowed() const {
    return listed_slots > 0 && static_cast<int>(slots.size()) < listed_slots;
  }
};

// `text` is the file's contents; `source` names it in errors ("hosts.txt:3: ...").
rendezvous::Result<std::vector<Host>> parse_hostfile(const std::string& text,
                                                     const std::string& source);
rendezvous::Result<std::vector<Host>> parse_hosts_option(const std::string& text);

// --include / --exclude applied to `hosts` (at most one of them non-empty). Hosts keep the
// list's order; a name or slot the list does not have is an error, as is a selection that
// leaves no host.
rendezvous::Result<std::vector<Host>> select_hosts(std::vector<Host> hosts,
                                                   const std::string& include,
                                                   const std::string& exclude);

}  // namespace ctrun::launcher

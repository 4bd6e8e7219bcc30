// The faults of a whole node that change the machine itself, and their undoing: a link to a
// peer cut with nftables (link_cut.h's table) and restored, a disk filled (disk_fill.h) and
// freed. It owns what is cut or filled now, so that each is undone once, also when the fault
// ends before its cut was made. The tool runs and the
// log lines come through hooks: tested in memory (node_faults_test).
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "launcher/faults/disk_fill.h"

namespace ctrun::launcher {

class NodeFaults {
 public:
  struct Hooks {
    // Runs a system tool (nft) to its end: its exit code and output.
    std::function<std::pair<int, std::string>(const std::vector<std::string>&)> run_tool;
    std::function<void(const std::string&)> log;
  };
  explicit NodeFaults(Hooks hooks) : hooks_(std::move(hooks)) {}

  // Fault `fault_id` cuts the link to node `peer` at `address` (IPv4 or IPv6 text), until
  // restore_link(fault_id).
  void cut_link(int fault_id, int peer, const std::string& address, bool ipv6);
  // The link back; a restore that comes before its cut (the peer's address was still being
  // looked up) is carried out as soon as the cut is made.
  void restore_link(int fault_id);
  void fill_disk(int fault_id, const std::string& path);
  void free_disk(int fault_id);

  bool link_cut(int fault_id) const { return link_cuts_.count(fault_id) > 0; }

 private:
  Hooks hooks_;
  std::map<int, std::string> link_cuts_;  // by fault id: the nft table of a link cut now
  std::set<int> links_restored_early_;    // link faults that ended before their cut was made
  std::map<int, DiskFill> disk_fills_;    // by fault id: the file that fills a disk now
};

}  // namespace ctrun::launcher

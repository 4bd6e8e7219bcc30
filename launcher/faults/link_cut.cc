#include "launcher/faults/link_cut.h"

namespace ctrun::launcher {

std::string link_cut_table(int agent_pid, int fault_id) {
  return "ctrun_fault_" + std::to_string(agent_pid) + "_" + std::to_string(fault_id);
}

std::vector<std::string> link_cut_command(const std::string& table, const std::string& peer,
                                          bool ipv6) {
  // One nft command line, applied as one transaction: the link goes at once, both ways. Hooked
  // before the usual filters (priority -200), so that a host's own accept rules do not let the
  // packets through.
  const std::string family = ipv6 ? "ip6" : "ip";
  const std::string t = "inet " + table;
  return {"nft", "add table " + t + "; " +                                                    //
                     "add chain " + t + " in { type filter hook input priority -200 ; }; " +  //
                     "add chain " + t + " out { type filter hook output priority -200 ; }; " +
                     "add rule " + t + " in " + family + " saddr " + peer + " drop; " +  //
                     "add rule " + t + " out " + family + " daddr " + peer + " drop"};
}

std::vector<std::string> link_restore_command(const std::string& table) {
  return {"nft", "delete table inet " + table};
}

}  // namespace ctrun::launcher

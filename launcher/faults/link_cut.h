// The `link_lost` fault's rules (fault_plan.h): the nftables table that drops every packet
// between this node and one peer address, in both directions, and the command that removes it.
// A table of its own per fault (and agent), so that removing it touches no rule of anyone
// else's. Pure: the agent runs nft with these (agent_os.h, run_tool).
#pragma once

#include <string>
#include <vector>

namespace ctrun::launcher {

// "ctrun_fault_<pid>_<fault>": the table's name.
std::string link_cut_table(int agent_pid, int fault_id);
// nft's arguments that create the table dropping traffic to and from `peer` (an IPv4 or IPv6
// address, checked by the caller), ahead of other filters; and those that delete it.
std::vector<std::string> link_cut_command(const std::string& table, const std::string& peer,
                                          bool ipv6);
std::vector<std::string> link_restore_command(const std::string& table);

}  // namespace ctrun::launcher

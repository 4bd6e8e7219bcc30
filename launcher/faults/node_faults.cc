#include "launcher/faults/node_faults.h"

#include <unistd.h>

#include "launcher/faults/link_cut.h"

namespace ctrun::launcher {

void NodeFaults::cut_link(int fault_id, int peer, const std::string& address, bool ipv6) {
  const std::string id = "fault " + std::to_string(fault_id);
  const std::string table = link_cut_table(static_cast<int>(::getpid()), fault_id);
  const auto [code, output] = hooks_.run_tool(link_cut_command(table, address, ipv6));
  if (code != 0) {
    hooks_.log("error: " + id + ": nft could not cut the link: " + output);
    links_restored_early_.erase(fault_id);
    return;
  }
  link_cuts_[fault_id] = table;
  hooks_.log(id + ": the link to node " + std::to_string(peer) + " (" + address +
             ") is cut (nft table inet " + table + ")");
  if (links_restored_early_.erase(fault_id) > 0) restore_link(fault_id);
}

void NodeFaults::restore_link(int fault_id) {
  auto cut = link_cuts_.find(fault_id);
  if (cut == link_cuts_.end()) {
    links_restored_early_.insert(fault_id);  // its cut is still on the way
    return;
  }
  const auto [code, output] = hooks_.run_tool(link_restore_command(cut->second));
  if (code != 0) {
    hooks_.log("error: fault " + std::to_string(fault_id) + ": nft could not remove table inet " +
               cut->second + ": " + output + " (remove it by hand: nft delete table inet " +
               cut->second + ")");
  } else {
    hooks_.log("fault " + std::to_string(fault_id) + ": the link is back");
  }
  link_cuts_.erase(cut);
}

void NodeFaults::fill_disk(int fault_id, const std::string& path) {
  const std::string id = "fault " + std::to_string(fault_id);
  auto fill = launcher::fill_disk(path, fault_id);
  if (!fill) {
    hooks_.log("error: " + id + ": cannot fill the disk: " + fill.error().message);
    return;
  }
  hooks_.log(id + ": the disk of '" + path + "' is full (" +
             std::to_string(fill.value().bytes >> 20) + " MiB in " + fill.value().file + ")");
  disk_fills_[fault_id] = std::move(fill).value();
}

void NodeFaults::free_disk(int fault_id) {
  auto fill = disk_fills_.find(fault_id);
  if (fill == disk_fills_.end()) return;
  if (auto s = launcher::free_disk(fill->second); !s) {
    hooks_.log("error: fault " + std::to_string(fault_id) + ": " + s.error().message);
  } else {
    hooks_.log("fault " + std::to_string(fault_id) + ": the disk has room again");
  }
  disk_fills_.erase(fill);
}

}  // namespace ctrun::launcher

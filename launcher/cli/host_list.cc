#include "launcher/cli/host_list.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "launcher/cli/option_text.h"

namespace ctrun::launcher {
namespace {

using rendezvous::Result;

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\r"));
  s.erase(s.find_last_not_of(" \t\r") + 1);
  return s;
}

// A host name or address as ssh takes it: letters, digits, '.', '-' and '_', not starting with
// '-' (ssh would read it as an option).
bool valid_host_name(const std::string& name) {
  if (name.empty() || name.size() > 253 || name.front() == '-' || name.front() == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_';
  });
}

std::optional<int> slot_count(const std::string& text) {
  auto n = to_int(text);
  if (!n || *n < 1 || *n > kMaxWorkersPerNode) return std::nullopt;
  return static_cast<int>(*n);
}

Host make_host(std::string name, int slots) {
  Host h;
  h.name = std::move(name);
  h.listed_slots = slots;
  for (int i = 0; i < slots; ++i) h.slots.push_back(i);
  return h;
}

// Adds `host` unless its name is already listed.
rendezvous::Status add_host(std::vector<Host>& hosts, Host host, const std::string& where) {
  for (const auto& h : hosts) {
    if (h.name == host.name) return bad(where + "host '" + host.name + "' is listed twice");
  }
  hosts.push_back(std::move(host));
  return rendezvous::ok_status();
}

// "NAME" or "NAME:N".
Result<Host> parse_name_and_count(const std::string& item, const std::string& where) {
  const auto colon = item.find(':');
  const std::string name = item.substr(0, colon);
  if (!valid_host_name(name)) {
    return bad(where + "'" + name + "' is not a host name (letters, digits, '.', '-', '_')");
  }
  if (colon == std::string::npos) return make_host(name, 0);
  auto n = slot_count(item.substr(colon + 1));
  if (!n) {
    return bad(where + "'" + item + "': expected NAME:SLOTS with SLOTS in 1.." +
               std::to_string(kMaxWorkersPerNode));
  }
  return make_host(name, *n);
}

// One --include/--exclude entry: a host and the slots named after ':' (none: the whole host).
struct Pick {
  std::string host;
  std::vector<int> slots;
};

Result<std::vector<Pick>> parse_picks(const std::string& text, const std::string& flag) {
  std::vector<Pick> picks;
  // The extra separator keeps a last empty item ("a@"), which is then an error.
  for (const auto& entry : split(text + '@', '@')) {
    const auto colon = entry.find(':');
    Pick p;
    p.host = trim(entry.substr(0, colon));
    if (!valid_host_name(p.host)) {
      return bad(flag + ": expected HOST[:SLOT,SLOT...]@HOST..., got '" + text + "'");
    }
    if (colon != std::string::npos) {
      for (const auto& s : split(entry.substr(colon + 1) + ',', ',')) {
        auto slot = to_int(trim(s));
        if (!slot || *slot < 0 || *slot >= kMaxWorkersPerNode) {
          return bad(flag + ": '" + s + "' in '" + entry + "' is not a slot number");
        }
        p.slots.push_back(static_cast<int>(*slot));
      }
    }
    for (const auto& q : picks) {
      if (q.host == p.host) return bad(flag + ": host '" + p.host + "' is named twice");
    }
    picks.push_back(std::move(p));
  }
  return picks;
}

}  // namespace

Result<std::vector<Host>> parse_hostfile(const std::string& text, const std::string& source) {
  std::vector<Host> hosts;
  std::istringstream lines(text);
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const std::string where = source + ":" + std::to_string(number) + ": ";
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    std::istringstream words(line);
    std::string first;
    words >> first;
    auto host = parse_name_and_count(first, where);
    if (!host) return host.error();
    for (std::string word; words >> word;) {
      const auto eq = word.find('=');
      const std::string key = word.substr(0, eq);
      if (eq == std::string::npos || (key != "slots" && key != "max_slots")) {
        return bad(where + "expected 'HOST slots=N', got '" + line + "'");
      }
      auto n = slot_count(word.substr(eq + 1));
      if (!n) {
        return bad(where + "'" + word + "': expected a slot count in 1.." +
                   std::to_string(kMaxWorkersPerNode));
      }
      if (key == "slots") {
        if (host.value().listed_slots > 0) return bad(where + "two slot counts in '" + line + "'");
        host = make_host(host.value().name, *n);
      }
    }
    if (auto s = add_host(hosts, std::move(host).value(), where); !s) return s.error();
  }
  if (hosts.empty()) return bad(source + ": lists no host");
  return hosts;
}

Result<std::vector<Host>> parse_hosts_option(const std::string& text) {
  std::vector<Host> hosts;
  for (const auto& item : split(text + ',', ',')) {
    auto host = parse_name_and_count(trim(item), "--hosts: ");
    if (!host) return host.error();
    if (auto s = add_host(hosts, std::move(host).value(), "--hosts: "); !s) return s.error();
  }
  return hosts;
}

Result<std::vector<Host>> select_hosts(std::vector<Host> hosts, const std::string& include,
                                       const std::string& exclude) {
  if (!include.empty() && !exclude.empty()) {
    return bad("--include and --exclude cannot be used together");
  }
  if (include.empty() && exclude.empty()) return hosts;
  const bool including = !include.empty();
  const std::string flag = including ? "--include" : "--exclude";
  auto picks = parse_picks(including ? include : exclude, flag);
  if (!picks) return picks.error();
  for (const auto& p : picks.value()) {
    auto h =
        std::find_if(hosts.begin(), hosts.end(), [&](const Host& x) { return x.name == p.host; });
    if (h == hosts.end()) return bad(flag + ": host '" + p.host + "' is not in the host list");
    for (int slot : p.slots) {
      if (h->listed_slots == 0) {
        return bad(flag + ": host '" + p.host +
                   "' has no slot count in the host list, so no slots to pick");
      }
      if (slot >= h->listed_slots) {
        return bad(flag + ": host '" + p.host + "' has slots 0.." +
                   std::to_string(h->listed_slots - 1) + ", not " + std::to_string(slot));
      }
    }
  }
  std::vector<Host> out;
  for (auto& h : hosts) {
    auto p = std::find_if(picks.value().begin(), picks.value().end(),
                          [&](const Pick& x) { return x.host == h.name; });
    const bool named = p != picks.value().end();
    if (including) {
      if (!named) continue;
      if (!p->slots.empty()) {
        std::set<int> chosen(p->slots.begin(), p->slots.end());
        h.slots.assign(chosen.begin(), chosen.end());
      }
      out.push_back(std::move(h));
    } else {
      if (named && p->slots.empty()) continue;  // the whole host
      if (named) {
        std::erase_if(h.slots, [&](int s) {
          return std::find(p->slots.begin(), p->slots.end(), s) != p->slots.end();
        });
        if (h.slots.empty()) continue;  // every slot of it excluded
      }
      out.push_back(std::move(h));
    }
  }
  if (out.empty()) return bad(flag + " '" + (including ? include : exclude) + "' leaves no host");
  return out;
}

}  // namespace ctrun::launcher

#include "launcher/cluster/cluster_plan.h"

#include <algorithm>
#include <sstream>

#include "launcher/cli/option_text.h"

namespace ctrun::launcher {
namespace {

using rendezvous::Result;

bool matches(const std::string& name, const std::string& pattern) {
  if (!pattern.empty() && pattern.back() == '*') {
    return name.compare(0, pattern.size() - 1, pattern, 0, pattern.size() - 1) == 0;
  }
  return name == pattern;
}

// Sets `name` in `vars`, in place when it is there already (so later sources win).
void set_var(EnvVars& vars, const std::string& name, const std::string& value) {
  auto it = std::find_if(vars.begin(), vars.end(), [&](const auto& v) { return v.first == name; });
  if (it != vars.end()) {
    it->second = value;
  } else {
    vars.emplace_back(name, value);
  }
}

std::string join(const std::vector<int>& items) {
  std::string out;
  for (int i : items) out += (out.empty() ? "" : ",") + std::to_string(i);
  return out;
}

}  // namespace

const std::vector<std::string>& default_forwarded_env() {
  static const std::vector<std::string> names = {"NCCL_*",         "GLOO_*",  "TORCH_*",
                                                 "TORCHELASTIC_*", "PYTHON*", "UCX_*",
                                                 "FI_*",           "OMP_*",   "CTRUN_*"};
  return names;
}

std::string shell_quote(const std::string& text) {
  const bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("-_./=:,+@%").find(c) != std::string_view::npos;
  });
  if (plain) return text;
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

Result<std::vector<std::string>> split_command_line(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote == '\'') {
      if (c == '\'') {
        quote = 0;
      } else {
        word += c;
      }
    } else if (quote == '"') {
      if (c == '"') {
        quote = 0;
      } else if (c == '\\' && i + 1 < text.size() &&
                 std::string_view("\"\\$`").find(text[i + 1]) != std::string_view::npos) {
        word += text[++i];
      } else {
        word += c;
      }
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
    } else {
      in_word = true;
      if (c == '\'' || c == '"') {
        quote = c;
      } else if (c == '\\' && i + 1 < text.size()) {
        word += text[++i];
      } else {
        word += c;
      }
    }
  }
  if (quote != 0) return bad("unbalanced " + std::string(1, quote) + " in '" + text + "'");
  if (in_word) words.push_back(std::move(word));
  return words;
}

Result<EnvVars> parse_env_file(const std::string& text, const std::string& source) {
  EnvVars vars;
  std::istringstream lines(text);
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    line.erase(0, first);
    if (line.rfind("export ", 0) == 0) line.erase(0, line.find_first_not_of(" \t", 7));
    const auto eq = line.find('=');
    const std::string name = line.substr(0, eq);
    if (eq == std::string::npos || !valid_variable_name(name)) {
      return bad(source + ":" + std::to_string(number) + ": expected NAME=VALUE, got '" + line +
                 "'");
    }
    set_var(vars, name, line.substr(eq + 1));
  }
  return vars;
}

Result<ClusterPlan> plan_cluster(const LaunchOptions& o, const std::vector<Host>& hosts,
                                 const ClusterFacts& facts) {
  const ClusterOptions& c = *o.cluster;
  ClusterPlan plan;
  const int count = static_cast<int>(hosts.size());
  plan.min_nodes = c.nnodes_given ? o.min_nodes : count;
  plan.max_nodes = c.nnodes_given ? o.max_nodes : count;
  if (count < plan.min_nodes) {
    return bad("--nnodes=" + std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes) +
               " needs at least " + std::to_string(o.min_nodes) + " hosts; the list has " +
               std::to_string(count));
  }
  if (count > plan.max_nodes) {
    return bad("the list has " + std::to_string(count) +
               " hosts and --nnodes=" + std::to_string(o.min_nodes) + ":" +
               std::to_string(o.max_nodes) + " takes at most " + std::to_string(o.max_nodes));
  }
  plan.job_id = c.rdzv_id_given ? o.rdzv_id : facts.job_id;

  // The variables every host gets: the defaults and --forward_env from this environment, then
  // the env files' lines.
  std::vector<std::string> patterns = default_forwarded_env();
  patterns.insert(patterns.end(), c.forward_env.begin(), c.forward_env.end());
  EnvVars env;
  for (const auto& [name, value] : facts.environment) {
    if (name.rfind("PET_", 0) == 0) continue;  // read into the agents' options already
    for (const auto& p : patterns) {
      if (matches(name, p)) {
        set_var(env, name, value);
        break;
      }
    }
  }
  for (const auto& [name, value] : facts.env_file) set_var(env, name, value);
  for (const auto& v : env) plan.forwarded.push_back(v.first);

  auto ssh_words = split_command_line(c.ssh);
  if (!ssh_words) return bad("--ssh: " + ssh_words.error().message);
  if (ssh_words.value().empty()) return bad("--ssh: expected an ssh command, got ''");
  std::string conf = c.rdzv_conf;
  conf += std::string(conf.empty() ? "" : ",") + "is_host=false";

  for (const Host& host : hosts) {
    HostPlan h;
    h.host = host.name;
    if (c.nproc_given) {
      if (host.narrowed()) {
        return bad("--nproc_per_node with slots picked by --include/--exclude (host '" + host.name +
                   "'): the slots give each host's worker count; leave one out");
      }
      h.nproc = o.nproc_per_node;
    } else {
      h.nproc = host.slots.empty() ? o.nproc_per_node : std::to_string(host.slots.size());
    }
    if (host.narrowed()) h.cuda_visible_devices = join(host.slots);

    h.agent_argv = {
        c.remote_ctrun.empty() ? facts.ctrun_path : c.remote_ctrun,
        "--nnodes=" + std::to_string(plan.min_nodes) + ":" + std::to_string(plan.max_nodes),
        "--nproc_per_node=" + h.nproc,
        "--rdzv_backend=" + o.rdzv_backend,
        "--rdzv_endpoint=" + facts.endpoint,
        "--rdzv_id=" + plan.job_id,
        "--rdzv_conf=" + conf};
    // Each agent's per-rank files in a directory of the host's own: on a shared file system the
    // hosts' local ranks would meet in one.
    if (!o.log_dir.empty()) {
      h.agent_argv.push_back("--log_dir=" + o.log_dir + "/" + host.name);
      h.log_file = o.log_dir + "/" + host.name + ".log";
    }
    h.agent_argv.push_back("--stop_on_stdin_close");
    h.agent_argv.insert(h.agent_argv.end(), c.agent_args.begin(), c.agent_args.end());

    std::string command = "cd " + shell_quote(facts.cwd) + " && exec";
    EnvVars host_env = env;
    if (!h.cuda_visible_devices.empty()) {
      set_var(host_env, "CUDA_VISIBLE_DEVICES", h.cuda_visible_devices);
    }
    if (!host_env.empty()) {
      command += " env";
      for (const auto& [name, value] : host_env) command += " " + shell_quote(name + "=" + value);
    }
    for (const auto& word : h.agent_argv) command += " " + shell_quote(word);
    h.remote_command = std::move(command);

    // The user's words first: ssh takes the first value of each option, so theirs win.
    h.ssh_argv = ssh_words.value();
    if (c.ssh_port > 0) h.ssh_argv.insert(h.ssh_argv.end(), {"-p", std::to_string(c.ssh_port)});
    h.ssh_argv.insert(h.ssh_argv.end(),
                      {"-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o",
                       "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o",
                       "ControlMaster=auto", "-o", "ControlPath=" + facts.control_dir + "/%C", "-o",
                       "ControlPersist=60", host.name, h.remote_command});
    plan.hosts.push_back(std::move(h));
  }
  return plan;
}

}  // namespace ctrun::launcher

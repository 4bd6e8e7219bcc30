#include "ctrun/launcher/slurm.h"
#include "ctrun/rendezvous/endpoint.h"

#include <charconv>
#include <optional>

#include "launcher/cli/option_text.h"

namespace ctrun::launcher {
namespace {

using rendezvous::Status;

// Beyond this a host list is a mistake, not a cluster (and expanding it would eat memory).
constexpr std::size_t kMaxHosts = 1 << 18;

bool all_digits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

std::string padded(long long value, std::size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// The values one bracket group stands for: "01-04,07" -> 01 02 03 04 07.
Result<std::vector<std::string>> expand_ranges(const std::string& body, const std::string& what,
                                               const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= body.size()) {
    const std::size_t comma = std::min(body.find(',', start), body.size());
    const std::string item = body.substr(start, comma - start);
    const std::size_t dash = item.find('-');
    const std::string lo_text = item.substr(0, dash);
    const std::string hi_text = dash == std::string::npos ? lo_text : item.substr(dash + 1);
    if (!all_digits(lo_text) || !all_digits(hi_text) || lo_text.size() > 9 || hi_text.size() > 9) {
      return bad(what + ": '" + item + "' in '" + text + "' is not a number or a range like 01-04");
    }
    const long long lo = *to_int(lo_text);
    const long long hi = *to_int(hi_text);
    if (hi < lo) return bad(what + ": range '" + item + "' in '" + text + "' runs backwards");
    if (out.size() + static_cast<std::size_t>(hi - lo) >= kMaxHosts) {
      return bad(what + ": '" + text + "' names more than " + std::to_string(kMaxHosts) + " hosts");
    }
    for (long long v = lo; v <= hi; ++v) out.push_back(padded(v, lo_text.size()));
    start = comma + 1;
  }
  return out;
}

// One host expression without top-level commas: "rack[1-2]-n[08-10]".
Status expand_one(const std::string& expr, const std::string& what, const std::string& text,
                  std::vector<std::string>& hosts) {
  std::vector<std::string> names{""};
  std::size_t i = 0;
  while (i < expr.size()) {
    const std::size_t open = expr.find('[', i);
    const std::string literal = expr.substr(i, open == std::string::npos ? open : open - i);
    if (literal.find(']') != std::string::npos) {
      return bad(what + ": unmatched ']' in '" + text + "'");
    }
    for (auto& n : names) n += literal;
    if (open == std::string::npos) break;
    const std::size_t close = expr.find(']', open);
    if (close == std::string::npos) return bad(what + ": unclosed '[' in '" + text + "'");
    auto values = expand_ranges(expr.substr(open + 1, close - open - 1), what, text);
    if (!values) return values.error();
    if (names.size() * values.value().size() + hosts.size() > kMaxHosts) {
      return bad(what + ": '" + text + "' names more than " + std::to_string(kMaxHosts) + " hosts");
    }
    std::vector<std::string> product;
    for (const auto& n : names) {
      for (const auto& v : values.value()) product.push_back(n + v);
    }
    names = std::move(product);
    i = close + 1;
  }
  for (auto& n : names) {
    if (n.empty()) return bad(what + ": empty host name in '" + text + "'");
    hosts.push_back(std::move(n));
  }
  return rendezvous::ok_status();
}

std::optional<std::string> non_empty(const EnvLookup& env, const std::string& name) {
  auto v = env(name);
  if (!v || v->empty()) return std::nullopt;
  return v;
}

}  // namespace

Result<std::vector<std::string>> expand_hostlist(const std::string& text, const std::string& what) {
  std::vector<std::string> hosts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ',';
    if (c == '[') {
      if (++depth > 1) return bad(what + ": nested '[' in '" + text + "'");
    } else if (c == ']') {
      if (--depth < 0) return bad(what + ": unmatched ']' in '" + text + "'");
    } else if (c == ',' && depth == 0) {
      const std::string expr = text.substr(start, i - start);
      if (expr.empty()) return bad(what + ": empty host name in '" + text + "'");
      if (auto s = expand_one(expr, what, text, hosts); !s) return s.error();
      start = i + 1;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      return bad(what + ": unexpected white space in '" + text + "'");
    }
  }
  if (depth != 0) return bad(what + ": unclosed '[' in '" + text + "'");
  return hosts;
}

Result<SlurmFacts> read_slurm_environment(const EnvLookup& env) {
  SlurmFacts facts;
  auto job = non_empty(env, "SLURM_JOB_ID");
  if (!job) return bad("--slurm: SLURM_JOB_ID is not set: not inside a Slurm allocation");
  facts.job_id = *job;
  // Inside srun the step's own variables describe the nodes this command runs on, which may be
  // fewer than the allocation's.
  const bool step = non_empty(env, "SLURM_STEP_NUM_NODES").has_value();
  const std::string nnodes_var = step ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
  const std::string list_var = step ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
  auto nnodes_text = non_empty(env, nnodes_var);
  auto node_text = non_empty(env, "SLURM_NODEID");
  auto list_text = non_empty(env, list_var);
  if (!nnodes_text || !node_text || !list_text) {
    return bad("--slurm: " +
               (!nnodes_text ? nnodes_var
                : !node_text ? "SLURM_NODEID"
                             : list_var) +
               " is not set");
  }
  auto nnodes = to_int(*nnodes_text);
  if (!nnodes || *nnodes < 1 || *nnodes > static_cast<long long>(kMaxHosts)) {
    return bad("--slurm: " + nnodes_var + " must be a positive node count, got '" + *nnodes_text +
               "'");
  }
  // srun with several tasks per node would start several agents claiming one node rank.
  if (auto local = non_empty(env, "SLURM_LOCALID"); local && *local != "0") {
    return bad("--slurm: run one ctrun per node (srun --ntasks-per-node=1); this is task " +
               *local + " on its node (SLURM_LOCALID)");
  }
  auto node = to_int(*node_text);
  if (!node || *node < 0 || *node >= *nnodes) {
    return bad("--slurm: SLURM_NODEID must be in 0.." + std::to_string(*nnodes - 1) + ", got '" +
               *node_text + "'");
  }
  auto hosts = expand_hostlist(*list_text, list_var);
  if (!hosts) return hosts.error();
  if (hosts.value().size() != static_cast<std::size_t>(*nnodes)) {
    return bad("--slurm: " + list_var + " '" + *list_text + "' names " +
               std::to_string(hosts.value().size()) + " hosts but " + nnodes_var + " is " +
               *nnodes_text);
  }
  facts.nnodes = static_cast<int>(*nnodes);
  facts.node_id = static_cast<int>(*node);
  facts.hosts = std::move(hosts).value();

  if (auto gpus = non_empty(env, "SLURM_GPUS_ON_NODE")) {
    auto n = to_int(*gpus);
    if (!n || *n < 0 || *n > kMaxWorkersPerNode) {
      return bad("--slurm: SLURM_GPUS_ON_NODE must be a GPU count, got '" + *gpus + "'");
    }
    facts.gpus_on_node = static_cast<int>(*n);
  }
  if (facts.gpus_on_node == 0) {
    if (auto visible = non_empty(env, "CUDA_VISIBLE_DEVICES")) {
      facts.gpus_on_node = count_visible_devices(*visible);
    }
  }
  if (facts.gpus_on_node > kMaxWorkersPerNode) {
    return bad("--slurm: " + std::to_string(facts.gpus_on_node) +
               " GPUs on this node is more than ctrun starts (" +
               std::to_string(kMaxWorkersPerNode) + ")");
  }
  return facts;
}

int slurm_rendezvous_port(const std::string& job_id) {
  unsigned long long digits = 0;
  for (char c : job_id) {
    if (c >= '0' && c <= '9') digits = (digits * 10 + static_cast<unsigned>(c - '0')) % 10000;
  }
  const int port = 29400 + static_cast<int>(digits);
  return port == 29500 ? 39500 : port;
}

rendezvous::Status apply_slurm(const SlurmFacts& facts, const ExplicitOptions& given,
                               LaunchOptions& options) {
  LaunchOptions& o = options;
  if (!given.nnodes) o.min_nodes = o.max_nodes = facts.nnodes;
  if (!given.rdzv_id) o.rdzv_id = facts.job_id;
  if (!given.nproc_per_node && facts.gpus_on_node > 0) {
    o.nproc_per_node = std::to_string(facts.gpus_on_node);
  }
  const std::string& first = facts.hosts.front();
  const int port = slurm_rendezvous_port(facts.job_id);
  if (given.rdzv_backend && o.rdzv_backend == "static") {
    // torchrun's static form: node 0 serves the store at MASTER_ADDR:MASTER_PORT.
    if (!given.node_rank) o.node_rank = facts.node_id;
    o.node_rank_given = true;
    if (!given.master_addr) o.master_addr = first;
    if (!given.master_port) o.master_port = port;
    return rendezvous::ok_status();
  }
  if (o.rdzv_backend == "etcd" || o.rdzv_backend == "etcd-v2") {
    // The etcd cluster is the site's, not a host of the allocation: it must be named.
    if (!given.rdzv_endpoint) {
      return rendezvous::Error{rendezvous::ErrorCode::kBadRequest,
                               "--slurm with --rdzv_backend=" + o.rdzv_backend +
                                   " needs --rdzv_endpoint (the etcd cluster's endpoints)"};
    }
    if (!given.node_rank) {
      o.node_rank = facts.node_id;
      o.node_rank_given = true;
    }
    return rendezvous::ok_status();
  }
  if (!given.rdzv_backend) o.rdzv_backend = "c10d";
  if (!given.node_rank) {
    o.node_rank = facts.node_id;
    o.node_rank_given = true;
  }
  if (!given.rdzv_endpoint) {
    o.rdzv_endpoint = rendezvous::format_endpoint({first, static_cast<std::uint16_t>(port)});
    // Node 0 is the first host of the list: it hosts, the others only reach it.
    if (!o.rdzv_conf.is_host) o.rdzv_conf.is_host = facts.node_id == 0;
  }
  return rendezvous::ok_status();
}

}  // namespace ctrun::launcher

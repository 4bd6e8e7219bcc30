// rdzv_bench: how long ctrund takes to form one round of N nodes, and how much memory it needs.
// For each N a fresh ctrund is started as the packaged service runs it (--state_dir,
// --token_file, its default limits); one single-threaded load generator plays all N nodes, from
// many addresses of 127.0.0.0/8, proving the token.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>

#include "../common/process.h"
#include "join_storm.h"

namespace {

using bench::Child;
using bench::Clock;

struct Row {
  int nodes = 0;
  double join_wall_s = 0;
  double first_answer_s = 0;
  double answer_bytes = 0;  // bytes received per node after its join: its answer
  double daemon_hwm_mib = 0;
  double daemon_cpu_s = 0;  // whole daemon lifetime: start, connects, hellos, joins
};

std::optional<Row> run_once(const std::string& ctrund, int nodes, const std::string& dir) {
  const std::string port_file = dir + "/ctrund.port";
  std::remove(port_file.c_str());
  const std::string state_dir = dir + "/state-" + std::to_string(nodes);
  bench::remove_tree(state_dir);
  const std::string token_file = dir + "/token";
  const std::string token = "rdzv-bench-token";
  std::ofstream(token_file) << token << "\n";
  Child::Options o;
  o.argv = {ctrund,    "--host",      "127.0.0.1", "--port",       "0",       "--port_file",
            port_file, "--state_dir", state_dir,   "--token_file", token_file};
  o.stderr_path = dir + "/ctrund-" + std::to_string(nodes) + ".log";
  Child daemon = Child::spawn(o);
  auto port = bench::wait_for_port_file(port_file, Clock::now() + std::chrono::seconds(30));
  if (!port) {
    std::cerr << "rdzv_bench: ctrund did not start; see " << o.stderr_path << "\n";
    return std::nullopt;
  }
  rdzv_bench::StormOptions storm;
  storm.port = *port;
  storm.nodes = nodes;
  storm.token = token;
  const auto r = rdzv_bench::run_join_storm(storm);
  Row row;
  row.nodes = nodes;
  row.daemon_hwm_mib = static_cast<double>(bench::read_vm_hwm_kib(daemon.pid())) / 1024.0;
  row.daemon_cpu_s = bench::read_cpu_seconds(daemon.pid());
  daemon.stop();
  if (!r.ok) {
    std::cerr << "rdzv_bench: " << nodes << " nodes: " << r.error << " (daemon log "
              << o.stderr_path << ")\n";
    return std::nullopt;
  }
  row.join_wall_s = r.join_wall_s;
  row.first_answer_s = r.first_answer_s;
  row.answer_bytes = static_cast<double>(r.answer_bytes) / nodes;
  return row;
}

// The target the issue sets for this node count, as text, and whether it is met.
std::string verdict(const Row& r) {
  std::string out;
  auto add = [&out](const std::string& s) { out += (out.empty() ? "" : "; ") + s; };
  if (r.nodes == 1024) add(std::string("< 1 s: ") + (r.join_wall_s < 1 ? "MET" : "MISSED"));
  if (r.nodes == 4096) {
    add(std::string("< 5 s: ") + (r.join_wall_s < 5 ? "MET" : "MISSED"));
    add(std::string("< 100 MB: ") + (r.daemon_hwm_mib * 1.048576 < 100 ? "MET" : "MISSED"));
  }
  if (r.nodes == 8192) add(std::string("< 0.5 s: ") + (r.join_wall_s < 0.5 ? "MET" : "MISSED"));
  return out.empty() ? "-" : out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rdzv_bench: ctrund rendezvous formation time and memory at scale"};
  std::string ctrund = CTRUND_PATH;
  std::vector<int> node_counts = {16, 64, 256, 1024, 4096, 8192};
  int reps = 3;
  bool quick = false;
  std::string json_out;
  app.add_option("--ctrund", ctrund, "path of the ctrund binary");
  app.add_option("--nodes", node_counts, "node counts")->delimiter(',');
  app.add_option("--reps", reps, "repetitions per node count (the median is reported)");
  app.add_flag("--quick", quick, "one repetition");
  app.add_option("--json_out", json_out, "also write the rows as JSON lines here");
  CLI11_PARSE(app, argc, argv);
  if (quick) reps = 1;

  bench::install_cleanup_handlers();
  // Both ends hold one descriptor per node; ctrund inherits the raised limit.
  const long nofile = bench::raise_nofile_limit();
  for (int n : node_counts) {
    if (2L * n + 64 > nofile) {
      std::cerr << "rdzv_bench: RLIMIT_NOFILE " << nofile << " is too low for " << n << " nodes\n";
      return 1;
    }
  }
  const std::string dir = bench::make_temp_dir("rdzv_bench.");
  std::vector<Row> rows;
  bool failed = false;
  for (int n : node_counts) {
    std::vector<Row> runs;
    for (int rep = 0; rep < reps; ++rep) {
      auto row = run_once(ctrund, n, dir);
      if (!row) {
        failed = true;
        break;
      }
      std::fprintf(stderr,
                   "rep %d %5d nodes: join %8.1f ms, daemon peak %.1f MiB, daemon cpu %.2f s\n",
                   rep + 1, n, row->join_wall_s * 1e3, row->daemon_hwm_mib, row->daemon_cpu_s);
      runs.push_back(*row);
    }
    if (runs.empty()) continue;
    // The run with the median join time represents this N (its memory and CPU go with it).
    std::sort(runs.begin(), runs.end(),
              [](const Row& a, const Row& b) { return a.join_wall_s < b.join_wall_s; });
    rows.push_back(runs[(runs.size() - 1) / 2]);
  }
  if (!failed) bench::remove_tree(dir);

  std::printf(
      "\nrdzv_bench: one round of N nodes (min = max = N), a fresh ctrund per run as packaged "
      "(--state_dir, --token_file, default limits; nodes from 512 to an address of 127.1.0.0/16), "
      "median of %d\n\n",
      reps);
  std::printf(
      "| nodes | join wall (ms) | first answer (ms) | answer (bytes) | daemon VmHWM (MiB) | daemon "
      "CPU (s) | target |\n");
  std::printf(
      "|------:|---------------:|------------------:|---------------:|-------------------:|--------"
      "-------:|--------|\n");
  for (const auto& r : rows) {
    std::printf("| %5d | %14.1f | %17.1f | %14.0f | %18.1f | %14.2f | %s |\n", r.nodes,
                r.join_wall_s * 1e3, r.first_answer_s * 1e3, r.answer_bytes, r.daemon_hwm_mib,
                r.daemon_cpu_s, verdict(r).c_str());
  }
  if (!json_out.empty()) {
    std::ofstream out(json_out);
    for (const auto& r : rows) {
      out << "{\"nodes\": " << r.nodes << ", \"join_wall_s\": " << r.join_wall_s
          << ", \"daemon_hwm_mib\": " << r.daemon_hwm_mib << "}\n";
    }
  }
  return failed ? 1 : 0;
}

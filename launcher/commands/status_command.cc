#include "launcher/commands/status_command.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <cstdio>

#include "ctrun/rendezvous/client.h"
#include "ctrun/rendezvous/endpoint.h"
#include "launcher/commands/status_view.h"
#include "launcher/commands/subcommand.h"
#include "launcher/diagnosis/hang_report.h"
#include "rendezvous/base/token.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_jobs.h"
#include "rendezvous/protocol/dump_keys.h"
#include "rendezvous/protocol/fault_keys.h"
#include "rendezvous/protocol/step_keys.h"

namespace ctrun::launcher {

namespace rdzv = ctrun::rendezvous;

namespace {

// The job a status connection names when it asks about every job; the daemon leaves it out of
// its answer and forgets it when the connection goes.
constexpr const char* kObserverJob = "ctrun-status";

int fail(const std::string& message, int code) {
  std::fprintf(stderr, "ctrun status: error: %s\n", message.c_str());
  return code;
}

// Runs one etcd read to its end on a private loop.
rdzv::Result<rdzv::Json> run_read(boost::asio::io_context& io,
                                  rdzv::etcd::Task<rdzv::Result<rdzv::Json>> read) {
  rdzv::Result<rdzv::Json> out;
  boost::asio::co_spawn(io, std::move(read), [&](std::exception_ptr e, rdzv::Result<rdzv::Json> r) {
    out = e ? rdzv::Result<rdzv::Json>(rdzv::Error{rdzv::ErrorCode::kInternal, "etcd read failed"})
            : std::move(r);
  });
  io.run();
  return out;
}

// `ctrun status` on etcd: the same views, built from the job's keys (etcd_jobs.h).
int etcd_status(const RendezvousTarget& target, rdzv::Duration limit, bool json) {
  const std::string& endpoint = target.endpoint;
  const std::string& id = target.id;
  auto endpoints = rdzv::parse_endpoint_list(endpoint);
  if (!endpoints) return fail(endpoints.error().message, 2);
  auto access = target_store_access(target);
  if (!access) return fail(access.error().message, 2);
  boost::asio::io_context io;
  rdzv::etcd::ClientOptions plain;
  plain.endpoints = endpoints.value();
  plain.request_timeout = limit;
  plain.attempt_timeout = std::min(limit, plain.attempt_timeout);
  auto options = rdzv::etcd::with_access(plain, access.value());
  if (!options) return fail(options.error().message, 2);
  rdzv::etcd::Client client(io, options.value());
  if (id.empty()) {
    auto jobs = run_read(io, rdzv::etcd_jobs(client));
    if (!jobs)
      return fail("cannot read jobs from etcd at " + endpoint + ": " + jobs.error().message, 1);
    const std::string text =
        json ? jobs_json(jobs.value()).dump(2) + "\n" : jobs_table(jobs.value());
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  auto status = run_read(io, rdzv::etcd_job_status(client, id));
  if (!status)
    return fail(
        "cannot read job '" + id + "' from etcd at " + endpoint + ": " + status.error().message, 1);
  const rdzv::Json& st = status.value();
  if (st["rendezvous"].is_null() && st.value("keys", 0) == 0) {
    return fail("no job '" + id + "' at " + endpoint, 1);
  }
  JobStatus job{st, st.value("max_restarts", -1LL), st.value("last_fault", rdzv::Json()),
                st.value("steps", rdzv::Json())};
  const std::string text = json ? job_status_json(job).dump(2) + "\n" : job_status_table(job);
  std::fputs(text.c_str(), stdout);
  return 0;
}

// `ctrun status --dump`: asks every agent of the job for its workers' stacks (the agents' dump
// watch answers), then prints where each rank stands. Node 0's answer says how many nodes the
// round has; the others' are waited for within what is left of `timeout_s`.
int dump_job_stacks(const RendezvousTarget& target, const EnvLookup& env, bool json,
                    double timeout_s) {
  if (target.id.empty()) return fail("--dump needs --rdzv_id: the job whose stacks to take", 2);
  auto store = connect_job_store(target, env);
  if (!store) {
    return fail(store.error().message, store.error().code == rdzv::ErrorCode::kConnection ? 1 : 2);
  }
  rdzv::StoreClient& s = *store.value();
  auto number = s.add(rdzv::kDumpRequestsKey, 1);
  if (!number) return fail("cannot ask job '" + target.id + "': " + number.error().message, 1);
  const std::int64_t n = number.value();
  const std::int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
  const std::string request =
      rdzv::encode_dump_request({"ctrun status --dump", "ctrun status", now_ms});
  if (auto asked = s.set(rdzv::dump_request_key(n), request); !asked) {
    return fail("cannot ask job '" + target.id + "': " + asked.error().message, 1);
  }
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<rdzv::Duration>(std::chrono::duration<double>(timeout_s));
  auto left = [&] {
    return std::max<rdzv::Duration>(deadline - std::chrono::steady_clock::now(),
                                    std::chrono::milliseconds(1));
  };
  DumpAnswers answers(1, /*nodes_from_node0=*/true);
  for (int node = 0; node < answers.nodes(); ++node) {
    auto text = s.get(rdzv::dump_answer_key(n, node), left());
    if (!text && node == 0) {
      return fail("no stacks from node 0's agent of job '" + target.id + "' within " +
                      std::to_string(static_cast<long long>(timeout_s + 0.5)) +
                      " s: is the job running its workers? (--dump_timeout)",
                  1);
    }
    if (text) answers.add(node, text.value());
  }
  const JobStacks job_stacks = answers.job();
  const HangReport report =
      build_hang_report(job_stacks.ranks, job_stacks.missing_nodes, job_stacks.flight);
  if (json) {
    rdzv::Json out = hang_report_json(report, job_stacks.ranks);
    out["request"] = n;
    std::fputs((out.dump(2) + "\n").c_str(), stdout);
    return 0;
  }
  std::printf("job '%s': where every rank stands (dump request %lld)\n", target.id.c_str(),
              static_cast<long long>(n));
  for (const auto& line : hang_report_lines(report)) std::printf("  %s\n", line.c_str());
  for (const RankStacks& r : job_stacks.ranks) {
    const StackPlace place = stack_place(r);
    std::printf("rank %d (%s, pid %d%s): %s%s\n", r.rank, r.host.c_str(), r.pid,
                r.step ? (", step " + std::to_string(*r.step)).c_str() : "",
                place.function.empty() ? "no stack" : place.function.c_str(),
                place.at.empty() ? "" : (" at " + place.at).c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int run_status_command(const std::vector<std::string>& args, const EnvLookup& env) {
  CLI::App app{"ctrun status: the jobs a rendezvous holds, or one job in detail", "ctrun status"};
  RendezvousTarget target;
  target.endpoint = env("PET_RDZV_ENDPOINT").value_or("");
  bool json = false;
  add_rendezvous_options(app, target, "the job to show in detail (default: list every job)");
  app.add_flag("--json", json, "print JSON instead of a table");
  bool dump = false;
  double dump_timeout = 20;
  app.add_flag("--dump", dump,
               "ask every agent of the job for its workers' stacks and last steps, and print "
               "where each rank stands (a hang report; --json: every stack)");
  app.add_option("--dump_timeout,--dump-timeout", dump_timeout,
                 "seconds to wait for the agents' stacks with --dump (20)")
      ->check(CLI::PositiveNumber);
  if (auto code = parse_subcommand(app, args, target, fail)) return *code;
  if (dump) return dump_job_stacks(target, env, json, dump_timeout);
  const std::string& endpoint = target.endpoint;
  const std::string& id = target.id;
  const auto limit =
      std::chrono::duration_cast<rdzv::Duration>(std::chrono::duration<double>(target.timeout));
  if (target.etcd()) return etcd_status(target, limit, json);
  auto ep = parse_endpoint(endpoint, rdzv::kDefaultPort);
  if (!ep) return fail(ep.error().message, 2);
  auto access = target_store_access(target);
  if (!access) return fail(access.error().message, 2);

  rdzv::ClientOptions options;
  options.tls = access.value().tls;
  options.host = ep.value().host;
  options.port = ep.value().port;
  options.job = id.empty() ? kObserverJob : id;
  options.connect_timeout = limit;
  auto token = rdzv::resolve_token(target.token_file, env(rdzv::kTokenVariable));
  if (!token) return fail(token.error().message, 2);
  options.token = token.value();
  const std::string where = rdzv::format_endpoint(ep.value());
  auto client = rdzv::Client::connect(options);
  if (!client)
    return fail("cannot reach the rendezvous at " + where + ": " + client.error().message, 1);

  if (id.empty()) {
    auto jobs = client.value()->call(rdzv::Json{{"op", "jobs"}});
    if (!jobs) return fail(jobs.error().message, 1);
    const std::string text =
        json ? jobs_json(jobs.value()).dump(2) + "\n" : jobs_table(jobs.value());
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  auto status = client.value()->status();
  if (!status) return fail(status.error().message, 1);
  const rdzv::Json& st = status.value();
  if (st.value("rendezvous", rdzv::Json()).is_null() && st.value("keys", 0) == 0) {
    return fail("no job '" + id + "' at " + where, 1);
  }
  JobStatus job{st, -1, rdzv::Json(), rdzv::Json()};
  if (auto budget = client.value()->get(rdzv::kMaxRestartsKey, std::chrono::milliseconds(0))) {
    job.max_restarts = std::atoll(budget.value().c_str());
  }
  if (const auto faults = st.value("faults_injected", 0LL); faults > 0) {
    const std::string key = rdzv::kFaultInjectedPrefix + std::to_string(faults);
    if (auto last = client.value()->get(key, std::chrono::milliseconds(0))) {
      job.last_fault = rdzv::Json::parse(last.value(), nullptr, /*allow_exceptions=*/false);
      if (job.last_fault.is_discarded()) job.last_fault = rdzv::Json();
    }
  }
  if (auto steps = client.value()->get(rdzv::kStragglersKey, std::chrono::milliseconds(0))) {
    job.steps = rdzv::Json::parse(steps.value(), nullptr, /*allow_exceptions=*/false);
    if (job.steps.is_discarded()) job.steps = rdzv::Json();
  }
  const std::string text = json ? job_status_json(job).dump(2) + "\n" : job_status_table(job);
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace ctrun::launcher

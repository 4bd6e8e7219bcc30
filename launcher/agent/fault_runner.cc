#include "launcher/agent/fault_runner.h"

#include <unistd.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <csignal>
#include <cstring>
#include <fstream>

#include "launcher/agent/agent_os.h"
#include "launcher/faults/fault_plan.h"
#include "rendezvous/base/log.h"
#include "rendezvous/protocol/fault_keys.h"

namespace ctrun::launcher {

namespace asio = boost::asio;
namespace rdzv = ctrun::rendezvous;
using rdzv::Task;

rdzv::Result<std::unique_ptr<FaultRunner>> FaultRunner::create(asio::io_context& io,
                                                               const LaunchOptions& options,
                                                               std::string node_id,
                                                               WorkerRunner& workers, Hooks hooks) {
  const std::string& value = options.faults;
  rdzv::Result<FaultPlan> plan = FaultPlan{};
  if (value.empty() || value == "live") {
    // No planned faults: only those `ctrun fault` asks for while the job runs, or none.
  } else if (auto text = read_text_file(value)) {
    plan = parse_fault_plan_json(*text, value);
  } else if (value.rfind("random:", 0) == 0) {
    plan = random_fault_plan(value);
  } else {
    plan = parse_inline_fault_plan(value);
  }
  if (!plan) return plan.error();
  std::unique_ptr<FaultRunner> runner(
      new FaultRunner(io, options, std::move(node_id), plan.value(), workers, std::move(hooks)));
  for (const Fault& f : plan.value().faults) {
    if (auto s = runner->check_needs(f); !s) return s.error();
  }
  if (!value.empty()) {
    // The plan as it will run, windows drawn: what --faults reads back to replay it exactly.
    const rdzv::Json json = fault_plan_json(plan.value());
    runner->log("fault plan (replay it with --faults=FILE holding this line): " + json.dump());
    runner->hooks_.event("fault_plan", {{"plan", json}});
  }
  return runner;
}

FaultRunner::FaultRunner(asio::io_context& io, const LaunchOptions& options, std::string node_id,
                         FaultPlan plan, WorkerRunner& workers, Hooks hooks)
    : io_(io),
      options_(options),
      node_id_(std::move(node_id)),
      workers_(workers),
      hooks_(std::move(hooks)),
      injector_(std::move(plan)),
      timer_(io),
      node_faults_({[](const std::vector<std::string>& argv) {
                      const ToolRun run = run_tool(argv);
                      return std::pair<int, std::string>(run.exit_code, run.output);
                    },
                    hooks_.log}) {}

rdzv::Status FaultRunner::check_needs(const Fault& f) const {
  const std::string where = "--faults: fault " + std::to_string(f.id) + ": ";
  if (f.kind == FaultKind::kLinkLost) {
    if (!can_admin_network()) {
      return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                         where +
                             "a lost link is cut with nftables rules, which need root "
                             "(CAP_NET_ADMIN) on every node; run the job's agents as root, "
                             "e.g. in network namespaces (scripts/netns-cluster.sh)"};
    }
    if (run_tool({"nft", "--version"}).exit_code != 0) {
      return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                         where +
                             "a lost link is cut with nft, which is not installed here "
                             "(Debian: apt-get install nftables)"};
    }
  }
  if (f.kind == FaultKind::kCudaError && probe_machine(process_env()).gpu_count == 0) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       where +
                           "a CUDA error is made by a failing kernel on the worker's GPU, and "
                           "this node has none visible (no /dev/nvidiaN, or "
                           "CUDA_VISIBLE_DEVICES hides them)"};
  }
  if (f.kind == FaultKind::kRendezvousRestart &&
      (options_.rdzv_backend == "etcd" || options_.rdzv_backend == "etcd-v2" ||
       options_.rdzv_conf.is_host == false)) {
    return rdzv::Error{rdzv::ErrorCode::kBadRequest,
                       where +
                           "a rendezvous restart restarts the rendezvous ctrun hosts "
                           "(--standalone, --hostfile, or c10d hosted by an agent); this job's "
                           "is a service of its own (etcd, or ctrund with is_host=false): "
                           "restart that yourself"};
  }
  return rdzv::ok_status();
}

std::unique_ptr<rdzv::Backend> FaultRunner::wrap_backend(std::unique_ptr<rdzv::Backend> inner) {
  auto switched = std::make_unique<CutOffBackend>(io_, std::move(inner));
  backend_ = switched.get();
  return switched;
}

void FaultRunner::connected(const std::string& host) {
  host_ = host;
  if (options_.faults.empty() || watching_requests_) return;
  watching_requests_ = true;
  asio::co_spawn(io_, watch_requests(), asio::detached);
}

void FaultRunner::workers_started(const rdzv::RoundAssignment& round, int local_world_size,
                                  int restart_count, bool hosts_rendezvous) {
  round_ = round;
  local_world_size_ = local_world_size;
  const auto wall = std::chrono::system_clock::now();
  injector_.set_hosts_rendezvous(hosts_rendezvous || rendezvous_down_);
  injector_.workers_started(round.group_rank, round.rank_offset, local_world_size,
                            std::chrono::steady_clock::now());
  // Where this node is, for a peer's lost link (the cutting agent looks its peer up).
  asio::co_spawn(
      io_,
      [this, key = round.store_prefix + rdzv::kFaultHostKey + std::to_string(round.group_rank),
       host = host_]() -> Task<void> { (void)co_await backend_->set(key, host); },
      asio::detached);
  report_.workers_started(std::nullopt, wall);
  report_.restarts(restart_count);
  timeline_.workers_started(std::nullopt, round.rank_offset, local_world_size, wall);
  steps_.assign(static_cast<std::size_t>(local_world_size), std::nullopt);
  timer_.cancel();
  arm_timer();
}

void FaultRunner::worker_replaced(int local_rank, int restart_count) {
  const auto wall = std::chrono::system_clock::now();
  injector_.worker_replaced(local_rank);
  report_.workers_started(local_rank, wall);
  report_.restarts(restart_count);
  timeline_.workers_started(local_rank, round_.rank_offset, local_world_size_, wall);
  if (static_cast<std::size_t>(local_rank) < steps_.size()) steps_[local_rank] = std::nullopt;
}

void FaultRunner::worker_ended(const WorkerExit& e) {
  const auto wall = std::chrono::system_clock::now();
  const bool failed = e.exit_code != 0 || e.signal != 0;
  if (failed) report_.worker_failed(e.local_rank, wall);
  timeline_.worker_ended(e.local_rank, !failed, wall);
}

void FaultRunner::workers_stopping() {
  for (int local_rank : injector_.stopped_workers()) workers_.kill(local_rank, SIGCONT);
  injector_.workers_stopped();
  report_.workers_stopped(std::chrono::system_clock::now());
  timeline_.workers_stopped(std::chrono::system_clock::now());
}

void FaultRunner::set_result_file(int local_rank, std::string path) {
  const auto slot = static_cast<std::size_t>(local_rank);
  if (result_files_.size() <= slot) result_files_.resize(slot + 1);
  result_files_[slot] = std::move(path);
}

void FaultRunner::arm_timer() {
  // Also once every fault has fired: the report follows the steps after them.
  timer_.expires_after(std::chrono::milliseconds(20));
  timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || hooks_.exiting()) return;
    tick();
    arm_timer();
  });
}

void FaultRunner::tick() {
  const auto wall = std::chrono::system_clock::now();
  for (std::size_t i = 0; i < steps_.size(); ++i) {
    auto step = hooks_.step(static_cast<int>(i));
    if (!step || step == steps_[i]) continue;
    steps_[i] = step;
    injector_.observe_step(static_cast<int>(i), *step);
    report_.step_reported(static_cast<int>(i), *step, wall);
    timeline_.step(static_cast<int>(i), *step, wall);
  }
  auto due = injector_.poll(std::chrono::steady_clock::now());
  // A cut-off drops the rendezvous' connections: its fault is recorded there first.
  auto recorded_first = [&due](const FaultInjector::Action& a) {
    return a.kind == FaultInjector::Action::Kind::kCutOff &&
           std::any_of(due.fired.begin(), due.fired.end(),
                       [&a](const auto& f) { return f.fault_id == a.fault_id; });
  };
  for (const auto& fired : due.fired) {
    report_.fired(fired.fault_id, fired.line, fired.rank, fired.local_rank, fired.ends_worker,
                  static_cast<std::size_t>(fired.local_rank) < steps_.size()
                      ? steps_[fired.local_rank]
                      : std::nullopt,
                  wall);
    log("injecting " + fired.line);
    const int pid = workers_.running_pid(fired.local_rank);
    hooks_.event("fault_injected", {{"injected", true},
                                    {"fault", fired.fault_id},
                                    {"rank", fired.rank},
                                    {"local_rank", fired.local_rank},
                                    {"pid", pid},
                                    {"what", fired.line}});
    std::vector<FaultInjector::Action> after;
    for (const auto& a : due.actions) {
      if (recorded_first(a) && a.fault_id == fired.fault_id) after.push_back(a);
    }
    record(fired, pid, [this, after, due] {
      for (const auto& a : after) carry_out(a, due);
    });
    timeline_.fired(fired.fault_id, fired.local_rank, fired.line,
                    fired.kind == FaultKind::kHang        ? FaultTimeline::State::kHung
                    : fired.kind == FaultKind::kStraggler ? FaultTimeline::State::kSlowed
                                                          : FaultTimeline::State::kRunning,
                    wall);
  }
  for (const auto& a : due.actions) {
    if (a.ends_effect) timeline_.effect_ended(a.local_rank, wall);
    if (!recorded_first(a)) carry_out(a, due);
  }
}

void FaultRunner::carry_out(const FaultInjector::Action& a, const FaultInjector::Due& due) {
  using Kind = FaultInjector::Action::Kind;
  const std::string id = "fault " + std::to_string(a.fault_id);
  switch (a.kind) {
    case Kind::kSignal:
      workers_.signal_process(a.local_rank, a.signo);  // as a crash of the worker itself
      return;
    case Kind::kStop:
    case Kind::kContinue:
      workers_.kill(a.local_rank, a.signo);  // SIGSTOP/SIGCONT: the whole process group
      return;
    case Kind::kNodeLost:
      // As a machine that dies: no goodbye to the rendezvous, no report, workers and agent
      // gone at once (the log and event lines are written already).
      workers_.kill_all();
      std::raise(SIGKILL);
      return;
    case Kind::kRaise: {
      // Raised, or the failing kernel launched, by the worker itself at its next reported step
      // (ctrun_worker.report_step): the file's first line is the kind, the second the message.
      const std::string file = hooks_.worker_dir(a.local_rank) + "/fault";
      std::string what = id;
      const char* kind = "exception";
      for (const auto& fired : due.fired) {
        if (fired.fault_id != a.fault_id) continue;
        what = fired.line;
        if (fired.kind == FaultKind::kCudaError) kind = "cuda_error";
      }
      if (!write_text_file_atomically(file,
                                      std::string(kind) + "\nctrun: injected " + what + "\n")) {
        log("error: " + id + ": cannot write '" + file + "': " + std::strerror(errno));
      }
      return;
    }
    case Kind::kStoreLatency: {
      // The daemon reads the key as it is set (service.cc) and delays the job's answers.
      const std::string text = rdzv::Json{{"ms", a.ms}, {"seconds", a.seconds}}.dump();
      asio::co_spawn(
          io_,
          [this, text, id]() -> Task<void> {
            auto s = co_await backend_->set(rdzv::kStoreLatencyKey, text);
            if (!s) log("error: " + id + ": the rendezvous was not told: " + s.error().message);
          },
          asio::detached);
      return;
    }
    case Kind::kCutOff:
      backend_->cut_off(
          std::chrono::duration_cast<rdzv::Duration>(std::chrono::duration<double>(a.seconds)),
          "cut off from the rendezvous by " + id);
      return;
    case Kind::kLinkDown:
      asio::co_spawn(io_, cut_link(a.fault_id, a.peer), asio::detached);
      return;
    case Kind::kLinkUp:
      node_faults_.restore_link(a.fault_id);
      return;
    case Kind::kFillDisk:
      node_faults_.fill_disk(a.fault_id, a.path);
      return;
    case Kind::kFreeDisk:
      node_faults_.free_disk(a.fault_id);
      return;
    case Kind::kStopRendezvous:
      // As a daemon killed: every connection closed at once, no goodbye; what it keeps of the
      // job is in its state files.
      if (hooks_.stop_rendezvous()) {
        rendezvous_down_ = true;
        log(id + ": the rendezvous this agent hosts is down");
      }
      return;
    case Kind::kStartRendezvous:
      if (rendezvous_down_ && !hooks_.exiting()) {
        rendezvous_down_ = false;
        if (auto s = hooks_.start_rendezvous(); !s) {
          log("error: " + id + ": the rendezvous could not start again: " + s.error().message);
        }
      }
      return;
  }
}

Task<void> FaultRunner::cut_link(int fault_id, int peer) {
  const std::string id = "fault " + std::to_string(fault_id);
  // The peer says where it is as its workers start; a moment's wait covers a peer just starting.
  auto host = co_await backend_->get(
      round_.store_prefix + rdzv::kFaultHostKey + std::to_string(peer), std::chrono::seconds(10));
  if (!host) {
    log("error: " + id + ": node " + std::to_string(peer) +
        "'s address is not known (it publishes it as its workers start): " + host.error().message);
    co_return;
  }
  boost::system::error_code ec;
  asio::ip::address address = asio::ip::make_address(host.value(), ec);
  if (ec) {
    asio::ip::tcp::resolver resolver(io_);
    auto found = resolver.resolve(host.value(), "", ec);
    if (!ec && !found.empty()) address = found.begin()->endpoint().address();
  }
  if (ec) {
    log("error: " + id + ": node " + std::to_string(peer) + "'s address '" + host.value() +
        "' cannot be resolved: " + ec.message());
    co_return;
  }
  node_faults_.cut_link(fault_id, peer, address.to_string(), address.is_v6());
}

void FaultRunner::record(const FaultInjector::Fired& fired, int pid, std::function<void()> then) {
  rdzv::Json record{{"time", rdzv::utc_stamp(std::chrono::system_clock::now())},
                    {"node", node_id_},
                    {"host", host_},
                    {"fault", fired.fault_id},
                    {"rank", fired.rank},
                    {"local_rank", fired.local_rank},
                    {"pid", pid},
                    {"what", fired.line},
                    {"injected", true}};
  std::optional<std::int64_t> request;
  if (fired.fault_id > injector_.planned()) {
    request = fired.fault_id - injector_.planned();
    record["request"] = *request;
  }
  asio::co_spawn(
      io_,
      [this, text = record.dump(), request, id = fired.fault_id,
       then = std::move(then)]() -> Task<void> {
        auto number = co_await backend_->add(rdzv::kFaultsInjectedKey, 1);
        // (No co_await inside a conditional expression: g++ 12 destroys the other branch's
        // temporary twice.)
        rdzv::Status s = rdzv::ok_status();
        if (number) {
          s = co_await backend_->set(rdzv::kFaultInjectedPrefix + std::to_string(number.value()),
                                     text);
        } else {
          s = number.error();
        }
        if (s && request) {
          s = co_await backend_->set(
              rdzv::kFaultRequestPrefix + std::to_string(*request) + rdzv::kFaultRequestDoneSuffix,
              text);
        }
        if (!s) {
          log("warning: fault " + std::to_string(id) +
              ": not recorded in the job's store (ctrun status): " + s.error().message);
        }
        if (then) then();
      },
      asio::detached);
}

Task<void> FaultRunner::watch_requests() {
  // Only faults asked for from now on: an agent that joins later does not replay old ones.
  std::int64_t next = 0;
  while (!hooks_.exiting()) {
    if (next == 0) {
      auto count = co_await backend_->add(rdzv::kFaultRequestsKey, 0);
      if (count) {
        next = count.value() + 1;
        continue;
      }
    } else {
      // Bounded waits, so that a reconnect or the end of the job is noticed.
      const std::string key = rdzv::kFaultRequestPrefix + std::to_string(next);
      auto text = co_await backend_->get(key, std::chrono::seconds(10));
      if (text) {
        take_request(next++, text.value());
        continue;
      }
      if (text.error().code == rdzv::ErrorCode::kTimeout) continue;
    }
    if (hooks_.exiting()) co_return;
    // Not connected now (a reconnect in progress).
    co_await rdzv::sleep_for(std::chrono::seconds(1));
  }
}

void FaultRunner::take_request(std::int64_t number, const std::string& text) {
  const std::string name = "ctrun fault " + std::to_string(number);
  rdzv::Json fault = rdzv::Json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto plan =
      fault.is_object()
          ? parse_fault_plan_json(rdzv::Json{{"faults", rdzv::Json::array({fault})}}.dump(), name)
          : rdzv::Result<FaultPlan>(rdzv::Error{rdzv::ErrorCode::kBadRequest, "not a JSON object"});
  if (!plan || plan.value().faults.size() != 1) {
    log("warning: " + name +
        " ignored: " + (plan ? std::string("not one fault") : plan.error().message));
    return;
  }
  Fault f = plan.value().faults.front();
  f.id = injector_.planned() + static_cast<int>(number);
  if (auto s = check_needs(f); !s) {
    log("warning: " + name + " ignored: " + s.error().message);
    return;
  }
  // A time in it counts from now (ctrun fault's default: at once).
  log("fault asked for (" + name + "): " + describe_fault(f) + (f.at_step ? "" : " from now"));
  hooks_.event("fault_requested",
               {{"fault", f.id}, {"request", number}, {"what", describe_fault(f)}});
  injector_.add(std::move(f), std::chrono::steady_clock::now());
}

void FaultRunner::finish(int exit_code, int rank_offset) {
  timer_.cancel();
  for (const auto& a : injector_.end_node_faults()) {
    if (a.kind == FaultInjector::Action::Kind::kLinkUp) node_faults_.restore_link(a.fault_id);
    if (a.kind == FaultInjector::Action::Kind::kFreeDisk) node_faults_.free_disk(a.fault_id);
  }
  for (const auto& line : report_.lines()) log(line);
  if (options_.fault_report.empty()) return;
  rdzv::Json report = report_.json(exit_code == 0 ? "succeeded" : "failed");
  // What the last workers wrote as their results, by global rank.
  rdzv::Json results = rdzv::Json::object();
  for (std::size_t i = 0; i < result_files_.size(); ++i) {
    std::ifstream in(result_files_[i]);
    std::string result;
    if (in && std::getline(in, result))
      results[std::to_string(rank_offset + static_cast<int>(i))] = result;
  }
  report["results"] = std::move(results);
  // FILE.html: the report as a page (a timeline per worker); any other name: JSON.
  const std::string& path = options_.fault_report;
  const bool page = path.size() >= 5 && path.compare(path.size() - 5, 5, ".html") == 0;
  const std::string text =
      page ? timeline_.html(report, std::chrono::system_clock::now()) : report.dump(2) + "\n";
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) log("error: --fault_report: cannot write '" + path + "': " + std::strerror(errno));
}

}  // namespace ctrun::launcher

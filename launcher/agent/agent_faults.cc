// --faults in the agent: the plan read at setup, what falls due carried out while workers run
// (fault_injector.h decides; here are signals, files, nft rules, disk fills, the hosted
// rendezvous), faults asked for by `ctrun fault`, and the report at the end.
#include "launcher/agent/agent_impl.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <fstream>

#include "launcher/agent/agent_os.h"
#include "launcher/faults/fault_plan.h"
#include "rendezvous/base/log.h"
#include "rendezvous/protocol/fault_keys.h"

namespace ctrun::launcher {

rdzv::Status Agent::Impl::load_fault_plan() {
  const std::string& value = options_.faults;
  rdzv::Result<FaultPlan> plan = FaultPlan{};
  if (value == "live") {
    // No planned faults: only those `ctrun fault` asks for while the job runs.
  } else if (auto text = read_text_file(value)) {
    plan = parse_fault_plan_json(*text, value);
  } else if (value.rfind("random:", 0) == 0) {
    plan = random_fault_plan(value);
  } else {
    plan = parse_inline_fault_plan(value);
  }
  if (!plan) return plan.error();
  for (const Fault& f : plan.value().faults) {
    if (auto s = check_fault_needs(f); !s) return s;
  }
  // The plan as it will run, windows drawn: what --faults reads back to replay it exactly.
  const rdzv::Json json = fault_plan_json(plan.value());
  log("fault plan (replay it with --faults=FILE holding this line): " + json.dump());
  event("fault_plan", {{"plan", json}});
  faults_.emplace(std::move(plan).value());
  return rdzv::ok_status();
}

rdzv::Status Agent::Impl::check_fault_needs(const Fault& f) const {
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

void Agent::Impl::arm_fault_timer() {
  if (!faults_) return;
  // Also once every fault has fired: the report follows the steps after them.
  fault_timer_.expires_after(std::chrono::milliseconds(20));
  fault_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || exiting_) return;
    const auto wall = std::chrono::system_clock::now();
    reported_steps_.resize(heartbeat_files_.size());
    for (std::size_t i = 0; i < heartbeat_files_.size(); ++i) {
      auto step = reported_step(heartbeat_files_[i]);
      if (!step || step == reported_steps_[i]) continue;
      reported_steps_[i] = step;
      faults_->observe_step(static_cast<int>(i), *step);
      fault_report_.step_reported(static_cast<int>(i), *step, wall);
      fault_timeline_.step(static_cast<int>(i), *step, wall);
    }
    auto due = faults_->poll(std::chrono::steady_clock::now());
    // A cut-off drops the rendezvous' connections: its fault is recorded there first.
    auto recorded_first = [&due](const FaultInjector::Action& a) {
      return a.kind == FaultInjector::Action::Kind::kCutOff &&
             std::any_of(due.fired.begin(), due.fired.end(),
                         [&a](const auto& f) { return f.fault_id == a.fault_id; });
    };
    for (const auto& fired : due.fired) {
      fault_report_.fired(fired.fault_id, fired.line, fired.rank, fired.local_rank,
                          fired.ends_worker,
                          static_cast<std::size_t>(fired.local_rank) < reported_steps_.size()
                              ? reported_steps_[fired.local_rank]
                              : std::nullopt,
                          wall);
      log("injecting " + fired.line);
      const int pid = workers_->running_pid(fired.local_rank);
      event("fault_injected", {{"injected", true},
                               {"fault", fired.fault_id},
                               {"rank", fired.rank},
                               {"local_rank", fired.local_rank},
                               {"pid", pid},
                               {"what", fired.line}});
      std::vector<FaultInjector::Action> after;
      for (const auto& a : due.actions) {
        if (recorded_first(a) && a.fault_id == fired.fault_id) after.push_back(a);
      }
      record_injected_fault(fired, pid, [this, after, due] {
        for (const auto& a : after) carry_out(a, due);
      });
      fault_timeline_.fired(fired.fault_id, fired.local_rank, fired.line,
                            fired.kind == FaultKind::kHang        ? FaultTimeline::State::kHung
                            : fired.kind == FaultKind::kStraggler ? FaultTimeline::State::kSlowed
                                                                  : FaultTimeline::State::kRunning,
                            wall);
    }
    for (const auto& a : due.actions) {
      if (a.ends_effect) fault_timeline_.effect_ended(a.local_rank, wall);
      if (!recorded_first(a)) carry_out(a, due);
    }
    arm_fault_timer();
  });
}

void Agent::Impl::carry_out(const FaultInjector::Action& a, const FaultInjector::Due& due) {
  using Kind = FaultInjector::Action::Kind;
  const std::string id = "fault " + std::to_string(a.fault_id);
  switch (a.kind) {
    case Kind::kSignal:
      workers_->signal_process(a.local_rank, a.signo);  // as a crash of the worker itself
      return;
    case Kind::kStop:
    case Kind::kContinue:
      workers_->kill(a.local_rank, a.signo);  // SIGSTOP/SIGCONT: the whole process group
      return;
    case Kind::kNodeLost:
      // As a machine that dies: no goodbye to the rendezvous, no report, workers and agent
      // gone at once (the log and event lines are written already).
      workers_->kill_all();
      std::raise(SIGKILL);
      return;
    case Kind::kRaise: {
      // Raised, or the failing kernel launched, by the worker itself at its next reported step
      // (ctrun_worker.report_step): the file's first line is the kind, the second the message.
      const std::string file = worker_dir(a.local_rank) + "/fault";
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
      spawn([this, text, id]() -> Task<void> {
        auto s = co_await client_->set(rdzv::kStoreLatencyKey, text);
        if (!s) log("error: " + id + ": the rendezvous was not told: " + s.error().message);
      });
      return;
    }
    case Kind::kCutOff:
      if (cut_off_) {
        cut_off_->cut_off(
            std::chrono::duration_cast<rdzv::Duration>(std::chrono::duration<double>(a.seconds)),
            "cut off from the rendezvous by " + id);
      }
      return;
    case Kind::kLinkDown:
      spawn(cut_link(a.fault_id, a.peer));
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
      if (server_) {
        // As a daemon killed: every connection closed at once, no goodbye; what it keeps of
        // the job is in its state files.
        server_->stop();
        server_.reset();
        rendezvous_down_ = true;
        log(id + ": the rendezvous this agent hosts is down");
      }
      return;
    case Kind::kStartRendezvous:
      if (rendezvous_down_ && !exiting_) {
        rendezvous_down_ = false;
        if (auto s = host_rendezvous(); !s) {
          log("error: " + id + ": the rendezvous could not start again: " + s.error().message);
        }
      }
      return;
  }
}

Task<void> Agent::Impl::cut_link(int fault_id, int peer) {
  const std::string id = "fault " + std::to_string(fault_id);
  const rdzv::RoundAssignment round = machine_->round();
  // The peer says where it is as its workers start; a moment's wait covers a peer just starting.
  auto host = co_await client_->get(round.store_prefix + rdzv::kFaultHostKey + std::to_string(peer),
                                    std::chrono::seconds(10));
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

void Agent::Impl::end_node_faults() {
  if (!faults_) return;
  for (const auto& a : faults_->end_node_faults()) {
    if (a.kind == FaultInjector::Action::Kind::kLinkUp) node_faults_.restore_link(a.fault_id);
    if (a.kind == FaultInjector::Action::Kind::kFreeDisk) node_faults_.free_disk(a.fault_id);
  }
}

void Agent::Impl::record_injected_fault(const FaultInjector::Fired& fired, int pid,
                                        std::function<void()> then) {
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
  if (fired.fault_id > faults_->planned()) {
    request = fired.fault_id - faults_->planned();
    record["request"] = *request;
  }
  spawn([this, text = record.dump(), request, id = fired.fault_id,
         then = std::move(then)]() -> Task<void> {
    auto number = co_await client_->add(rdzv::kFaultsInjectedKey, 1);
    // (No co_await inside a conditional expression: g++ 12 destroys the other branch's
    // temporary twice.)
    rdzv::Status s = rdzv::ok_status();
    if (number) {
      s = co_await client_->set(rdzv::kFaultInjectedPrefix + std::to_string(number.value()), text);
    } else {
      s = number.error();
    }
    if (s && request) {
      s = co_await client_->set(
          rdzv::kFaultRequestPrefix + std::to_string(*request) + rdzv::kFaultRequestDoneSuffix,
          text);
    }
    if (!s) {
      log("warning: fault " + std::to_string(id) +
          ": not recorded in the job's store (ctrun status): " + s.error().message);
    }
    if (then) then();
  });
}

Task<void> Agent::Impl::watch_fault_requests() {
  // Only faults asked for from now on: an agent that joins later does not replay old ones.
  std::int64_t next = 0;
  while (!exiting_) {
    if (next == 0) {
      auto count = co_await client_->add(rdzv::kFaultRequestsKey, 0);
      if (count) {
        next = count.value() + 1;
        continue;
      }
    } else {
      // Bounded waits, so that a reconnect or the end of the job is noticed.
      const std::string key = rdzv::kFaultRequestPrefix + std::to_string(next);
      auto text = co_await client_->get(key, std::chrono::seconds(10));
      if (text) {
        take_fault_request(next++, text.value());
        continue;
      }
      if (text.error().code == rdzv::ErrorCode::kTimeout) continue;
    }
    if (exiting_) co_return;
    co_await linger(std::chrono::seconds(1));  // not connected now (a reconnect in progress)
  }
}

void Agent::Impl::take_fault_request(std::int64_t number, const std::string& text) {
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
  f.id = faults_->planned() + static_cast<int>(number);
  if (auto s = check_fault_needs(f); !s) {
    log("warning: " + name + " ignored: " + s.error().message);
    return;
  }
  // A time in it counts from now (ctrun fault's default: at once).
  log("fault asked for (" + name + "): " + describe_fault(f) + (f.at_step ? "" : " from now"));
  event("fault_requested", {{"fault", f.id}, {"request", number}, {"what", describe_fault(f)}});
  faults_->add(std::move(f), std::chrono::steady_clock::now());
}

void Agent::Impl::finish_fault_report(int exit_code) {
  if (!faults_) return;
  end_node_faults();
  for (const auto& line : fault_report_.lines()) log(line);
  if (options_.fault_report.empty()) return;
  rdzv::Json report = fault_report_.json(exit_code == 0 ? "succeeded" : "failed");
  // What the last workers wrote as their results, by global rank.
  rdzv::Json results = rdzv::Json::object();
  const int offset = machine_ ? machine_->round().rank_offset : 0;
  for (std::size_t i = 0; i < result_files_.size(); ++i) {
    std::ifstream in(result_files_[i]);
    std::string result;
    if (in && std::getline(in, result))
      results[std::to_string(offset + static_cast<int>(i))] = result;
  }
  report["results"] = std::move(results);
  // FILE.html: the report as a page (a timeline per worker); any other name: JSON.
  const std::string& path = options_.fault_report;
  const bool page = path.size() >= 5 && path.compare(path.size() - 5, 5, ".html") == 0;
  const std::string text =
      page ? fault_timeline_.html(report, std::chrono::system_clock::now()) : report.dump(2) + "\n";
  std::ofstream out(options_.fault_report, std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    log("error: --fault_report: cannot write '" + options_.fault_report +
        "': " + std::strerror(errno));
  }
}

}  // namespace ctrun::launcher

#include "rendezvous/etcd/etcd_jobs.h"
#include "rendezvous/etcd/state_value.h"
#include "rendezvous/protocol/fault_keys.h"
#include "rendezvous/protocol/step_keys.h"

#include <map>
#include <optional>

namespace ctrun::rendezvous {

namespace {

constexpr const char* kRoot = "/ctrun/";

// One job's keys, sorted out by kind. Keys are listed without values (a job's store holds the
// workers' keys too, and there may be many jobs); the few values status shows are read after.
struct JobKeys {
  std::optional<etcd::KeyValue> state;
  std::map<std::string, std::int64_t> node_leases;  // node id -> lease
  std::size_t store_keys = 0;
  long long restarts = 0;
  long long max_restarts = -1;  // unset
  long long faults_injected = 0;
  std::optional<std::string> steps;  // the straggler verdict (step_keys.h)
};

void sort_key(JobKeys& keys, const std::string& rest, const etcd::KeyValue& kv) {
  if (rest.rfind("nodes/", 0) == 0) {
    keys.node_leases[rest.substr(6)] = kv.lease;
  } else if (rest.rfind("store/", 0) == 0) {
    ++keys.store_keys;
  }
}

// The values of the state, the restart counters, the count of injected faults and the straggler
// verdict of the job under `prefix`, in one read.
etcd::Task<Status> read_values(etcd::Kv& client, std::string prefix, JobKeys& keys) {
  etcd::Txn txn;
  txn.success.push_back(etcd::range_op(prefix + "rendezvous"));
  txn.success.push_back(etcd::range_op(prefix + "store/" + kRestartsKey));
  txn.success.push_back(etcd::range_op(prefix + "store/" + kMaxRestartsKey));
  txn.success.push_back(etcd::range_op(prefix + "store/" + kFaultsInjectedKey));
  txn.success.push_back(etcd::range_op(prefix + "store/" + kStragglersKey));
  auto read = co_await client.txn(std::move(txn));
  if (!read) co_return read.error();
  const auto& ranges = read.value().ranges;
  if (ranges.size() != 5) {
    co_return Error{ErrorCode::kInternal, "etcd: a five-range transaction answered " +
                                              std::to_string(ranges.size()) + " ranges"};
  }
  if (!ranges[0].kvs.empty()) keys.state = ranges[0].kvs.front();
  if (!ranges[1].kvs.empty()) keys.restarts = counter_value(ranges[1].kvs.front().value, 0);
  if (!ranges[2].kvs.empty()) keys.max_restarts = counter_value(ranges[2].kvs.front().value, -1);
  if (!ranges[3].kvs.empty()) keys.faults_injected = counter_value(ranges[3].kvs.front().value, 0);
  if (!ranges[4].kvs.empty()) keys.steps = ranges[4].kvs.front().value;
  co_return ok_status();
}

// Every key of the job under `prefix`, listed, then the values it shows.
etcd::Task<Result<JobKeys>> read_job(etcd::Kv& client, std::string prefix) {
  auto read = co_await client.range(prefix, etcd::prefix_end(prefix), 0, true);
  if (!read) co_return read.error();
  JobKeys keys;
  for (const auto& kv : read.value().kvs) sort_key(keys, kv.key.substr(prefix.size()), kv);
  if (auto s = co_await read_values(client, prefix, keys); !s) co_return s.error();
  co_return keys;
}

}  // namespace

Result<std::unique_ptr<Rendezvous>> etcd_restore_state(const etcd::KeyValue& kv,
                                                       const Clock& clock) {
  auto saved = etcd::decode_state_value(kv.key, kv.value);
  if (!saved) return saved.error();
  return Rendezvous::restore(saved.value(), clock, {}, Rendezvous::Timers::kCarried);
}

std::string etcd_job_prefix(const std::string& job) {
  std::string escaped;
  for (char c : job) {
    if (c == '%') {
      escaped += "%25";
    } else if (c == '/') {
      escaped += "%2F";
    } else {
      escaped += c;
    }
  }
  return kRoot + escaped + "/";
}

std::optional<std::string> etcd_job_of_key(const std::string& key) {
  const std::string root = kRoot;
  if (key.rfind(root, 0) != 0) return std::nullopt;
  const std::size_t end = key.find('/', root.size());
  if (end == std::string::npos) return std::nullopt;
  std::string job;
  for (std::size_t i = root.size(); i < end; ++i) {
    if (key.compare(i, 3, "%25") == 0) {
      job += '%';
      i += 2;
    } else if (key.compare(i, 3, "%2F") == 0) {
      job += '/';
      i += 2;
    } else {
      job += key[i];
    }
  }
  return job;
}

etcd::Task<Result<Json>> etcd_job_status(etcd::Kv& client, std::string job) {
  const std::string prefix = etcd_job_prefix(job);
  auto read = co_await read_job(client, prefix);
  if (!read) co_return read.error();
  const JobKeys& keys = read.value();
  Json answer{{"job", job},
              {"keys", keys.store_keys},
              {"restarts", keys.restarts},
              {"max_restarts", keys.max_restarts},
              {"faults_injected", keys.faults_injected},
              {"connections", keys.node_leases.size()},
              {"rendezvous", nullptr}};
  if (keys.faults_injected > 0) {  // the last fault injected on purpose, for `ctrun status`
    std::string key =
        prefix + "store/" + kFaultInjectedPrefix + std::to_string(keys.faults_injected);
    auto last = co_await client.range(std::move(key), "", 1, false);
    if (last && !last.value().kvs.empty()) {
      Json fault = Json::parse(last.value().kvs.front().value, nullptr, false);
      if (!fault.is_discarded()) answer["last_fault"] = std::move(fault);
    }
  }
  if (keys.steps) {  // the step rates and stragglers node 0's agent last judged
    Json verdict = Json::parse(*keys.steps, nullptr, false);
    if (!verdict.is_discarded()) answer["steps"] = std::move(verdict);
  }
  if (!keys.state) co_return answer;
  SteadyClock clock;
  auto state = etcd_restore_state(*keys.state, clock);
  if (!state) co_return state.error();
  Json described = state.value()->describe();
  // A node's heartbeat is its lease: the time since the last renewal is what the TTL lost.
  for (auto& node : described["nodes"]) {
    auto lease = keys.node_leases.find(node.value("node", ""));
    long long age_ms = -1;
    if (lease != keys.node_leases.end() && lease->second != 0) {
      auto alive = co_await client.time_to_live(lease->second);
      if (alive && alive.value().ttl > 0) {
        age_ms = 1000 * (alive.value().granted_ttl - alive.value().ttl);
      }
    } else if (lease != keys.node_leases.end()) {
      age_ms = 0;
    }
    node["last_seen_ms_ago"] = age_ms;
  }
  answer["rendezvous"] = std::move(described);
  co_return answer;
}

etcd::Task<Result<Json>> etcd_jobs(etcd::Kv& client) {
  const std::string root = kRoot;
  auto read = co_await client.range(root, etcd::prefix_end(root), 0, true);
  if (!read) co_return read.error();
  std::map<std::string, JobKeys> jobs;
  for (const auto& kv : read.value().kvs) {
    auto job = etcd_job_of_key(kv.key);
    if (!job) continue;
    const std::string prefix = etcd_job_prefix(*job);
    sort_key(jobs[*job], kv.key.substr(prefix.size()), kv);
  }
  SteadyClock clock;
  Json list = Json::array();
  for (auto& [name, keys] : jobs) {
    if (auto s = co_await read_values(client, etcd_job_prefix(name), keys); !s) {
      co_return s.error();
    }
    Json entry{{"job", name},
               {"restarts", keys.restarts},
               {"faults_injected", keys.faults_injected},
               {"keys", keys.store_keys},
               {"connections", keys.node_leases.size()},
               {"state", "store"},
               {"round", 0},
               {"nodes", 0}};
    if (keys.state) {
      auto state = etcd_restore_state(*keys.state, clock);
      if (state) {
        entry["state"] = std::string(job_state_name(state.value()->state()));
        entry["round"] = state.value()->round();
        entry["nodes"] = state.value()->num_nodes();
      } else {
        entry["state"] = "unreadable";
      }
    }
    list.push_back(std::move(entry));
  }
  co_return Json{{"jobs", std::move(list)}};
}

}  // namespace ctrun::rendezvous

#include "ctrun/rendezvous/etcd_jobs.h"

#include <map>

namespace ctrun::rendezvous {

namespace {

constexpr const char* kRoot = "/ctrun/";

// etcd writes int64 fields as strings and leaves zeros out.
long long number_field(const Json& j, const char* name) {
  if (!j.is_object() || !j.contains(name)) return 0;
  const Json& v = j[name];
  if (v.is_number_integer()) return v.get<long long>();
  if (!v.is_string()) return 0;
  try {
    return std::stoll(v.get<std::string>());
  } catch (const std::exception&) {
    return 0;
  }
}

long long number_text(const std::string& text, long long otherwise) {
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return otherwise;
  }
}

// One job's keys, sorted out by kind.
struct JobKeys {
  const etcd::KeyValue* state = nullptr;
  std::map<std::string, std::int64_t> node_leases;  // node id -> lease
  std::map<std::string, std::string> store;         // key -> value
};

void sort_key(JobKeys& keys, const std::string& rest, const etcd::KeyValue& kv) {
  if (rest == "rendezvous") {
    keys.state = &kv;
  } else if (rest.rfind("nodes/", 0) == 0) {
    keys.node_leases[rest.substr(6)] = kv.lease;
  } else if (rest.rfind("store/", 0) == 0) {
    keys.store[rest.substr(6)] = kv.value;
  }
}

long long restarts_of(const JobKeys& keys) {
  auto it = keys.store.find(kRestartsKey);
  return it == keys.store.end() ? 0 : number_text(it->second, 0);
}

}  // namespace

Result<std::unique_ptr<Rendezvous>> etcd_restore_state(const etcd::KeyValue& kv,
                                                       const Clock& clock) {
  const Json saved = Json::parse(kv.value, nullptr, false);
  if (saved.is_discarded()) {
    return Error{ErrorCode::kBadRequest,
                 "etcd key " + kv.key + " does not hold a ctrun rendezvous"};
  }
  return Rendezvous::restore(saved, clock, {}, Rendezvous::Timers::kCarried);
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

etcd::Task<Result<Json>> etcd_job_status(etcd::Client& client, std::string job) {
  const std::string prefix = etcd_job_prefix(job);
  auto read = co_await client.range(prefix, etcd::prefix_end(prefix));
  if (!read) co_return read.error();
  JobKeys keys;
  for (const auto& kv : read.value().kvs) sort_key(keys, kv.key.substr(prefix.size()), kv);
  Json answer{{"job", job},
              {"keys", keys.store.size()},
              {"restarts", restarts_of(keys)},
              {"max_restarts", -1},
              {"connections", keys.node_leases.size()},
              {"rendezvous", nullptr}};
  if (auto it = keys.store.find(kMaxRestartsKey); it != keys.store.end()) {
    answer["max_restarts"] = number_text(it->second, -1);
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
      Json ask = Json::object();
      ask["ID"] = std::to_string(lease->second);
      auto alive = co_await client.call("/v3/lease/timetolive", ask);
      if (alive && number_field(alive.value(), "TTL") > 0) {
        age_ms =
            1000 * (number_field(alive.value(), "grantedTTL") - number_field(alive.value(), "TTL"));
      }
    } else if (lease != keys.node_leases.end()) {
      age_ms = 0;
    }
    node["last_seen_ms_ago"] = age_ms;
  }
  answer["rendezvous"] = std::move(described);
  co_return answer;
}

etcd::Task<Result<Json>> etcd_jobs(etcd::Client& client) {
  const std::string root = kRoot;
  auto read = co_await client.range(root, etcd::prefix_end(root));
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
  for (const auto& [name, keys] : jobs) {
    Json entry{{"job", name},
               {"restarts", restarts_of(keys)},
               {"keys", keys.store.size()},
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

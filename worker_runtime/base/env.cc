#include "ctrun/worker/env.h"

#include <charconv>
#include <cstdlib>

#include "ctrun/rendezvous/endpoint.h"

namespace ctrun::worker {
namespace {

using rendezvous::ErrorCode;

Error bad(const std::string& name, const std::string& expected, const std::string& got) {
  return Error{ErrorCode::kBadRequest, name + ": expected " + expected + ", got '" + got + "'"};
}

// An integer variable in [lo, hi]; `fallback` when unset.
Result<int> int_var(const EnvLookup& env, const std::string& name, long long lo, long long hi,
                    std::optional<int> fallback) {
  auto raw = env(name);
  if (!raw) {
    if (fallback) return *fallback;
    return Error{ErrorCode::kBadRequest, name + ": not set (the launcher sets it with RANK)"};
  }
  long long v = 0;
  const char* end = raw->data() + raw->size();
  auto [p, ec] = std::from_chars(raw->data(), end, v);
  if (raw->empty() || ec != std::errc() || p != end || v < lo || v > hi) {
    const std::string expected =
        lo == 0 ? "an integer in 0.." + std::to_string(hi) : "a positive integer";
    return bad(name, expected, *raw);
  }
  return static_cast<int>(v);
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

Result<WorkerEnv> read_worker_env(const EnvLookup& env) {
  WorkerEnv w;
  constexpr long long kMaxRanks = 1 << 24;
  w.launched = env("RANK").has_value() || env("WORLD_SIZE").has_value();
  if (w.launched) {
    if (!env("RANK")) return Error{ErrorCode::kBadRequest, "RANK: not set, but WORLD_SIZE is"};
    if (!env("WORLD_SIZE"))
      return Error{ErrorCode::kBadRequest, "WORLD_SIZE: not set, but RANK is"};
    auto world = int_var(env, "WORLD_SIZE", 1, kMaxRanks, std::nullopt);
    if (!world) return world.error();
    w.world_size = world.value();
    auto rank = int_var(env, "RANK", 0, w.world_size - 1, std::nullopt);
    if (!rank) return rank.error();
    w.rank = rank.value();
    // torchrun and ctrun set these too; a hand-made launch may not.
    auto local_world = int_var(env, "LOCAL_WORLD_SIZE", 1, w.world_size, w.world_size);
    if (!local_world) return local_world.error();
    w.local_world_size = local_world.value();
    auto local_rank =
        int_var(env, "LOCAL_RANK", 0, w.local_world_size - 1, w.rank % w.local_world_size);
    if (!local_rank) return local_rank.error();
    w.local_rank = local_rank.value();
    auto group_rank = int_var(env, "GROUP_RANK", 0, kMaxRanks, w.rank / w.local_world_size);
    if (!group_rank) return group_rank.error();
    w.group_rank = group_rank.value();
  }
  if (auto addr = env("MASTER_ADDR")) {
    if (addr->empty()) return bad("MASTER_ADDR", "a host name or address", *addr);
    w.master_addr = *addr;
  }
  auto port = int_var(env, "MASTER_PORT", 0, 65535, 0);
  if (!port) return port.error();
  w.master_port = port.value();
  auto restarts = int_var(env, "TORCHELASTIC_RESTART_COUNT", 0, 1 << 30, 0);
  if (!restarts) return restarts.error();
  w.restart_count = restarts.value();
  auto max_restarts = int_var(env, "TORCHELASTIC_MAX_RESTARTS", 0, 1 << 30, 0);
  if (!max_restarts) return max_restarts.error();
  w.max_restarts = max_restarts.value();
  w.run_id = env("TORCHELASTIC_RUN_ID").value_or("");
  w.error_file = env("TORCHELASTIC_ERROR_FILE").value_or("");
  if (auto agent_store = env("TORCHELASTIC_USE_AGENT_STORE")) {
    // torch compares with the string "True" (str(bool)); accept the spellings people write.
    if (*agent_store == "True" || *agent_store == "true" || *agent_store == "1") {
      w.use_agent_store = true;
    } else if (*agent_store != "False" && *agent_store != "false" && *agent_store != "0" &&
               !agent_store->empty()) {
      return bad("TORCHELASTIC_USE_AGENT_STORE", "True or False", *agent_store);
    }
  }

  const std::string store_backend = env("CTRUN_STORE_BACKEND").value_or("ctrund");
  auto tls_files = [&env] {
    return rendezvous::TlsClientFiles{env("CTRUN_STORE_CACERT").value_or(""),
                                      env("CTRUN_STORE_CERT").value_or(""),
                                      env("CTRUN_STORE_KEY").value_or("")};
  };
  if (store_backend != "ctrund" && store_backend != "etcd") {
    return bad("CTRUN_STORE_BACKEND", "ctrund or etcd", store_backend);
  }
  if (auto host = env("CTRUN_STORE_ADDR"); host && store_backend == "etcd") {
    // The etcd members, as --rdzv_endpoint lists them.
    auto endpoints = rendezvous::parse_endpoint_list(*host);
    if (!endpoints)
      return bad("CTRUN_STORE_ADDR", "etcd endpoints host:port[,host:port...]", *host);
    rendezvous::StoreAccess access;
    if (auto protocol = env("CTRUN_STORE_PROTOCOL"); protocol && *protocol != "http") {
      if (*protocol != "https") return bad("CTRUN_STORE_PROTOCOL", "http or https", *protocol);
      access.tls = tls_files();
    }
    access.user = env("CTRUN_STORE_USER").value_or("");
    access.password_file = env("CTRUN_STORE_PASSWORD_FILE").value_or("");
    w.store = rendezvous::etcd_store_address(
        std::move(endpoints).value(), env("CTRUN_STORE_PREFIX").value_or(""), std::move(access));
  } else if (host) {
    if (host->empty()) return bad("CTRUN_STORE_ADDR", "a host name or address", *host);
    auto store_port = int_var(env, "CTRUN_STORE_PORT", 1, 65535, std::nullopt);
    if (!store_port) return store_port.error();
    rendezvous::StoreAddress& store = w.store.emplace();
    store.host = *host;
    store.port = store_port.value();
    store.prefix = env("CTRUN_STORE_PREFIX").value_or("");
    store.token = env("CTRUN_RDZV_TOKEN");
    if (auto protocol = env("CTRUN_STORE_PROTOCOL"); protocol && *protocol != "tcp") {
      if (*protocol != "tls") return bad("CTRUN_STORE_PROTOCOL", "tcp or tls", *protocol);
      store.access.tls = tls_files();
    }
  }
  if (auto mode = env("CTRUN_FAULT_TOLERANCE")) {
    if (*mode != "step" && *mode != "none")
      return bad("CTRUN_FAULT_TOLERANCE", "step or none", *mode);
    w.fault_tolerant = *mode == "step";
  }
  if (w.fault_tolerant) {
    w.replica_id = env("CTRUN_REPLICA_ID").value_or("");
    if (w.replica_id.empty() || w.replica_id.size() > 256) {
      return bad("CTRUN_REPLICA_ID", "1 to 256 bytes with CTRUN_FAULT_TOLERANCE=step",
                 w.replica_id);
    }
  }
  if (w.world_size > 1 && !w.store && w.master_port == 0) {
    return Error{ErrorCode::kBadRequest,
                 "MASTER_PORT: not set, and no CTRUN_STORE_ADDR: a world of " +
                     std::to_string(w.world_size) + " workers needs one to meet"};
  }
  return w;
}

}  // namespace ctrun::worker

#include "ctrun/worker/env.h"

#include <map>

#include "catch.h"
#include "fake_env.h"

using namespace ctrun::worker;

using ctrun::testing::env_of;

namespace {

std::string error_of(std::map<std::string, std::string> vars) {
  auto r = read_worker_env(env_of(std::move(vars)));
  REQUIRE_FALSE(r);
  return r.error().message;
}

}  // namespace

TEST_CASE("worker env: no launcher is a single process") {
  auto w = read_worker_env(env_of({}));
  REQUIRE(w);
  CHECK_FALSE(w.value().launched);
  CHECK(w.value().rank == 0);
  CHECK(w.value().world_size == 1);
  CHECK(w.value().local_world_size == 1);
  CHECK_FALSE(w.value().store);
}

TEST_CASE("worker env: what ctrun gives") {
  auto w = read_worker_env(env_of({{"RANK", "5"},
                                   {"LOCAL_RANK", "1"},
                                   {"WORLD_SIZE", "8"},
                                   {"LOCAL_WORLD_SIZE", "4"},
                                   {"GROUP_RANK", "1"},
                                   {"MASTER_ADDR", "10.0.0.1"},
                                   {"MASTER_PORT", "29511"},
                                   {"TORCHELASTIC_RESTART_COUNT", "2"},
                                   {"TORCHELASTIC_MAX_RESTARTS", "3"},
                                   {"TORCHELASTIC_RUN_ID", "job"},
                                   {"TORCHELASTIC_ERROR_FILE", "/tmp/e.json"},
                                   {"CTRUN_STORE_ADDR", "10.0.0.9"},
                                   {"CTRUN_STORE_PORT", "29400"},
                                   {"CTRUN_STORE_PREFIX", "rdzv/0/2/"},
                                   {"CTRUN_RDZV_TOKEN", "tok"}}));
  REQUIRE(w);
  const WorkerEnv& e = w.value();
  CHECK(e.launched);
  CHECK(e.rank == 5);
  CHECK(e.local_rank == 1);
  CHECK(e.world_size == 8);
  CHECK(e.local_world_size == 4);
  CHECK(e.group_rank == 1);
  CHECK(e.master_addr == "10.0.0.1");
  CHECK(e.master_port == 29511);
  CHECK(e.restart_count == 2);
  CHECK(e.max_restarts == 3);
  CHECK(e.run_id == "job");
  CHECK(e.error_file == "/tmp/e.json");
  REQUIRE(e.store);
  CHECK(e.store->host == "10.0.0.9");
  CHECK(e.store->port == 29400);
  CHECK(e.store->prefix == "rdzv/0/2/");
  CHECK(e.store->token == std::optional<std::string>("tok"));
}

TEST_CASE("worker env: torchrun's (no CTRUN_STORE_*) needs MASTER_PORT beyond one worker") {
  auto w = read_worker_env(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}));
  REQUIRE(w);
  CHECK_FALSE(w.value().store);
  CHECK(w.value().local_rank == 1);  // defaults from RANK when a launcher leaves it out
  CHECK(error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}}).find("MASTER_PORT: not set") == 0);
  CHECK_FALSE(w.value().use_agent_store);
  auto agent = read_worker_env(env_of({{"RANK", "1"},
                                       {"WORLD_SIZE", "2"},
                                       {"MASTER_PORT", "29500"},
                                       {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  REQUIRE(agent);
  CHECK(agent.value().use_agent_store);
  CHECK(error_of({{"TORCHELASTIC_USE_AGENT_STORE", "yes"}}) ==
        "TORCHELASTIC_USE_AGENT_STORE: expected True or False, got 'yes'");
}

TEST_CASE("worker env: bad values name the variable") {
  CHECK(error_of({{"RANK", "0"}, {"WORLD_SIZE", "four"}}) ==
        "WORLD_SIZE: expected a positive integer, got 'four'");
  CHECK(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}) ==
        "RANK: expected an integer in 0..1, got '2'");
  CHECK(error_of({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}).find("RANK:") == 0);
  CHECK(error_of({{"RANK", "0"}}) == "WORLD_SIZE: not set, but RANK is");
  CHECK(error_of({{"WORLD_SIZE", "1"}}) == "RANK: not set, but WORLD_SIZE is");
  CHECK(error_of({{"RANK", "0"},
                  {"WORLD_SIZE", "2"},
                  {"LOCAL_WORLD_SIZE", "2"},
                  {"LOCAL_RANK", "2"},
                  {"MASTER_PORT", "1"}})
            .find("LOCAL_RANK: expected an integer in 0..1") == 0);
  CHECK(error_of({{"MASTER_PORT", "http"}}).find("MASTER_PORT:") == 0);
  CHECK(error_of({{"CTRUN_STORE_ADDR", "h"}}).find("CTRUN_STORE_PORT: not set") == 0);
  CHECK(
      error_of({{"CTRUN_STORE_ADDR", "h"}, {"CTRUN_STORE_PORT", "0"}}).find("CTRUN_STORE_PORT:") ==
      0);
  CHECK(error_of({{"TORCHELASTIC_RESTART_COUNT", "x"}}).find("TORCHELASTIC_RESTART_COUNT:") == 0);
}

TEST_CASE("worker env: the job's store on etcd (CTRUN_STORE_BACKEND=etcd)") {
  auto w = read_worker_env(env_of({{"RANK", "0"},
                                   {"WORLD_SIZE", "2"},
                                   {"TORCHELASTIC_RUN_ID", "job"},
                                   {"CTRUN_STORE_BACKEND", "etcd"},
                                   {"CTRUN_STORE_ADDR", "10.0.0.7:2379,[fd00::2]:2380"},
                                   {"CTRUN_STORE_PREFIX", "rdzv/1/4/"}}));
  REQUIRE(w);
  REQUIRE(w.value().store);
  const auto& store = *w.value().store;
  CHECK(store.backend == ctrun::rendezvous::StoreAddress::Backend::kEtcd);
  REQUIRE(store.etcd_endpoints.size() == 2);
  CHECK(store.etcd_endpoints[1].host == "fd00::2");
  CHECK(store.etcd_endpoints[1].port == 2380);
  CHECK(store.host == "10.0.0.7");  // the first member: where the worker's traffic goes
  CHECK(store.port == 2379);
  CHECK(store.prefix == "rdzv/1/4/");
  CHECK_FALSE(store.token);

  CHECK(error_of({{"CTRUN_STORE_BACKEND", "redis"}}) ==
        "CTRUN_STORE_BACKEND: expected ctrund or etcd, got 'redis'");
  CHECK(error_of({{"CTRUN_STORE_BACKEND", "etcd"}, {"CTRUN_STORE_ADDR", "h1:2379,"}}) ==
        "CTRUN_STORE_ADDR: expected etcd endpoints host:port[,host:port...], got 'h1:2379,'");

  // Over TLS and as a user, as the agent got in: file paths only.
  auto tls = read_worker_env(env_of({{"RANK", "0"},
                                     {"WORLD_SIZE", "2"},
                                     {"TORCHELASTIC_RUN_ID", "job"},
                                     {"CTRUN_STORE_BACKEND", "etcd"},
                                     {"CTRUN_STORE_ADDR", "10.0.0.7:2379"},
                                     {"CTRUN_STORE_PROTOCOL", "https"},
                                     {"CTRUN_STORE_CACERT", "/ca.pem"},
                                     {"CTRUN_STORE_CERT", "/c.pem"},
                                     {"CTRUN_STORE_KEY", "/c.key"},
                                     {"CTRUN_STORE_USER", "alice"},
                                     {"CTRUN_STORE_PASSWORD_FILE", "/pw"}}));
  REQUIRE(tls);
  const auto& access = tls.value().store->access;
  REQUIRE(access.tls);
  CHECK(access.tls->ca_file == "/ca.pem");
  CHECK(access.tls->cert_file == "/c.pem");
  CHECK(access.tls->key_file == "/c.key");
  CHECK(access.user == "alice");
  CHECK(access.password_file == "/pw");
  CHECK(error_of({{"CTRUN_STORE_BACKEND", "etcd"},
                  {"CTRUN_STORE_ADDR", "h1:2379"},
                  {"CTRUN_STORE_PROTOCOL", "ftp"}}) ==
        "CTRUN_STORE_PROTOCOL: expected http or https, got 'ftp'");

  // A ctrund over TLS.
  auto ctrund = read_worker_env(env_of({{"RANK", "0"},
                                        {"WORLD_SIZE", "2"},
                                        {"TORCHELASTIC_RUN_ID", "job"},
                                        {"CTRUN_STORE_ADDR", "10.0.0.7"},
                                        {"CTRUN_STORE_PORT", "29400"},
                                        {"CTRUN_STORE_PROTOCOL", "tls"},
                                        {"CTRUN_STORE_CACERT", "/ca.pem"}}));
  REQUIRE(ctrund);
  const auto& ctrund_tls = ctrund.value().store->access.tls;
  REQUIRE(ctrund_tls);
  CHECK(ctrund_tls->ca_file == "/ca.pem");
  CHECK(ctrund_tls->cert_file.empty());
  CHECK(error_of({{"CTRUN_STORE_ADDR", "h1"},
                  {"CTRUN_STORE_PORT", "29400"},
                  {"CTRUN_STORE_PROTOCOL", "https"}}) ==
        "CTRUN_STORE_PROTOCOL: expected tcp or tls, got 'https'");
}

// Which rendezvous the agent uses and whether it hosts it, from the command line alone.
#include "launcher/agent/rendezvous_plan.h"

#include "catch.h"

#include "fake_env.h"

using namespace ctrun::launcher;
namespace rdzv = ctrun::rendezvous;
using ctrun::testing::env_of;
using Service = rdzv::BackendSpec::Service;

namespace {

rdzv::Result<RendezvousPlan> plan(std::vector<std::string> args, bool local = false) {
  args.push_back("train.py");
  auto parsed = parse_launch_options(args, env_of({}));
  REQUIRE(parsed.ok());
  return plan_rendezvous(parsed.value().options, [local](const std::string&) { return local; });
}

}  // namespace

TEST_CASE("rendezvous plan: --standalone hosts a ctrund on a free loopback port") {
  auto p = plan({"--standalone"});
  REQUIRE(p.ok());
  CHECK(p.value().backend.service == Service::kCtrund);
  CHECK(p.value().backend.endpoints.front().host == "127.0.0.1");
  CHECK(p.value().backend.endpoints.front().port == 0);
  CHECK(p.value().must_host);
}

TEST_CASE("rendezvous plan: static hosts on node 0 at the master address and asks its rank") {
  auto zero = plan({"--nnodes=2", "--node_rank=0", "--master_addr=10.0.0.1", "--master_port=1234"});
  REQUIRE(zero.ok());
  CHECK(zero.value().must_host);
  CHECK(zero.value().requested_rank == 0);
  CHECK(rdzv::format_endpoint(zero.value().backend.endpoints.front()) == "10.0.0.1:1234");
  auto one = plan({"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=1234"});
  REQUIRE(one.ok());
  CHECK_FALSE(one.value().try_host);
  CHECK(one.value().requested_rank == 1);
}

TEST_CASE("rendezvous plan: c10d hosts when the endpoint is this machine unless is_host says") {
  auto here = plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=head"}, true);
  REQUIRE(here.ok());
  CHECK(here.value().try_host);
  CHECK_FALSE(here.value().must_host);  // another agent here may host it already
  CHECK(here.value().backend.endpoints.front().port == rdzv::kDefaultPort);
  CHECK(here.value().requested_rank == -1);
  auto elsewhere = plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=head:5"}, false);
  REQUIRE(elsewhere.ok());
  CHECK_FALSE(elsewhere.value().try_host);
  auto told = plan(
      {"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=head", "--rdzv_conf=is_host=false"},
      true);
  REQUIRE(told.ok());
  CHECK_FALSE(told.value().try_host);
  auto must = plan({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=head",
                    "--rdzv_conf=is_host=true", "--node_rank=1"});
  REQUIRE(must.ok());
  CHECK(must.value().must_host);
  CHECK(must.value().requested_rank == 1);
}

TEST_CASE("rendezvous plan: etcd takes every member and is never hosted") {
  auto p = plan({"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=a:1,http://b"}, true);
  REQUIRE(p.ok());
  CHECK(p.value().backend.service == Service::kEtcd);
  REQUIRE(p.value().backend.endpoints.size() == 2);
  CHECK(rdzv::format_endpoint(p.value().backend.endpoints[1]) == "b:2379");
  CHECK_FALSE(p.value().try_host);
}

TEST_CASE("rendezvous plan: a missing or bad endpoint is a clear error") {
  auto missing = plan({"--nnodes=2", "--rdzv_backend=c10d"});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message == "--rdzv_endpoint is required with --rdzv_backend=c10d");
  auto bad = plan({"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=https://a,http://b"});
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("mixes http:// and https://") != std::string::npos);
}

TEST_CASE("rendezvous plan: etcd over TLS and as a user, from https:// or torch's keys") {
  auto https = plan({"--rdzv_backend=etcd", "--rdzv_endpoint=https://e1:2379,https://e2:2379",
                     "--rdzv_conf=cacert=/ca.pem,cert=/c.pem,key=/c.key"});
  REQUIRE(https.ok());
  const rdzv::StoreAccess& a = https.value().backend.access;
  REQUIRE(a.tls);
  CHECK(a.tls->ca_file == "/ca.pem");
  CHECK(a.tls->cert_file == "/c.pem");
  CHECK(a.tls->key_file == "/c.key");
  CHECK(https.value().backend.endpoints.size() == 2);
  // torch's protocol=https with bare members, and etcd-v2's names for the files.
  auto protocol = plan({"--rdzv_backend=etcd-v2", "--rdzv_endpoint=e1:2379",
                        "--rdzv_conf=protocol=HTTPS,ca_cert=/ca.pem,user=u,password_file=/pw"});
  REQUIRE(protocol.ok());
  const rdzv::StoreAccess& b = protocol.value().backend.access;
  REQUIRE(b.tls);
  CHECK(b.tls->ca_file == "/ca.pem");
  CHECK(b.user == "u");
  CHECK(b.password_file == "/pw");
  auto plain = plan({"--rdzv_backend=etcd", "--rdzv_endpoint=e1:2379"});
  REQUIRE(plain.ok());
  CHECK_FALSE(plain.value().backend.access.tls);

  auto error = [](std::vector<std::string> args) { return plan(std::move(args)).error().message; };
  CHECK(error({"--rdzv_backend=etcd", "--rdzv_endpoint=e1", "--rdzv_conf=cacert=/ca.pem"}) ==
        "--rdzv_conf: cacert, cert and key are TLS settings: give https:// endpoints or "
        "protocol=https");
  CHECK(error({"--rdzv_backend=etcd", "--rdzv_endpoint=https://e1", "--rdzv_conf=protocol=http"}) ==
        "--rdzv_conf: protocol=http, but the endpoints are https:// ones");
  CHECK(error({"--rdzv_backend=etcd", "--rdzv_endpoint=https://e1", "--rdzv_conf=cert=/c.pem"}) ==
        "--rdzv_conf: a client certificate needs both cert and key");
  CHECK(error({"--rdzv_backend=etcd", "--rdzv_endpoint=e1", "--rdzv_conf=user=u"}) ==
        "--rdzv_conf: an etcd user needs both user and password_file");
}

TEST_CASE("rendezvous plan: ctrund over TLS, reached as a client, never hosted by an agent") {
  auto files = plan({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29400",
                     "--rdzv_conf=cacert=/ca.pem,cert=/c.pem,key=/c.key"},
                    /*local=*/true);
  REQUIRE(files.ok());
  const rdzv::StoreAccess& a = files.value().backend.access;
  REQUIRE(a.tls);
  CHECK(a.tls->ca_file == "/ca.pem");
  CHECK(a.tls->cert_file == "/c.pem");
  CHECK(a.tls->key_file == "/c.key");
  // A local endpoint would be hosted in plain TCP; with TLS it is a ctrund of its own.
  CHECK_FALSE(files.value().try_host);
  CHECK_FALSE(files.value().must_host);
  // protocol=tls alone trusts the system's CAs.
  auto system_cas = plan(
      {"--rdzv_backend=ctrund", "--rdzv_endpoint=rdzv.example:29400", "--rdzv_conf=protocol=tls"});
  REQUIRE(system_cas.ok());
  REQUIRE(system_cas.value().backend.access.tls);
  CHECK(system_cas.value().backend.access.tls->ca_file.empty());
  auto plain = plan({"--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29400"}, /*local=*/true);
  REQUIRE(plain.ok());
  CHECK_FALSE(plain.value().backend.access.tls);
  CHECK(plain.value().try_host);

  auto error = [](std::vector<std::string> args) { return plan(std::move(args)).error().message; };
  CHECK(error({"--rdzv_backend=c10d", "--rdzv_endpoint=h:29400", "--rdzv_conf=user=u"}) ==
        "--rdzv_conf: user and password_file are etcd's; ctrund takes the job's token "
        "(token_file, --token_file or CTRUN_RDZV_TOKEN)");
  CHECK(error({"--rdzv_backend=c10d", "--rdzv_endpoint=h:29400",
               "--rdzv_conf=protocol=tcp,cacert=/ca.pem"}) ==
        "--rdzv_conf: protocol=tcp with cacert, cert or key: TLS needs protocol=tls (or none)");
  CHECK(error({"--rdzv_backend=c10d", "--rdzv_endpoint=h:29400", "--rdzv_conf=key=/c.key"}) ==
        "--rdzv_conf: a client certificate needs both cert and key");
  CHECK(error({"--rdzv_backend=c10d", "--rdzv_endpoint=h:29400",
               "--rdzv_conf=cacert=/ca.pem,is_host=true"}) ==
        "--rdzv_conf: is_host=true with TLS: an agent hosts its rendezvous without TLS; run "
        "ctrund --tls_cert at the endpoint instead");
}

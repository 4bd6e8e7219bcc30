#include "rendezvous/service/service.h"

#include "catch.h"

#include "rendezvous/protocol/fault_keys.h"
#include "service_harness.h"

using namespace ctrun::rendezvous;
using namespace ctrun::rendezvous::testing;
using namespace std::chrono_literals;

TEST_CASE("service: a new connection gets a challenge, then must say hello") {
  ServiceHarness h;
  auto c = h.connect();
  Json challenge = h.transport.take(c);
  CHECK(challenge["event"] == "challenge");
  CHECK(challenge["version"] == kProtocolVersion);
  CHECK(challenge["nonce"].get_binary().size() == kNonceBytes);
  CHECK(challenge["auth"] == false);
  h.send(c, Json{{"op", "get"}, {"id", 1}, {"key", "k"}});
  Json refused = h.transport.take(c);
  CHECK(is_error(refused, "not_authenticated"));
  CHECK(refused["id"] == 1);
  CHECK(h.transport.closed.count(c));
  CHECK(h.service->num_connections() == 0);
  CHECK(mentions(h.logs, "10.0.0.1:1001 closed: not_authenticated"));
}

TEST_CASE("service: wrong protocol version is refused and closed") {
  ServiceHarness h;
  auto c = h.connect();
  h.transport.take(c);
  h.send(c, Json{{"op", "hello"}, {"id", 0}, {"version", 99}, {"job", "j"}});
  Json answer = h.transport.take(c);
  CHECK(is_error(answer, "bad_version"));
  CHECK(answer["error"]["message"].get<std::string>().find("version 99") != std::string::npos);
  CHECK(h.transport.closed.count(c));
}

TEST_CASE("service: token authentication") {
  ServiceOptions options;
  options.token = "s3cret";
  ServiceHarness h(options);

  SECTION("the right proof is accepted and the daemon proves itself") {
    auto c = h.connect();
    Json challenge = h.transport.take(c);
    CHECK(challenge["auth"] == true);
    const auto& n = challenge["nonce"].get_binary();
    const std::string server_nonce(n.begin(), n.end());
    const std::string client_nonce(kNonceBytes, 'c');
    h.send(c, Json{{"op", "hello"},
                   {"id", 0},
                   {"version", 1},
                   {"job", "j"},
                   {"proof", to_binary(client_proof("s3cret", server_nonce, "j"))},
                   {"nonce", to_binary(client_nonce)}});
    Json answer = h.transport.take(c);
    REQUIRE(answer["ok"] == true);
    const auto& proof = answer["proof"].get_binary();
    CHECK(std::string(proof.begin(), proof.end()) ==
          server_proof("s3cret", client_nonce, server_nonce));
    CHECK(h.call(c, Json{{"op", "ping"}})["ok"] == true);
  }
  SECTION("no proof") {
    auto c = h.connect();
    h.transport.take(c);
    h.send(c, Json{{"op", "hello"}, {"id", 0}, {"version", 1}, {"job", "j"}});
    CHECK(is_error(h.transport.take(c), "auth_failed"));
    CHECK(h.transport.closed.count(c));
  }
  SECTION("a wrong token") {
    auto c = h.connect();
    Json challenge = h.transport.take(c);
    const auto& n = challenge["nonce"].get_binary();
    h.send(c,
           Json{{"op", "hello"},
                {"id", 0},
                {"version", 1},
                {"job", "j"},
                {"proof", to_binary(client_proof("guess", std::string(n.begin(), n.end()), "j"))}});
    CHECK(is_error(h.transport.take(c), "auth_failed"));
  }
  SECTION("a proof replayed on another connection") {
    auto first = h.connect();
    Json challenge = h.transport.take(first);
    const auto& n = challenge["nonce"].get_binary();
    Json hello{{"op", "hello"},
               {"id", 0},
               {"version", 1},
               {"job", "j"},
               {"proof", to_binary(client_proof("s3cret", std::string(n.begin(), n.end()), "j"))}};
    h.send(first, hello);
    REQUIRE(h.transport.take(first)["ok"] == true);
    auto second = h.connect();
    h.transport.take(second);
    h.send(second, hello);  // recorded proof, new nonce
    CHECK(is_error(h.transport.take(second), "auth_failed"));
  }
  SECTION("a proof made for another job") {
    auto c = h.connect();
    Json challenge = h.transport.take(c);
    const auto& n = challenge["nonce"].get_binary();
    h.send(c, Json{{"op", "hello"},
                   {"id", 0},
                   {"version", 1},
                   {"job", "other"},
                   {"proof",
                    to_binary(client_proof("s3cret", std::string(n.begin(), n.end()), "j"))}});
    CHECK(is_error(h.transport.take(c), "auth_failed"));
  }
}

TEST_CASE("service: protocol violations close only the offending connection") {
  ServiceHarness h;
  auto good = h.connect_hello();
  REQUIRE(h.call(good, Json{{"op", "set"}, {"key", "k"}, {"value", to_binary("v")}})["ok"] == true);

  SECTION("unknown op") {
    auto c = h.connect_hello();
    Json answer = h.call(c, Json{{"op", "format_disk"}});
    CHECK(is_error(answer, "unknown_op"));
    CHECK(answer["error"]["message"] == "unknown op 'format_disk'");
    CHECK(h.transport.closed.count(c));
  }
  SECTION("missing id") {
    auto c = h.connect_hello();
    h.send(c, Json{{"op", "ping"}});
    CHECK(is_error(h.transport.take(c), "bad_request"));
    CHECK(h.transport.closed.count(c));
  }
  SECTION("a field of the wrong type") {
    auto c = h.connect_hello();
    Json answer = h.call(c, Json{{"op", "set"}, {"key", 5}, {"value", to_binary("v")}});
    CHECK(is_error(answer, "bad_request"));
    CHECK(answer["error"]["message"] == "field 'key' missing or not a string");
  }
  SECTION("garbage bytes") {
    auto c = h.connect_hello();
    h.send_raw(c, std::string("\x00\x00\x00\x03\xc1\xc1\xc1", 7));
    CHECK(is_error(h.transport.take(c), "bad_frame"));
    CHECK(h.transport.closed.count(c));
  }
  SECTION("a frame over the limit") {
    auto c = h.connect_hello();
    h.send_raw(c, std::string("\x7f\xff\xff\xff", 4));
    CHECK(is_error(h.transport.take(c), "frame_too_large"));
    CHECK(h.transport.closed.count(c));
  }
  // Whatever happened to the other connection, the good one and its data are intact.
  Json got = h.call(good, Json{{"op", "get"}, {"key", "k"}});
  REQUIRE(got["ok"] == true);
  CHECK(got["value"].get_binary().size() == 1);
  CHECK_FALSE(h.transport.closed.count(good));
}

TEST_CASE("service: store operations over frames") {
  ServiceHarness h;
  auto c = h.connect_hello();
  CHECK(h.call(c, Json{{"op", "set"}, {"key", "a"}, {"value", to_binary("1")}})["ok"] == true);
  CHECK(h.call(c, Json{{"op", "add"}, {"key", "n"}, {"delta", 5}})["value"] == 5);
  CHECK(h.call(c, Json{{"op", "add"}, {"key", "n"}, {"delta", -1}})["value"] == 4);
  Json cas = h.call(c, Json{{"op", "compare_set"},
                            {"key", "a"},
                            {"expected", to_binary("1")},
                            {"desired", to_binary("2")}});
  CHECK(cas["value"].get_binary() == Json::binary_t(std::vector<std::uint8_t>{'2'}));
  CHECK(h.call(c, Json{{"op", "check"}, {"keys", {"a", "n"}}})["ready"] == true);
  CHECK(h.call(c, Json{{"op", "check"}, {"keys", {"a", "zz"}}})["ready"] == false);
  CHECK(h.call(c, Json{{"op", "num_keys"}})["count"] == 2);
  CHECK(h.call(c, Json{{"op", "multi_set"},
                       {"keys", {"x", "y"}},
                       {"values", {to_binary("X"), to_binary("Y")}}})["ok"] == true);
  Json many = h.call(c, Json{{"op", "multi_get"}, {"keys", {"y", "x"}}});
  REQUIRE(many["values"].size() == 2);
  CHECK(many["values"][0].get_binary()[0] == 'Y');
  CHECK(h.call(c, Json{{"op", "delete"}, {"key", "x"}})["deleted"] == true);
  CHECK(h.call(c, Json{{"op", "delete"}, {"key", "x"}})["deleted"] == false);
  Json missing = h.call(c, Json{{"op", "get"}, {"key", "x"}, {"timeout_ms", 0}});
  CHECK(is_error(missing, "not_found"));
  CHECK_FALSE(h.transport.closed.count(c));  // not a protocol violation
  h.call(c, Json{{"op", "set"}, {"key", "word"}, {"value", to_binary("abc")}});
  Json bad_add = h.call(c, Json{{"op", "add"}, {"key", "word"}, {"delta", 1}});
  CHECK(is_error(bad_add, "bad_request"));
}

TEST_CASE("service: a blocking get is answered when another client sets the key") {
  ServiceHarness h;
  auto waiter = h.connect_hello();
  auto setter = h.connect_hello();
  h.send(waiter, Json{{"op", "get"}, {"id", 42}, {"key", "addr"}});
  h.send(waiter, Json{{"op", "wait"}, {"id", 43}, {"keys", {"addr", "port"}}});
  CHECK_FALSE(h.transport.has(waiter));
  h.call(setter, Json{{"op", "set"}, {"key", "addr"}, {"value", to_binary("10.1.1.1")}});
  Json got = h.transport.take(waiter);
  CHECK(got["id"] == 42);
  CHECK(got["value"].get_binary().size() == 8);
  CHECK_FALSE(h.transport.has(waiter));  // wait needs both keys
  h.call(setter, Json{{"op", "set"}, {"key", "port"}, {"value", to_binary("1")}});
  CHECK(h.transport.take(waiter)["id"] == 43);
}

TEST_CASE("service: get and wait time out on the service clock") {
  ServiceHarness h;
  auto c = h.connect_hello();
  h.send(c, Json{{"op", "get"}, {"id", 1}, {"key", "never"}, {"timeout_ms", 500}});
  h.send(c, Json{{"op", "wait"}, {"id", 2}, {"keys", {"never"}}, {"timeout_ms", 2000}});
  h.clock.advance(499ms);
  h.service->tick();
  CHECK_FALSE(h.transport.has(c));
  h.clock.advance(1ms);
  h.service->tick();
  Json first = h.transport.take(c);
  CHECK(first["id"] == 1);
  CHECK(is_error(first, "timeout"));
  CHECK_FALSE(h.transport.has(c));
  h.clock.advance(2s);
  h.service->tick();
  CHECK(is_error(h.transport.take(c), "timeout"));
}

TEST_CASE("service: jobs do not see each other's keys") {
  ServiceHarness h;
  auto a = h.connect_hello("job-a");
  auto b = h.connect_hello("job-b");
  h.call(a, Json{{"op", "set"}, {"key", "secret"}, {"value", to_binary("a's")}});
  CHECK(
      is_error(h.call(b, Json{{"op", "get"}, {"key", "secret"}, {"timeout_ms", 0}}), "not_found"));
  CHECK(h.call(b, Json{{"op", "num_keys"}})["count"] == 0);
  CHECK(h.service->num_jobs() == 2);
}

TEST_CASE("service: waits of a closed connection are dropped") {
  ServiceHarness h;
  auto c = h.connect_hello();
  h.send(c, Json{{"op", "get"}, {"id", 1}, {"key", "k"}});
  h.service->on_disconnect(c);
  auto other = h.connect_hello();
  // Setting the key must not send to the departed connection (FakeTransport would throw).
  CHECK(h.call(other, Json{{"op", "set"}, {"key", "k"}, {"value", to_binary("v")}})["ok"] == true);
}

TEST_CASE("service: too many waits on one connection are refused") {
  ServiceOptions options;
  options.max_waiters_per_connection = 3;
  ServiceHarness h(options);
  auto c = h.connect_hello();
  for (int i = 0; i < 3; ++i) h.send(c, Json{{"op", "get"}, {"id", i}, {"key", "k"}});
  CHECK_FALSE(h.transport.has(c));
  Json refused = h.call(c, Json{{"op", "get"}, {"key", "k"}});
  CHECK(is_error(refused, "limit"));
}

TEST_CASE("service: silent and slow clients are cut off") {
  ServiceOptions options;
  options.hello_timeout = 10s;
  options.frame_timeout = 5s;
  ServiceHarness h(options);
  auto silent = h.connect();
  auto slow = h.connect_hello();
  auto idle = h.connect_hello();
  // The slow client sends a frame one byte at a time, far too slowly.
  std::string frame = encode_frame(Json{{"op", "ping"}, {"id", 1}});
  for (std::size_t i = 0; i < 3; ++i) {
    h.send_raw(slow, frame.substr(i, 1));
    h.clock.advance(2s);
    h.service->tick();
  }
  CHECK(h.transport.closed.count(slow));
  CHECK(mentions(h.logs, "frame incomplete"));
  CHECK_FALSE(h.transport.closed.count(silent));
  h.clock.advance(4s);
  h.service->tick();
  CHECK(h.transport.closed.count(silent));
  CHECK(mentions(h.logs, "no hello within 10000 ms"));
  // A client that said hello and is merely idle between frames stays.
  h.clock.advance(1h);
  h.service->tick();
  CHECK_FALSE(h.transport.closed.count(idle));
}

TEST_CASE("service: the connection limit") {
  ServiceOptions options;
  options.max_connections = 2;
  ServiceHarness h(options);
  h.connect_hello();
  h.connect_hello();
  auto third = h.connect();
  CHECK(is_error(h.transport.take(third), "limit"));
  CHECK(h.transport.closed.count(third));
  CHECK(h.service->num_connections() == 2);
}

TEST_CASE("service: the per-host connection limit leaves room for other hosts") {
  ServiceOptions options;
  options.max_connections_per_host = 2;
  ServiceHarness h(options);
  auto a1 = h.connect("10.0.0.1");
  h.connect("10.0.0.1");
  auto refused = h.connect("10.0.0.1");
  CHECK(is_error(h.transport.take(refused), "limit"));
  CHECK(h.transport.closed.count(refused));
  CHECK(mentions(h.logs, "2 connections already open from 10.0.0.1"));
  auto other = h.connect("[fd00::7]");
  CHECK(h.transport.take(other)["event"] == "challenge");
  h.service->on_disconnect(a1);  // a slot of 10.0.0.1 frees up
  auto again = h.connect("10.0.0.1");
  CHECK(h.transport.take(again)["event"] == "challenge");
  CHECK(h.service->num_connections() == 3);
}

TEST_CASE("service: a two-node rendezvous over frames") {
  ServiceHarness h;
  auto a = h.connect_hello();
  auto b = h.connect_hello();
  Json ja = join_request("a", 2, 2, 2);
  ja["id"] = 7;
  h.send(a, ja);
  CHECK_FALSE(h.transport.has(a));  // the answer waits for the round
  Json jb = join_request("b", 2, 2, 3);
  jb["id"] = 8;
  h.send(b, jb);
  Json ra = h.transport.take(a);
  Json rb = h.transport.take(b);
  CHECK(ra["id"] == 7);
  CHECK(ra["group_rank"] == 0);
  CHECK(rb["group_rank"] == 1);
  CHECK(rb["rank_offset"] == 2);
  CHECK(rb["world_size"] == 5);
  CHECK(rb["master_addr"] == "a.host");
  CHECK(mentions(h.logs, "round 0 formed: 2 nodes, world size 5"));

  // b's connection drops: a is told at once, no polling.
  h.service->on_disconnect(b);
  Json event = h.transport.take(a);
  CHECK(event["event"] == "round_reopened");
  CHECK(event["round"] == 1);
  CHECK(event["reason"].get<std::string>().find("'b' left (connection closed by peer)") !=
        std::string::npos);

  Json status = h.call(a, Json{{"op", "status"}});
  CHECK(status["rendezvous"]["round"] == 1);
  CHECK(status["rendezvous"]["formed"] == false);
}

TEST_CASE("service: a join that disagrees with the job's node counts is refused") {
  ServiceHarness h;
  auto a = h.connect_hello();
  auto b = h.connect_hello();
  h.send(a, with_id(join_request("a", 2, 2), 1));
  Json refused = h.call(b, join_request("b", 1, 4));
  CHECK(is_error(refused, "conflict"));
  CHECK(refused["error"]["message"].get<std::string>().find("nnodes 2:2") != std::string::npos);
}

TEST_CASE("service: join fields are validated") {
  ServiceHarness h;
  auto a = h.connect_hello();
  Json no_size = join_request("a", 1, 1);
  no_size.erase("local_world_size");
  CHECK(is_error(h.call(a, no_size), "bad_request"));
  auto b = h.connect_hello();
  Json bad = join_request("b", 1, 1);
  bad["max_nodes"] = 1 << 30;
  Json answer = h.call(b, bad);
  CHECK(is_error(answer, "bad_request"));
  CHECK(answer["error"]["message"].get<std::string>().find("max_nodes") != std::string::npos);
  auto c = h.connect_hello();
  CHECK(is_error(h.call(c, join_request("c", 3, 2)), "bad_request"));  // min > max
}

TEST_CASE("service: report ends the job and pushes job_ended") {
  ServiceHarness h;
  auto a = h.connect_hello();
  auto b = h.connect_hello();
  h.send(a, with_id(join_request("a", 2, 2), 1));
  h.send(b, with_id(join_request("b", 2, 2), 1));
  h.transport.take(a);
  h.transport.take(b);
  CHECK(
      h.call(a, Json{{"op", "report"}, {"result", "failed"}, {"message", "rank 1 exit 3"}})["ok"] ==
      true);
  Json ended_a = h.transport.take(a);
  Json ended_b = h.transport.take(b);
  CHECK(ended_b["event"] == "job_ended");
  CHECK(ended_b["state"] == "failed");
  CHECK(ended_b["reason"].get<std::string>().find("rank 1 exit 3") != std::string::npos);
  CHECK(ended_a["event"] == "job_ended");
  Json bogus = h.call(a, Json{{"op", "report"}, {"result", "maybe"}});
  CHECK(is_error(bogus, "bad_request"));
}

TEST_CASE("service: an ended job's id starts a fresh job once its nodes are gone") {
  ServiceHarness h;
  auto a = h.connect_hello("none");
  h.send(a, with_id(join_request("a", 1, 1), 1));
  Json first = h.transport.take(a);
  CHECK(first["store_prefix"] == "rdzv/0/0/");
  h.call(a, Json{{"op", "report"}, {"result", "succeeded"}});
  h.transport.take(a);  // job_ended
  h.service->on_disconnect(a);
  auto again = h.connect_hello("none");
  h.send(again, with_id(join_request("a2", 1, 1), 1));
  Json second = h.transport.take(again);
  REQUIRE(second["ok"] == true);
  CHECK(second["store_prefix"] == "rdzv/1/0/");  // a new generation: no stale round keys
}

TEST_CASE("service: a node reconnecting on a new connection keeps its place") {
  ServiceHarness h;
  auto old_conn = h.connect_hello();
  h.send(old_conn, with_id(join_request("a", 2, 2), 1));
  auto new_conn = h.connect_hello();
  h.send(new_conn, with_id(join_request("a", 2, 2), 1));
  Json superseded = h.transport.take(old_conn);
  CHECK(is_error(superseded, "conflict"));
  h.service->on_disconnect(old_conn);  // must not remove node a
  auto b = h.connect_hello();
  h.send(b, with_id(join_request("b", 2, 2), 1));
  CHECK(h.transport.take(new_conn)["group_rank"] == 0);
  CHECK(h.transport.take(b)["group_rank"] == 1);
}

TEST_CASE("service: idle jobs are dropped after their retention") {
  ServiceOptions options;
  options.idle_job_timeout = 1min;
  ServiceHarness h(options);
  auto c = h.connect_hello("temp");
  h.call(c, Json{{"op", "set"}, {"key", "k"}, {"value", to_binary("v")}});
  h.service->on_disconnect(c);
  h.clock.advance(59s);
  h.service->tick();
  CHECK(h.service->num_jobs() == 1);
  h.clock.advance(1s);
  h.service->tick();
  CHECK(h.service->num_jobs() == 0);
}

TEST_CASE("service: keep-alives keep a joined node, silence removes it") {
  ServiceHarness h;
  auto a = h.connect_hello();
  auto b = h.connect_hello();
  Json ja = join_request("a", 2, 2);
  ja["keep_alive_interval_ms"] = 1000;
  ja["keep_alive_max_attempt"] = 2;
  ja["id"] = 1;
  Json jb = ja;
  jb["node"] = "b";
  h.send(a, ja);
  h.send(b, jb);
  h.transport.take(a);
  h.transport.take(b);
  for (int i = 0; i < 3; ++i) {
    h.clock.advance(900ms);
    h.call(a, Json{{"op", "keep_alive"}});
    h.service->tick();
  }
  // b said nothing for 2.7 s > 2 x 1 s: dropped, and a is told.
  Json event = h.transport.take(a);
  CHECK(event["event"] == "round_reopened");
  CHECK(event["reason"].get<std::string>().find("no keep-alive") != std::string::npos);
  // b's connection was still open (a partition that heals): it is closed, so b's agent learns
  // through resume that it must join again, instead of running on as a ghost member.
  REQUIRE(h.transport.has(b));
  Json closed = h.transport.take(b);
  CHECK(is_error(closed, "closed"));
  CHECK(closed["error"]["message"].get<std::string>().find("'b' was dropped") != std::string::npos);
  CHECK(h.transport.closed.count(b));
  CHECK_FALSE(h.transport.closed.count(a));
}

TEST_CASE("service: a refused join binds nothing, so an ended job's id can start anew") {
  ServiceHarness h;
  auto a = h.connect_hello("run");
  h.send(a, with_id(join_request("a", 1, 1), 1));
  REQUIRE(h.transport.take(a)["ok"] == true);
  h.call(a, Json{{"op", "report"}, {"result", "failed"}, {"message", "boom"}});
  h.transport.take(a);  // job_ended
  // A new agent arrives while the old node is still connected: refused, and not bound.
  auto b = h.connect_hello("run");
  CHECK(is_error(h.call(b, join_request("b", 1, 1)), "closed"));
  h.service->on_disconnect(a);
  // Now the old job's nodes are gone: b's retry on the same connection starts a fresh job.
  Json retry = h.call(b, join_request("b", 1, 1));
  REQUIRE(retry["ok"] == true);
  CHECK(retry["store_prefix"] == "rdzv/1/0/");
}

TEST_CASE("service: a join with an empty node id is refused without a trace") {
  ServiceHarness h;
  auto c = h.connect_hello();
  CHECK(is_error(h.call(c, join_request("", 1, 1)), "bad_request"));
  Json ok = h.call(c, join_request("real", 1, 1));
  CHECK(ok["ok"] == true);
}

TEST_CASE("service: timeout_ms outside 0..2^40 is a bad request, not an instant timeout") {
  ServiceHarness h;
  for (std::int64_t bad : {std::int64_t{-1}, std::int64_t{1} << 62}) {
    auto c = h.connect_hello();
    Json answer = h.call(c, Json{{"op", "get"}, {"key", "k"}, {"timeout_ms", bad}});
    CHECK(is_error(answer, "bad_request"));
    CHECK(answer["error"]["message"].get<std::string>().find("timeout_ms") != std::string::npos);
  }
}

TEST_CASE("service: a request id in a signed MessagePack format is accepted") {
  ServiceHarness h;
  auto c = h.connect_hello();
  // {"op": "ping", "id": 5} with 5 as int8 (0xd0), as some MessagePack libraries write it.
  const std::string body = std::string("\x82\xa2op\xa4ping\xa2id\xd0\x05", 14);
  const std::string frame = std::string("\x00\x00\x00", 3) + static_cast<char>(body.size()) + body;
  h.send_raw(c, frame);
  Json answer = h.transport.take(c);
  CHECK(answer["ok"] == true);
  CHECK(answer["id"] == 5);
  // A negative id is still refused.
  const std::string negative = std::string("\x82\xa2op\xa4ping\xa2id\xff", 13);
  h.send_raw(c, std::string("\x00\x00\x00", 3) + static_cast<char>(negative.size()) + negative);
  CHECK(is_error(h.transport.take(c), "bad_request"));
}

TEST_CASE("service: an answer larger than a frame is refused with a clear error") {
  ServiceOptions options;
  options.max_frame_bytes = 1024;
  ServiceHarness h(options);
  auto c = h.connect_hello();
  h.call(c, Json{{"op", "set"}, {"key", "a"}, {"value", to_binary(std::string(600, 'a'))}});
  h.call(c, Json{{"op", "set"}, {"key", "b"}, {"value", to_binary(std::string(600, 'b'))}});
  Json answer = h.call(c, Json{{"op", "multi_get"}, {"keys", {"a", "b"}}});
  CHECK(is_error(answer, "limit"));
  CHECK(answer["error"]["message"].get<std::string>().find("frame limit of 1024") !=
        std::string::npos);
  CHECK_FALSE(h.transport.closed.count(c));
}

TEST_CASE("service: a refused first join does not fix the job's node counts") {
  ServiceHarness h;
  auto a = h.connect_hello();
  CHECK(is_error(h.call(a, join_request("a", 1, 1, /*local_world_size=*/0)), "bad_request"));
  Json ok = h.call(a, join_request("a", 1, 1));
  CHECK(ok["ok"] == true);  // the refused 1:1 join created nothing; a 1:1 join forms
  auto b = h.connect_hello("other");
  CHECK(is_error(h.call(b, join_request(std::string(300, 'n'), 1, 1)), "bad_request"));
}

TEST_CASE("service: a formed round tells every member the job's restart count as it formed") {
  ServiceHarness h;
  auto a = h.connect_hello("job");
  auto b = h.connect_hello("job");
  REQUIRE(h.call(a, {{"op", "add"}, {"key", kRestartsKey}, {"delta", 2}})["ok"] == true);
  h.send(a, with_id(join_request("a", 2, 2), 1));
  h.send(b, with_id(join_request("b", 2, 2), 2));
  const Json to_a = h.transport.take(a);
  const Json to_b = h.transport.take(b);
  CHECK(to_a["restart_count"] == 2);
  CHECK(to_b["restart_count"] == 2);
  // A restart counted once the round has formed belongs to the next round, not this one.
  REQUIRE(h.call(a, {{"op", "add"}, {"key", kRestartsKey}, {"delta", 1}})["ok"] == true);
  auto parsed = round_assignment_from_json(to_b);
  REQUIRE(parsed.ok());
  CHECK(parsed.value().restart_count == 2);
}

TEST_CASE("service: an injected store latency holds the job's answers back, in order, for a time") {
  ServiceHarness h;
  auto agent = h.connect_hello("slow");
  auto other = h.connect_hello("fast");
  // Set as an agent's fault sets it: 200 ms late for 1 s.
  h.send(agent, Json{{"op", "set"},
                     {"id", 1},
                     {"key", kStoreLatencyKey},
                     {"value", to_binary(R"({"ms": 200, "seconds": 1})")}});
  CHECK_FALSE(h.transport.has(agent));  // its own answer is late too
  h.send(agent, Json{{"op", "set"}, {"id", 2}, {"key", "k"}, {"value", to_binary("v")}});
  h.send(agent, Json{{"op", "get"}, {"id", 3}, {"key", "k"}});
  CHECK(h.call(other, Json{{"op", "ping"}})["ok"] == true);  // another job: at once
  h.clock.advance(199ms);
  h.service->tick();
  CHECK_FALSE(h.transport.has(agent));
  h.clock.advance(1ms);
  h.service->tick();
  CHECK(h.transport.take(agent)["id"] == 1);
  CHECK(h.transport.take(agent)["id"] == 2);
  CHECK(h.transport.take(agent)["id"] == 3);
  CHECK(mentions(h.logs, "job 'slow': answering 200 ms late for 1.000 s"));
  // Once the time is over, at once again.
  h.clock.advance(1s);
  h.service->tick();
  CHECK(h.call(agent, Json{{"op", "ping"}})["ok"] == true);
  // A bad value is named in the log and changes nothing.
  h.send(agent, Json{{"op", "set"},
                     {"id", 4},
                     {"key", kStoreLatencyKey},
                     {"value", to_binary(R"({"ms": -1})")}});
  CHECK(h.transport.take(agent)["id"] == 4);
  CHECK(mentions(h.logs, "ignored ctrun/fault/store_latency"));
}

TEST_CASE("service: answers held back go with their connection, and before a refusal") {
  ServiceHarness h;
  auto agent = h.connect_hello("slow");
  h.send(agent, Json{{"op", "set"},
                     {"id", 1},
                     {"key", kStoreLatencyKey},
                     {"value", to_binary(R"({"ms": 500, "seconds": 5})")}});
  h.send(agent, Json{{"op", "hello"}, {"id", 2}, {"version", kProtocolVersion}, {"job", "x"}});
  // "hello was already said" is an answer, not a refusal: held back as well.
  CHECK_FALSE(h.transport.has(agent));
  h.send(agent, Json{{"op", 7}, {"id", 3}});  // a protocol violation: closed at once
  CHECK(h.transport.take(agent)["id"] == 1);
  CHECK(h.transport.take(agent)["id"] == 2);
  CHECK(is_error(h.transport.take(agent), "bad_request"));
  CHECK(h.transport.closed.count(agent));
  h.clock.advance(1s);
  h.service->tick();  // nothing left for a closed connection
  CHECK_FALSE(h.transport.has(agent));
}

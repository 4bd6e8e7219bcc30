#include "rendezvous/etcd/etcd.h"

#include "catch.h"

using namespace ctrun::rendezvous;
using namespace ctrun::rendezvous::etcd;

TEST_CASE("etcd codec: base64 round trips every length and byte") {
  CHECK(base64_encode("") == "");
  CHECK(base64_encode("foo") == "Zm9v");
  CHECK(base64_encode("fo") == "Zm8=");
  CHECK(base64_encode("f") == "Zg==");
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (std::size_t n = 0; n <= all.size(); n += 37) {
    const std::string part = all.substr(0, n);
    auto back = base64_decode(base64_encode(part));
    REQUIRE(back.ok());
    CHECK(back.value() == part);
  }
  CHECK_FALSE(base64_decode("YQ").ok());    // unpadded
  CHECK_FALSE(base64_decode("-_8=").ok());  // URL-safe alphabet
  CHECK_FALSE(base64_decode("Z=g=").ok());  // padding in the middle
}

TEST_CASE("etcd codec: a prefix's range end") {
  CHECK(prefix_end("/ctrun/job/") == "/ctrun/job0");
  CHECK(prefix_end(std::string("a\xff", 2)) == "b");
  CHECK(prefix_end(std::string("\xff", 1)) == std::string(1, '\0'));
}

TEST_CASE("etcd codec: endpoints, several, with or without scheme and port") {
  auto eps = parse_endpoint_list("h1:2379,http://h2:23790/,h3,[::1]:4000");
  REQUIRE(eps.ok());
  REQUIRE(eps.value().size() == 4);
  CHECK(eps.value()[0].host == "h1");
  CHECK(eps.value()[1].port == 23790);
  CHECK(eps.value()[2].port == 2379);
  CHECK(eps.value()[3].host == "::1");
  CHECK(eps.value()[3].port == 4000);
  // Written back in the form read (defaults filled in), as the agent hands it to workers.
  CHECK(format_endpoint_list(eps.value()) == "h1:2379,h2:23790,h3:2379,[::1]:4000");
  // https:// members: the same addresses, and endpoints_https says TLS; one scheme for all.
  auto tls = parse_endpoint_list("https://h1:2379,https://[::1]:4000/");
  REQUIRE(tls.ok());
  CHECK(format_endpoint_list(tls.value()) == "h1:2379,[::1]:4000");
  CHECK(endpoint_list_https("https://h1:2379,h2").value());
  CHECK_FALSE(endpoint_list_https("http://h1:2379,h2").value());
  CHECK_FALSE(endpoint_list_https("h1").value());
  CHECK(parse_endpoint_list("https://h1,http://h2").error().message ==
        "--rdzv_endpoint: 'https://h1,http://h2' mixes http:// and https:// members");
  CHECK_THAT(parse_endpoint_list("h1:,h2").error().message,
             Catch::Matchers::ContainsSubstring("no port after ':' in 'h1:'"));
  CHECK_THAT(parse_endpoint_list("::1").error().message,
             Catch::Matchers::ContainsSubstring("in brackets, as [::1]:2379"));
  CHECK_THAT(parse_endpoint_list("h1,,h2").error().message,
             Catch::Matchers::ContainsSubstring("empty etcd endpoint"));
  CHECK_THAT(parse_endpoint_list("h1:99999").error().message,
             Catch::Matchers::ContainsSubstring("'99999'"));
}

TEST_CASE("etcd codec: requests use base64, string int64s and upper-case enums") {
  Txn t;
  t.compare.push_back(Compare{"k", Compare::Target::kCreate, Compare::Result::kEqual, 0, ""});
  t.compare.push_back(Compare{"v", Compare::Target::kValue, Compare::Result::kNotEqual, 0, "x"});
  t.success.push_back(put_op("k", "v", 7));
  t.failure.push_back(range_op("k"));
  const Json j = txn_request(t);
  CHECK(j["compare"][0] ==
        Json{{"key", "aw=="}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}});
  CHECK(j["compare"][1]["value"] == "eA==");
  CHECK(j["compare"][1]["result"] == "NOT_EQUAL");
  CHECK(j["success"][0]["request_put"] == Json{{"key", "aw=="}, {"value", "dg=="}, {"lease", "7"}});
  CHECK(j["failure"][0]["request_range"] == Json{{"key", "aw=="}});
  CHECK(watch_request("/p/", "/p0", 12)["create_request"]["start_revision"] == "12");
  CHECK(watch_request("/p/", "/p0", 0)["create_request"].count("filters") == 0);
  // Older keys: keys only, the revision filter, the limit (strings, as int64s are).
  Txn older;
  older.success.push_back(older_keys_op("/j/", 10, 3));
  CHECK(txn_request(older)["success"][0]["request_range"] == Json{{"key", "L2ov"},
                                                                  {"range_end", "L2ow"},
                                                                  {"limit", "3"},
                                                                  {"keys_only", true},
                                                                  {"max_mod_revision", "9"}});
  CHECK(watch_request("/p/", "/p0", 0, WatchEvents::kDeletesOnly)["create_request"]["filters"] ==
        Json::array({"NOPUT"}));
  CHECK(range_request("k", "", 1, true) ==
        Json{{"key", "aw=="}, {"limit", "1"}, {"keys_only", true}});
  CHECK(range_request("k").count("keys_only") == 0);
  // The builders make what the struct spells out.
  const Json built =
      txn_request(Txn{{unchanged_since("k", 0)}, {put_op("k", "v", 7)}, {range_op("k")}});
  CHECK(built["compare"][0] == j["compare"][0]);
  CHECK(built["success"] == j["success"]);
  CHECK(built["failure"] == j["failure"]);
  CHECK(delete_op("a", "b").kind == Operation::Kind::kDelete);
}

TEST_CASE("etcd codec: answers with omitted zero fields read as defaults") {
  auto r = parse_range(Json::parse(R"({"header":{"revision":"9"}})"));
  REQUIRE(r.ok());
  CHECK(r.value().revision == 9);
  CHECK(r.value().kvs.empty());
  CHECK(r.value().count == 0);

  r = parse_range(Json::parse(
      R"({"header":{"revision":"9"},"kvs":[{"key":"Zm9v","create_revision":"5","mod_revision":"8","version":"2","lease":"77"}],"count":"1"})"));
  REQUIRE(r.ok());
  REQUIRE(r.value().kvs.size() == 1);
  CHECK(r.value().kvs[0].key == "foo");
  CHECK(r.value().kvs[0].value.empty());  // an empty value is left out
  CHECK(r.value().kvs[0].mod_revision == 8);
  CHECK(r.value().kvs[0].lease == 77);

  auto failed = parse_txn(Json::parse(
      R"({"header":{"revision":"8"},"responses":[{"response_range":{"header":{"revision":"8"},"kvs":[{"key":"aw==","value":"dg==","mod_revision":"8"}],"count":"1"}}]})"));
  REQUIRE(failed.ok());
  CHECK_FALSE(failed.value().succeeded);
  REQUIRE(failed.value().ranges.size() == 1);
  CHECK(failed.value().ranges[0].kvs[0].value == "v");

  auto grant = parse_lease_grant(
      Json::parse(R"({"header":{"revision":"1"},"ID":"2324035547517922595","TTL":"5"})"));
  REQUIRE(grant.ok());
  CHECK(grant.value().id == 2324035547517922595LL);
  CHECK(parse_keep_alive(Json::parse(R"({"result":{"header":{},"ID":"5"}})")).value() == 0);
  auto left = parse_lease_time_to_live(
      Json::parse(R"({"header":{"revision":"3"},"ID":"5","TTL":"4","grantedTTL":"15"})"));
  REQUIRE(left.ok());
  CHECK(left.value().ttl == 4);
  CHECK(left.value().granted_ttl == 15);
  CHECK(parse_lease_time_to_live(Json::parse(R"({"header":{},"ID":"5","TTL":"-1"})")).value().ttl ==
        -1);
  CHECK_FALSE(parse_lease_time_to_live(Json::parse(R"({"header":{},"TTL":"x"})")).ok());

  auto w = parse_watch_message(Json::parse(
      R"({"result":{"header":{"revision":"23"},"events":[{"kv":{"key":"YQ==","mod_revision":"21","value":"Mg=="}},{"type":"DELETE","kv":{"key":"YQ==","mod_revision":"23"}}]}})"));
  REQUIRE(w.ok());
  REQUIRE(w.value().events.size() == 2);
  CHECK_FALSE(w.value().events[0].deleted);
  CHECK(w.value().events[0].kv.value == "2");
  CHECK(w.value().events[1].deleted);
  auto compacted = parse_watch_message(Json::parse(
      R"({"result":{"header":{"raft_term":"2"},"canceled":true,"compact_revision":"22"}})"));
  REQUIRE(compacted.ok());
  CHECK(compacted.value().canceled);
  CHECK(compacted.value().compact_revision == 22);
}

TEST_CASE("etcd codec: error answers map to error codes and say etcd's words") {
  auto e = error_from_answer(
      404,
      R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5})");
  CHECK(e.code == ErrorCode::kNotFound);
  CHECK(e.message == "etcd: etcdserver: requested lease not found");
  CHECK(
      error_from_answer(503, R"({"error":"x","message":"etcdserver: no leader","code":14})").code ==
      ErrorCode::kConnection);
  CHECK(error_from_answer(
            503, R"({"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader"}})")
            .message == "etcd: etcdserver: no leader");
  CHECK(error_from_answer(400,
                          R"({"error":"e","message":"etcdserver: key is not provided","code":3})")
            .code == ErrorCode::kBadRequest);
  CHECK(error_from_answer(404, "404 page not found").message ==
        "etcd: HTTP 404: 404 page not found");
  CHECK_FALSE(parse_range(Json::parse(R"({"header":{"revision":"x"}})")).ok());
  CHECK_FALSE(parse_range(Json::parse(R"({"nothing":1})")).ok());
}

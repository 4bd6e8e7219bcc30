// The "rendezvous" key's value: deflated JSON, plain JSON from earlier writers, and clear errors
// for anything else.
#include "rendezvous/etcd/state_value.h"

#include "catch.h"

using namespace ctrun::rendezvous;

namespace {

// A state of `n` nodes shaped as Rendezvous::save() writes one.
Json state_of(int n) {
  Json nodes = Json::array();
  for (int i = 0; i < n; ++i) {
    nodes.push_back({{"node", "node-" + std::to_string(i) + "-7f3a9c"},
                     {"host", "10.1." + std::to_string(i / 256) + "." + std::to_string(i % 256)},
                     {"local_world_size", 8},
                     {"master_port", 29500},
                     {"requested_rank", -1},
                     {"place", 2},
                     {"join_seq", i},
                     {"succeeded", false},
                     {"waited_ms", 0}});
  }
  return Json{{"job", "train"}, {"round", 3}, {"nodes", std::move(nodes)}};
}

}  // namespace

TEST_CASE("etcd state value: deflated and back, a tenth of the JSON or less at 1,024 nodes") {
  const Json state = state_of(1024);
  const std::string value = etcd::encode_state_value(state);
  CHECK(value.rfind("deflate:", 0) == 0);
  const std::size_t plain = state.dump().size();
  INFO("plain " << plain << " B, deflated " << value.size() << " B");
  CHECK(value.size() * 10 <= plain);
  auto back = etcd::decode_state_value("/ctrun/train/rendezvous", value);
  REQUIRE(back.ok());
  CHECK(back.value() == state);
  // Every size from the empty state up: a stream's end falls anywhere in its last byte.
  for (int n = 0; n <= 40; ++n) {
    for (int tail = 0; tail < 8; ++tail) {
      Json small = state_of(n);
      small["end_reason"] = std::string(static_cast<std::size_t>(tail), 'x');
      auto decoded = etcd::decode_state_value("k", etcd::encode_state_value(small));
      INFO(n << " nodes, " << tail);
      REQUIRE(decoded.ok());
      CHECK(decoded.value() == small);
    }
  }
  auto empty = etcd::decode_state_value("k", etcd::encode_state_value(Json::object()));
  REQUIRE(empty.ok());
  CHECK(empty.value() == Json::object());
}

TEST_CASE("etcd state value: plain JSON from an earlier ctrun reads, anything else is one error") {
  const Json state = state_of(3);
  auto plain = etcd::decode_state_value("k", state.dump());
  REQUIRE(plain.ok());
  CHECK(plain.value() == state);

  const std::string key = "/ctrun/train/rendezvous";
  std::string deflated = etcd::encode_state_value(state_of(64));
  for (const std::string& bad :
       {std::string("not json"), std::string("[1, 2]"), std::string("deflate:"),
        std::string("deflate:\xff\xfe garbage"), std::string("deflate:10:\xff\xfe garbage"),
        std::string("deflate:99999999999999999999:x"), deflated.substr(0, deflated.size() / 2)}) {
    auto decoded = etcd::decode_state_value(key, bad);
    REQUIRE_FALSE(decoded.ok());
    CHECK(decoded.error().code == ErrorCode::kBadRequest);
    CHECK(decoded.error().message.find(key + " does not hold a ctrun rendezvous") !=
          std::string::npos);
  }
  // Text a worker wrote that is not UTF-8 is replaced, never a throw.
  Json odd = state;
  odd["end_reason"] = std::string("bad \xff byte");
  auto replaced = etcd::decode_state_value(key, etcd::encode_state_value(odd));
  REQUIRE(replaced.ok());
  CHECK(replaced.value()["end_reason"].get<std::string>().find("bad ") == 0);
}

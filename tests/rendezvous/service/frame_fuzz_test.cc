// Fuzz-style tests: random and mutated frames at the decoder and at the request dispatcher.
// Seeded, so a failure reproduces; CTRUN_FUZZ_SEED picks another seed.
#include <cstdlib>
#include <random>

#include "catch.h"
#include "ctrun/rendezvous/frame.h"
#include "rendezvous/protocol/tcpstore_wire.h"
#include "service_harness.h"

using namespace ctrun::rendezvous;
using namespace ctrun::rendezvous::testing;

namespace {

std::uint32_t seed() {
  const char* env = std::getenv("CTRUN_FUZZ_SEED");
  return env ? static_cast<std::uint32_t>(std::strtoul(env, nullptr, 10)) : 20261122u;
}

// Valid requests of every op: the seeds that mutations start from.
std::vector<std::string> seed_corpus() {
  std::vector<Json> requests = {
      {{"op", "hello"}, {"id", 0}, {"version", 1}, {"job", "j"}},
      {{"op", "set"}, {"id", 1}, {"key", "k"}, {"value", to_binary("v")}},
      {{"op", "get"}, {"id", 2}, {"key", "k"}, {"timeout_ms", 0}},
      {{"op", "add"}, {"id", 3}, {"key", "n"}, {"delta", 1}},
      {{"op", "compare_set"},
       {"id", 4},
       {"key", "k"},
       {"expected", to_binary("")},
       {"desired", to_binary("x")}},
      {{"op", "check"}, {"id", 5}, {"keys", {"k", "n"}}},
      {{"op", "wait"}, {"id", 6}, {"keys", {"k"}}, {"timeout_ms", 1}},
      {{"op", "delete"}, {"id", 7}, {"key", "k"}},
      {{"op", "num_keys"}, {"id", 8}},
      {{"op", "multi_get"}, {"id", 9}, {"keys", {"k"}}, {"timeout_ms", 0}},
      {{"op", "multi_set"}, {"id", 10}, {"keys", {"a"}}, {"values", {to_binary("b")}}},
      {{"op", "join"},
       {"id", 11},
       {"node", "n"},
       {"host", "h"},
       {"local_world_size", 1},
       {"min_nodes", 1},
       {"max_nodes", 2}},
      {{"op", "keep_alive"}, {"id", 12}},
      {{"op", "report"}, {"id", 13}, {"result", "failed"}, {"message", "m"}},
      {{"op", "status"}, {"id", 14}},
      {{"op", "jobs"}, {"id", 15}},
      {{"op", "leave"}, {"id", 16}},
      {{"op", "close"}, {"id", 17}},
      {{"op", "ping"}, {"id", 18}},
  };
  std::vector<std::string> out;
  for (const auto& r : requests) out.push_back(encode_frame(r));
  return out;
}

std::string mutate(std::string s, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const std::size_t at = rng() % s.size();
    switch (rng() % 5) {
      case 0:
        s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8)));
        break;  // bit flip
      case 1:
        s[at] = static_cast<char>(byte(rng));
        break;  // byte change
      case 2:
        s.erase(at, 1 + rng() % 4);
        break;  // deletion
      case 3:
        s.insert(at, 1, static_cast<char>(byte(rng)));
        break;  // insertion
      case 4:
        s.resize(at);
        break;  // truncation
    }
  }
  // Keep the length prefix consistent half the time, so the body parser is exercised too.
  if (s.size() >= kFrameHeaderBytes && rng() % 2 == 0) {
    const auto n = static_cast<std::uint32_t>(s.size() - kFrameHeaderBytes);
    s[0] = static_cast<char>(n >> 24);
    s[1] = static_cast<char>(n >> 16);
    s[2] = static_cast<char>(n >> 8);
    s[3] = static_cast<char>(n);
  }
  return s;
}

std::string random_input(std::mt19937& rng) {
  std::string s(rng() % 48, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  if (s.size() >= 4 && rng() % 2 == 0) {  // plausible length prefix
    s[0] = s[1] = 0;
    s[2] = 0;
    s[3] = static_cast<char>(s.size() - 4);
  }
  return s;
}

}  // namespace

TEST_CASE("fuzz: 120,000 random and mutated inputs never break the decoder") {
  std::mt19937 rng(seed());
  const auto corpus = seed_corpus();
  int decoded = 0, rejected = 0;
  for (int i = 0; i < 120'000; ++i) {
    const std::string input =
        i % 3 == 0 ? random_input(rng) : mutate(corpus[rng() % corpus.size()], rng);
    FrameDecoder decoder(1 << 16);
    // Feed in random slices, as a socket would deliver them.
    std::size_t pos = 0;
    bool failed = false;
    while (pos < input.size() && !failed) {
      const std::size_t n = std::min<std::size_t>(input.size() - pos, 1 + rng() % 16);
      decoder.feed(input.data() + pos, n);
      pos += n;
      while (true) {
        auto frame = decoder.next();
        if (!frame) {
          failed = true;
          ++rejected;
          REQUIRE(decoder.failed());
          REQUIRE_FALSE(frame.error().message.empty());
          break;
        }
        if (!frame.value()) break;
        REQUIRE(frame.value()->is_object());
        ++decoded;
      }
    }
  }
  // Both outcomes must actually occur, or the test is not exercising anything.
  CHECK(decoded > 1000);
  CHECK(rejected > 1000);
}

TEST_CASE("fuzz: 100,000 mutated requests never break the service") {
  std::mt19937 rng(seed() + 1);
  const auto corpus = seed_corpus();
  ServiceOptions options;
  options.max_frame_bytes = 1 << 16;
  ServiceHarness h(options);
  auto keeper = h.connect_hello("keeper");
  REQUIRE(h.call(keeper,
                 Json{{"op", "set"}, {"key", "precious"}, {"value", to_binary("data")}})["ok"] ==
          true);

  int inputs = 0;
  while (inputs < 100'000) {
    // A fresh connection: usually a valid hello first so later frames reach the dispatcher.
    auto c = h.connect();
    h.transport.take(c);
    if (rng() % 8 != 0) {
      h.send(c,
             Json{{"op", "hello"}, {"id", 0}, {"version", 1}, {"job", rng() % 2 ? "j" : "keeper"}});
    }
    for (int k = 0; k < 20 && !h.transport.closed.count(c); ++k, ++inputs) {
      const std::string input = rng() % 4 == 0 ? corpus[rng() % corpus.size()]
                                               : mutate(corpus[rng() % corpus.size()], rng);
      h.service->on_data(c, input.data(), input.size());
      if (rng() % 64 == 0) {
        h.clock.advance(std::chrono::milliseconds(rng() % 20'000));
        h.service->tick();
      }
    }
    if (!h.transport.closed.count(c)) h.service->on_disconnect(c);
    h.transport.inbox.clear();
  }
  // The daemon is unharmed: the bystander's data is intact and it is still served.
  h.clock.advance(std::chrono::hours(1));
  h.service->tick();
  CHECK_FALSE(h.transport.closed.count(keeper));
  Json got = h.call(keeper, Json{{"op", "get"}, {"key", "precious"}});
  REQUIRE(got["ok"] == true);
  CHECK(got["value"].get_binary().size() == 4);
  CHECK(h.service->num_connections() == 1);
}

TEST_CASE("fuzz: 60,000 mutated TCPStore requests never break the worker store") {
  using namespace ctrun::rendezvous::tcpstore;
  std::mt19937 rng(seed() + 2);
  std::vector<std::string> corpus;
  const std::vector<Request> requests = {
      {Op::kSet, {"k"}, {"v"}, 0, 0},       {Op::kCompareSet, {"k"}, {"v", "w"}, 0, 0},
      {Op::kGet, {"k"}, {}, 0, 0},          {Op::kAdd, {"n"}, {}, 3, 0},
      {Op::kCheck, {"k", "n"}, {}, 0, 0},   {Op::kWait, {"k"}, {}, 0, 0},
      {Op::kNumKeys, {}, {}, 0, 0},         {Op::kDeleteKey, {"k"}, {}, 0, 0},
      {Op::kWatchKey, {"k"}, {}, 0, 0},     {Op::kAppend, {"k"}, {"x"}, 0, 0},
      {Op::kMultiGet, {"k"}, {}, 0, 0},     {Op::kMultiSet, {"a"}, {"b"}, 0, 0},
      {Op::kCancelWait, {}, {}, 0, 0},      {Op::kPing, {}, {}, 0, 7},
      {Op::kQueuePush, {"q"}, {"i"}, 0, 0}, {Op::kQueuePop, {"q"}, {}, 0, 0},
      {Op::kQueueLen, {"q"}, {}, 0, 0},     {Op::kListKeys, {}, {}, 0, 0},
      {Op::kBarrier, {"b"}, {}, 2, 0},
  };
  for (const auto& r : requests) {
    for (Dialect d : {Dialect::kLegacy, Dialect::kValidated}) {
      try {
        corpus.push_back((d == Dialect::kValidated ? encode_validate() : "") +
                         encode_request(d, r));
      } catch (const std::invalid_argument&) {  // not in that numbering
      }
    }
  }
  ServiceOptions options;
  options.worker_store_job = "job";
  ServiceHarness h(options);
  const ConnectionId keeper = h.connect();
  h.transport.raw.insert(keeper);
  const std::string keep =
      encode_request(Dialect::kLegacy, {Op::kSet, {"precious"}, {"data"}, 0, 0});
  h.send_raw(keeper, keep);

  int inputs = 0;
  ConnectionId next = 1000;
  while (inputs < 60'000) {
    const ConnectionId c = next++;
    h.transport.raw.insert(c);
    h.service->on_connect(c, "10.0.0.7:" + std::to_string(c));
    for (int k = 0; k < 20 && !h.transport.closed.count(c); ++k, ++inputs) {
      const std::string input = rng() % 4 == 0 ? corpus[rng() % corpus.size()]
                                               : mutate(corpus[rng() % corpus.size()], rng);
      h.service->on_data(c, input.data(), input.size());
      if (rng() % 64 == 0) {
        h.clock.advance(std::chrono::milliseconds(rng() % 20'000));
        h.service->tick();
      }
    }
    if (!h.transport.closed.count(c)) h.service->on_disconnect(c);
    h.transport.raw_bytes.clear();
  }
  // The keeper's key may have been overwritten by a fuzzed SET of the same name, but the store
  // and its connection are unharmed and still answer.
  CHECK_FALSE(h.transport.closed.count(keeper));
  h.send_raw(keeper, encode_request(Dialect::kLegacy, {Op::kCheck, {"precious"}, {}, 0, 0}));
  CHECK(h.transport.take_raw(keeper) == std::string(1, '\0'));
  CHECK(h.service->num_connections() == 1);
}

// The TCPStore wire codec: every numbering, requests in pieces, the limits.
#include <random>

#include "catch.h"
#include "rendezvous/protocol/tcpstore_wire.h"

using namespace ctrun::rendezvous;
using namespace ctrun::rendezvous::tcpstore;

namespace {

std::string u64(std::uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }
std::string str(const std::string& s) { return u64(s.size()) + s; }

// Every request the decoder gives for `bytes`, fed `slice` bytes at a time.
std::vector<Request> decode_all(Decoder& d, const std::string& bytes, std::size_t slice) {
  std::vector<Request> out;
  for (std::size_t pos = 0; pos < bytes.size(); pos += slice) {
    d.feed(bytes.data() + pos, std::min(slice, bytes.size() - pos));
    while (true) {
      auto r = d.next();
      REQUIRE(r.ok());
      if (!r.value()) break;
      out.push_back(std::move(*r.value()));
    }
  }
  return out;
}

}  // namespace

TEST_CASE("tcpstore wire: torch 1.13's numbering, as its client writes it") {
  // SET "/k" "v", then ADD "init/" 1, GETNUMKEYS, DELETE_KEY (bytes 0, 3, 6, 8); the client
  // waits for DELETE_KEY's answer, so nothing follows it.
  std::string bytes = std::string(1, '\0') + str("/k") + str("v");
  bytes += std::string(1, '\3') + str("init/") + u64(1);
  bytes += std::string(1, '\6');
  bytes += std::string(1, '\x08') + str("/k");
  for (std::size_t slice : {std::size_t{1}, std::size_t{3}, bytes.size()}) {
    Decoder d;
    auto reqs = decode_all(d, bytes, slice);
    CHECK(d.dialect() == Dialect::kLegacy);
    REQUIRE(reqs.size() == 4);
    CHECK(reqs[0].op == Op::kSet);
    CHECK(reqs[0].keys == std::vector<std::string>{"/k"});
    CHECK(reqs[0].values == std::vector<std::string>{"v"});
    CHECK(reqs[1].op == Op::kAdd);
    CHECK(reqs[1].number == 1);
    CHECK(reqs[2].op == Op::kNumKeys);
    CHECK(reqs[3].op == Op::kDeleteKey);
  }
  // Its second connection per store opens with WATCH_KEY.
  Decoder watch;
  auto reqs = decode_all(watch, std::string(1, '\7') + str("/w"), 1);
  REQUIRE(reqs.size() == 1);
  CHECK(reqs[0].op == Op::kWatchKey);
  CHECK(watch.dialect() == Dialect::kLegacy);
}

namespace {

// Bytes from a hex text ("03 0500000000000000 ..."), spaces ignored.
std::string hex(const std::string& text) {
  std::string digits;
  for (char c : text) {
    if (c != ' ') digits += c;
  }
  std::string out;
  for (std::size_t i = 0; i + 1 < digits.size(); i += 2) {
    out += static_cast<char>(std::stoi(digits.substr(i, 2), nullptr, 16));
  }
  return out;
}

std::vector<Op> ops_of(const std::string& bytes, Dialect hint = Dialect::kUndecided,
                       Dialect* told = nullptr) {
  Decoder d;
  d.set_hint(hint);
  std::vector<Op> out;
  for (const auto& r : decode_all(d, bytes, bytes.size())) out.push_back(r.op);
  if (told) *told = d.dialect();
  return out;
}

}  // namespace

// Each release's bytes, written from its TCPStore.cpp / TCPStoreBackend.hpp (QueryType in
// order): what its client sends, and what ctrun must read them as.
TEST_CASE("tcpstore wire: the numbering of each torch release, pinned by its client's bytes") {
  const std::string add_init = "03 0500000000000000 696e69742f 0100000000000000";  // ADD init/ 1
  const std::string set_k = "00 0200000000000000 2f6b 0100000000000000 76";        // SET /k v
  Dialect told = Dialect::kUndecided;

  SECTION("1.13 and 2.0: WATCH_KEY 7 (its own connection), DELETE_KEY 8") {
    CHECK(ops_of(hex(add_init + set_k + "06" + "08 0200000000000000 2f6b"), Dialect::kUndecided,
                 &told) == std::vector<Op>{Op::kAdd, Op::kSet, Op::kNumKeys, Op::kDeleteKey});
    CHECK(told == Dialect::kLegacy);
    CHECK(ops_of(hex("07 0200000000000000 2f6b"), Dialect::kUndecided, &told) ==
          std::vector<Op>{Op::kWatchKey});
    CHECK(told == Dialect::kLegacy);
  }
  SECTION("2.1: DELETE_KEY 7, APPEND 8, MULTI_GET 9, MULTI_SET 10, CANCEL_WAIT 11") {
    const std::string rest =
        "07 0200000000000000 2f6b"                                       // DELETE_KEY /k
        "08 0200000000000000 2f61 0100000000000000 78"                   // APPEND /a x
        "09 0100000000000000 0200000000000000 2f61"                      // MULTI_GET [/a]
        "0a 0100000000000000 0200000000000000 2f62 0100000000000000 79"  // MULTI_SET /b y
        "0b";                                                            // CANCEL_WAIT
    CHECK(ops_of(hex(add_init + set_k + rest), Dialect::kUndecided, &told) ==
          std::vector<Op>{Op::kAdd, Op::kSet, Op::kDeleteKey, Op::kAppend, Op::kMultiGet,
                          Op::kMultiSet, Op::kCancelWait});
    CHECK(told == Dialect::kTorch21);
    // APPEND first among what tells them apart: a value follows its key.
    CHECK(ops_of(hex(add_init + "08 0200000000000000 2f61 0100000000000000 78"),
                 Dialect::kUndecided, &told) == std::vector<Op>{Op::kAdd, Op::kAppend});
    CHECK(told == Dialect::kTorch21);
    CHECK(ops_of(hex("09 0100000000000000 0200000000000000 2f61"), Dialect::kUndecided, &told) ==
          std::vector<Op>{Op::kMultiGet});
    CHECK(told == Dialect::kTorch21);
    // Told by another connection of the job: a 2.1 DELETE_KEY opening a connection.
    CHECK(ops_of(hex("07 0200000000000000 2f6b"), Dialect::kTorch21, &told) ==
          std::vector<Op>{Op::kDeleteKey});
  }
  SECTION("commands 0..6 are alike in both: the connection stays untold") {
    CHECK(ops_of(hex(add_init + set_k + "06"), Dialect::kUndecided, &told) ==
          std::vector<Op>{Op::kAdd, Op::kSet, Op::kNumKeys});
    CHECK(told == Dialect::kUnvalidated);
  }
  SECTION("2.2 to 2.4: VALIDATE, then SET 1 ... GETNUMKEYS 7, DELETE_KEY 8 ... CANCEL_WAIT 12") {
    CHECK(ops_of(hex("00 cef7853c"
                     "01 0200000000000000 2f6b 0100000000000000 76"
                     "07"
                     "08 0200000000000000 2f6b"
                     "0c"),
                 Dialect::kUndecided, &told) ==
          std::vector<Op>{Op::kSet, Op::kNumKeys, Op::kDeleteKey, Op::kCancelWait});
    CHECK(told == Dialect::kValidated);
  }
  SECTION("2.5 on: VALIDATE and PING 13 with the pid; queues 14-16, LIST_KEYS 17, BARRIER 18") {
    CHECK(ops_of(hex("00 cef7853c"
                     "0d 39300000"
                     "0e 0200000000000000 2f71 0100000000000000 7a"
                     "0f 0200000000000000 2f71"
                     "10 0200000000000000 2f71"
                     "11"
                     "12 0200000000000000 2f62 0400000000000000"),
                 Dialect::kUndecided,
                 &told) == std::vector<Op>{Op::kPing, Op::kQueuePush, Op::kQueuePop, Op::kQueueLen,
                                           Op::kListKeys, Op::kBarrier});
    CHECK(told == Dialect::kValidated);
  }
}

TEST_CASE("tcpstore wire: torch 2.x opens with VALIDATE and numbers from SET = 1") {
  std::string bytes = encode_validate();
  REQUIRE(bytes == std::string("\0\xCE\xF7\x85\x3C", 5));
  bytes += std::string(1, '\x0d') + std::string("\x2a\0\0\0", 4);  // PING 42
  bytes += std::string(1, '\1') + str("k") + str("v");             // SET
  bytes += std::string(1, '\x0a') + u64(2) + str("a") + str("b");  // MULTI_GET
  bytes += std::string(1, '\x0b') + u64(1) + str("a") + str("1");  // MULTI_SET
  bytes += std::string(1, '\x0c');                                 // CANCEL_WAIT
  bytes += std::string(1, '\x12') + str("bar") + u64(4);           // BARRIER
  for (std::size_t slice : {std::size_t{1}, std::size_t{7}, bytes.size()}) {
    Decoder d;
    auto reqs = decode_all(d, bytes, slice);
    CHECK(d.dialect() == Dialect::kValidated);
    REQUIRE(reqs.size() == 6);
    CHECK(reqs[0].op == Op::kPing);
    CHECK(reqs[0].nonce == 42);
    CHECK(reqs[1].op == Op::kSet);
    CHECK(reqs[2].op == Op::kMultiGet);
    CHECK(reqs[2].keys == std::vector<std::string>{"a", "b"});
    CHECK(reqs[3].op == Op::kMultiSet);
    CHECK(reqs[3].values == std::vector<std::string>{"1"});
    CHECK(reqs[4].op == Op::kCancelWait);
    CHECK(reqs[5].op == Op::kBarrier);
    CHECK(reqs[5].number == 4);
  }
}

TEST_CASE("tcpstore wire: encode_request and the decoder agree on every op of every numbering") {
  const std::vector<Request> requests = {
      {Op::kSet, {"k"}, {"v"}, 0, 0},     {Op::kCompareSet, {"k"}, {"old", "new"}, 0, 0},
      {Op::kGet, {"k"}, {}, 0, 0},        {Op::kAdd, {"n"}, {}, -7, 0},
      {Op::kCheck, {"a", "b"}, {}, 0, 0}, {Op::kWait, {"a"}, {}, 0, 0},
      {Op::kNumKeys, {}, {}, 0, 0},       {Op::kDeleteKey, {"k"}, {}, 0, 0},
  };
  for (Dialect dialect : {Dialect::kLegacy, Dialect::kTorch21, Dialect::kValidated}) {
    std::string bytes = dialect == Dialect::kValidated ? encode_validate() : "";
    for (const auto& r : requests) bytes += encode_request(dialect, r);
    Decoder d;
    auto got = decode_all(d, bytes, 5);
    REQUIRE(got.size() == requests.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].op == requests[i].op);
      CHECK(got[i].keys == requests[i].keys);
      CHECK(got[i].values == requests[i].values);
      CHECK(got[i].number == requests[i].number);
    }
  }
  CHECK_THROWS(encode_request(Dialect::kValidated, Request{Op::kWatchKey, {"k"}, {}, 0, 0}));
  CHECK_THROWS(encode_request(Dialect::kLegacy, Request{Op::kPing, {}, {}, 0, 1}));
}

TEST_CASE("tcpstore wire: a 1.13 SET whose key is long is not taken for VALIDATE") {
  // Byte 0 then a key length whose low four bytes are not the magic: a legacy SET.
  const std::string bytes = std::string(1, '\0') + str(std::string(300, 'x')) + str("v");
  Decoder d;
  auto reqs = decode_all(d, bytes, 2);
  REQUIRE(reqs.size() == 1);
  CHECK(d.dialect() == Dialect::kUnvalidated);
  CHECK(reqs[0].keys[0].size() == 300);
}

TEST_CASE("tcpstore wire: limits and unknown commands fail the stream before it buffers") {
  Limits limits;
  limits.max_key_bytes = 16;
  limits.max_value_bytes = 32;
  limits.max_keys = 4;
  limits.max_request_bytes = 1024;
  auto error_of = [&](const std::string& bytes) -> std::string {
    Decoder d(limits);
    d.feed(bytes.data(), bytes.size());
    auto r = d.next();
    if (r.ok()) return r.value() ? "decoded" : "incomplete";
    CHECK(d.failed());
    CHECK_FALSE(d.next().ok());  // stays failed
    return r.error().message;
  };
  CHECK_THAT(error_of(std::string(1, '\0') + str(std::string(17, 'k'))),
             Catch::Matchers::ContainsSubstring("key of 17 bytes exceeds the limit of 16"));
  // The value's length alone is enough to refuse it: its bytes never need to arrive.
  CHECK_THAT(error_of(std::string(1, '\0') + str("k") + u64(1u << 30)),
             Catch::Matchers::ContainsSubstring("value of 1073741824 bytes"));
  CHECK_THAT(error_of(std::string(1, '\4') + u64(5)),
             Catch::Matchers::ContainsSubstring("5 keys, over the limit"));
  CHECK_THAT(error_of(std::string(1, '\x0c')),
             Catch::Matchers::ContainsSubstring("unknown command 12 (torch<=2.1 numbering)"));
  {  // Once a connection is 1.13's (WATCH_KEY first), 2.1's commands are unknown on it.
    Decoder d(limits);
    const std::string bytes = std::string(1, '\x07') + str("w") + std::string(1, '\x09');
    d.feed(bytes.data(), bytes.size());
    REQUIRE(d.next().ok());
    auto r = d.next();
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message,
               Catch::Matchers::ContainsSubstring("unknown command 9 (torch<=2.0 numbering)"));
  }
  CHECK_THAT(error_of(encode_validate() + std::string(1, '\x13')),
             Catch::Matchers::ContainsSubstring("unknown command 19"));
  CHECK_THAT(error_of(encode_validate() + std::string("\0\1\2\3\4", 5)),
             Catch::Matchers::ContainsSubstring("wrong magic"));
  // Many values of allowed size that add up past the request limit.
  std::string multi = encode_validate() + std::string(1, '\x0b') + u64(4);
  for (int i = 0; i < 4; ++i) multi += str("k") + u64(32) + std::string(32, 'v');
  limits.max_request_bytes = 100;
  CHECK_THAT(error_of(multi), Catch::Matchers::ContainsSubstring("exceeds the limit of 100"));
  CHECK(error_of(std::string(1, '\0') + str("k")) == "incomplete");
}

TEST_CASE("tcpstore wire: random bytes never crash the decoder (seeded)") {
  std::mt19937 rng(20261124u);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int round = 0; round < 2000; ++round) {
    std::string bytes(1 + rng() % 64, '\0');
    for (auto& b : bytes) b = static_cast<char>(byte(rng) % (round % 2 ? 20 : 256));
    if (round % 3 == 0) bytes = encode_validate() + bytes;
    Limits limits;
    limits.max_request_bytes = 4096;
    Decoder d(limits);
    d.feed(bytes.data(), bytes.size());
    for (int i = 0; i < 100; ++i) {
      auto r = d.next();
      if (!r.ok() || !r.value()) break;
      for (const auto& k : r.value()->keys) CHECK(k.size() <= limits.max_key_bytes);
    }
  }
}

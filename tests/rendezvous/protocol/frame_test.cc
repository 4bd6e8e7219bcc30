#include "ctrun/rendezvous/frame.h"

#include "catch.h"

#include "rendezvous/protocol/message.h"

using namespace ctrun::rendezvous;

namespace {

std::string raw_frame(const std::string& body) {
  const auto n = static_cast<std::uint32_t>(body.size());
  std::string out{static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                  static_cast<char>(n)};
  return out + body;
}

}  // namespace

TEST_CASE("frame: round trip with binary values") {
  Json body{{"op", "set"}, {"id", 7}, {"value", to_binary(std::string("\0\xff\x01", 3))}};
  std::string bytes = encode_frame(body);
  CHECK(bytes.size() > kFrameHeaderBytes);
  FrameDecoder decoder;
  decoder.feed(bytes.data(), bytes.size());
  auto frame = decoder.next();
  REQUIRE(frame);
  REQUIRE(frame.value());
  CHECK(*frame.value() == body);
  CHECK(get_bytes(*frame.value(), "value").value() == std::string("\0\xff\x01", 3));
  CHECK_FALSE(decoder.mid_frame());
}

TEST_CASE("frame: bytes arriving one at a time, several frames in one feed") {
  std::string stream;
  for (int i = 0; i < 3; ++i) append_frame(stream, Json{{"id", i}});
  FrameDecoder slow;
  std::vector<Json> got;
  for (char c : stream) {
    slow.feed(&c, 1);
    auto f = slow.next();
    REQUIRE(f);
    if (f.value()) got.push_back(*f.value());
  }
  REQUIRE(got.size() == 3);
  CHECK(got[2]["id"] == 2);

  FrameDecoder fast;
  fast.feed(stream.data(), stream.size());
  int n = 0;
  while (true) {
    auto f = fast.next();
    REQUIRE(f);
    if (!f.value()) break;
    ++n;
  }
  CHECK(n == 3);
}

TEST_CASE("frame: a partial frame is reported as mid-frame") {
  std::string bytes = encode_frame(Json{{"id", 1}});
  FrameDecoder decoder;
  decoder.feed(bytes.data(), 2);
  CHECK(decoder.mid_frame());
  auto f = decoder.next();
  REQUIRE(f);
  CHECK_FALSE(f.value());
}

TEST_CASE("frame: oversized, empty, garbage and non-map frames fail clearly") {
  SECTION("over the limit, known from the header alone") {
    FrameDecoder decoder(1024);
    std::string header{0, 0, 4, 1};  // 1025 bytes announced
    decoder.feed(header.data(), header.size());
    auto f = decoder.next();
    REQUIRE_FALSE(f);
    CHECK(f.error().code == ErrorCode::kFrameTooLarge);
    CHECK(f.error().message.find("1025") != std::string::npos);
    CHECK(decoder.failed());
    CHECK_FALSE(decoder.next());  // stays failed
  }
  SECTION("zero length") {
    FrameDecoder decoder;
    std::string header(4, '\0');
    decoder.feed(header.data(), header.size());
    auto f = decoder.next();
    REQUIRE_FALSE(f);
    CHECK(f.error().code == ErrorCode::kBadFrame);
  }
  SECTION("not MessagePack") {
    FrameDecoder decoder;
    std::string bytes = raw_frame("\xc1\xc1\xc1");  // 0xc1 is never used in MessagePack
    decoder.feed(bytes.data(), bytes.size());
    auto f = decoder.next();
    REQUIRE_FALSE(f);
    CHECK(f.error().code == ErrorCode::kBadFrame);
  }
  SECTION("truncated MessagePack inside a whole frame") {
    FrameDecoder decoder;
    std::string bytes = raw_frame("\x82\xa2id");  // map of 2, one key, no values
    decoder.feed(bytes.data(), bytes.size());
    CHECK_FALSE(decoder.next());
  }
  SECTION("trailing bytes after the body") {
    FrameDecoder decoder;
    std::vector<std::uint8_t> packed = Json::to_msgpack(Json{{"id", 1}});
    std::string body(packed.begin(), packed.end());
    std::string bytes = raw_frame(body + "x");
    decoder.feed(bytes.data(), bytes.size());
    CHECK_FALSE(decoder.next());
  }
  SECTION("a number, not a map") {
    FrameDecoder decoder;
    std::string bytes = raw_frame("\x05");
    decoder.feed(bytes.data(), bytes.size());
    auto f = decoder.next();
    REQUIRE_FALSE(f);
    CHECK(f.error().message.find("not a map") != std::string::npos);
  }
}

TEST_CASE("frame: deep nesting is refused instead of overflowing the stack") {
  // A map holding a one-element array nested a million times: 1 MB that would recurse 1M deep.
  std::string body = "\x81\xa1x" + std::string(1'000'000, '\x91') + "\x00";
  std::string bytes = raw_frame(body);
  FrameDecoder decoder(4u << 20);
  decoder.feed(bytes.data(), bytes.size());
  auto f = decoder.next();
  REQUIRE_FALSE(f);
  CHECK(f.error().message.find("nests deeper") != std::string::npos);
}

TEST_CASE("frame: a frame with too many elements is refused") {
  // An array header announcing 2M nil elements, all present.
  std::string body =
      "\x81\xa1x\xdd" + std::string("\x00\x20\x00\x00", 4) + std::string(2u << 20, '\xc0');
  std::string bytes = raw_frame(body);
  FrameDecoder decoder(4u << 20);
  decoder.feed(bytes.data(), bytes.size());
  CHECK_FALSE(decoder.next());
}

TEST_CASE("message: typed field access names the field") {
  Json m{{"s", "x"}, {"n", 5}, {"neg", -2}, {"list", {"a", "b"}}, {"bad", {1, "b"}}};
  CHECK(get_string(m, "s").value() == "x");
  CHECK(get_int(m, "n").value() == 5);
  CHECK(get_int(m, "neg").value() == -2);
  CHECK(get_string_list(m, "list").value().size() == 2);
  auto missing = get_string(m, "nope");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message == "field 'nope' missing or not a string");
  CHECK_FALSE(get_int(m, "s"));
  CHECK_FALSE(get_string_list(m, "bad"));
  CHECK(get_int_or(m, "absent", 9).value() == 9);
  CHECK_FALSE(get_int_or(m, "s", 9));
  Json huge{{"n", std::uint64_t{1} << 63}};
  CHECK_FALSE(get_int(huge, "n"));
}

TEST_CASE("message: error frames round trip") {
  Json e = error_response(3, Error{ErrorCode::kTimeout, "too slow"});
  auto back = response_payload(e);
  REQUIRE_FALSE(back);
  CHECK(back.error().code == ErrorCode::kTimeout);
  CHECK(back.error().message == "too slow");
  CHECK(response_payload(Json{{"id", 1}, {"ok", true}}).ok());
  for (auto code : {ErrorCode::kBadFrame, ErrorCode::kLimit, ErrorCode::kConflict}) {
    CHECK(error_code_from_name(error_code_name(code)) == code);
  }
}

#include "rendezvous/etcd/state_value.h"

#include <boost/beast/zlib/deflate_stream.hpp>
#include <boost/beast/zlib/inflate_stream.hpp>

#include <charconv>

namespace ctrun::rendezvous::etcd {

namespace zlib = boost::beast::zlib;

namespace {

constexpr std::string_view kMarker = "deflate:";
// etcd keeps values under 1.5 MiB; a state inflates about tenfold. More is not a state.
constexpr std::size_t kMaxInflated = std::size_t{256} << 20;

Error not_a_state(const std::string& key, const std::string& why) {
  return Error{ErrorCode::kBadRequest,
               "etcd key " + key + " does not hold a ctrun rendezvous (" + why + ")"};
}

// The inflated text of `deflated`, which must be `size` bytes. The size is checked rather than
// the stream's end: Beast's inflate does not always report the end of a complete stream.
Result<std::string> inflate(const std::string& key, std::string_view deflated, std::size_t size) {
  zlib::inflate_stream inflate;
  std::string text(size + 1, '\0');  // a byte more: a longer stream shows as one
  zlib::z_params z;
  z.next_in = deflated.data();
  z.avail_in = deflated.size();
  z.next_out = text.data();
  z.avail_out = text.size();
  boost::system::error_code ec;
  while (z.avail_in > 0 && z.avail_out > 0) {
    const std::size_t before = z.total_in + z.total_out;
    inflate.write(z, zlib::Flush::sync, ec);
    if (ec == zlib::error::end_of_stream) break;
    if (ec && ec != zlib::error::need_buffers) return not_a_state(key, ec.message());
    if (z.total_in + z.total_out == before) break;  // no progress: the stream is cut short
  }
  if (z.total_out != size) {
    return not_a_state(key, "deflated value inflates to " + std::to_string(z.total_out) +
                                " bytes, not " + std::to_string(size));
  }
  text.resize(size);
  return text;
}

}  // namespace

std::string encode_state_value(const Json& saved) {
  const std::string text = saved.dump(-1, ' ', false, Json::error_handler_t::replace);
  zlib::deflate_stream deflate;  // zlib's level 6 and 32 KiB window; raw, no zlib header
  const std::string head = std::string(kMarker) + std::to_string(text.size()) + ":";
  std::string out = head;
  out.resize(head.size() + deflate.upper_bound(text.size()));
  zlib::z_params z;
  z.next_in = text.data();
  z.avail_in = text.size();
  z.next_out = out.data() + head.size();
  z.avail_out = out.size() - head.size();
  boost::system::error_code ec;
  deflate.write(z, zlib::Flush::finish, ec);
  // upper_bound() is enough for one finishing call: anything else is a bug of ours.
  if (ec != zlib::error::end_of_stream) {
    throw std::logic_error("deflate of the rendezvous state failed: " + ec.message());
  }
  out.resize(head.size() + z.total_out);
  return out;
}

Result<Json> decode_state_value(const std::string& key, const std::string& value) {
  std::string text;
  const std::string* json = &value;
  if (value.compare(0, kMarker.size(), kMarker) == 0) {
    // "deflate:<size>:<raw deflate>"
    const char* begin = value.data() + kMarker.size();
    const char* end = value.data() + value.size();
    std::size_t size = 0;
    auto [colon, parsed] = std::from_chars(begin, end, size);
    if (parsed != std::errc() || colon == end || *colon != ':' || size > kMaxInflated) {
      return not_a_state(key, "no size after deflate:");
    }
    auto inflated =
        inflate(key, std::string_view(colon + 1, static_cast<std::size_t>(end - colon - 1)), size);
    if (!inflated) return inflated.error();
    text = std::move(inflated).value();
    json = &text;
  }
  Json parsed = Json::parse(*json, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return not_a_state(key, "not its JSON");
  return parsed;
}

}  // namespace ctrun::rendezvous::etcd

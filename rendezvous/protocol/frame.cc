#include "ctrun/rendezvous/frame.h"

#include <string_view>
#include <vector>

namespace ctrun::rendezvous {
namespace {

// nlohmann's MessagePack reader recurses once per nesting level, so a frame of nested one-element
// arrays would overflow the stack. This SAX handler builds the same DOM but stops the parse past
// a nesting depth and an element count, which also bounds the memory one frame can expand into.
class BoundedDomBuilder {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr std::size_t kMaxElements = 1u << 20;

  explicit BoundedDomBuilder(Json& result) : dom_(result, /*allow_exceptions=*/false) {}

  bool null() { return count() && dom_.null(); }
  bool boolean(bool v) { return count() && dom_.boolean(v); }
  bool number_integer(Json::number_integer_t v) { return count() && dom_.number_integer(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return count() && dom_.number_unsigned(v); }
  bool number_float(Json::number_float_t v, const std::string& s) {
    return count() && dom_.number_float(v, s);
  }
  bool string(std::string& v) { return count() && dom_.string(v); }
  bool binary(Json::binary_t& v) { return count() && dom_.binary(v); }
  bool start_object(std::size_t n) { return enter() && dom_.start_object(n); }
  bool key(std::string& k) { return count() && dom_.key(k); }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return enter() && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t pos, const std::string& token,
                   const nlohmann::detail::exception& e) {
    return dom_.parse_error(pos, token, e);
  }
  bool exceeded() const { return exceeded_; }

 private:
  bool count() {
    if (++elements_ > kMaxElements) exceeded_ = true;
    return !exceeded_;
  }
  bool enter() {
    if (++depth_ > kMaxDepth) exceeded_ = true;
    return count();
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  int depth_ = 0;
  std::size_t elements_ = 0;
  bool exceeded_ = false;
};

}  // namespace

void append_frame(std::string& out, const Json& body) {
  std::vector<std::uint8_t> packed = Json::to_msgpack(body);
  const auto n = static_cast<std::uint32_t>(packed.size());
  const char header[kFrameHeaderBytes] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                                          static_cast<char>(n >> 8), static_cast<char>(n)};
  out.append(header, kFrameHeaderBytes);
  out.append(reinterpret_cast<const char*>(packed.data()), packed.size());
}

std::string encode_frame(const Json& body) {
  std::string out;
  append_frame(out, body);
  return out;
}

FrameDecoder::FrameDecoder(std::size_t max_frame_bytes) : max_frame_bytes_(max_frame_bytes) {}

void FrameDecoder::feed(const char* data, std::size_t size) {
  // Drop consumed bytes before growing, so a long-lived stream does not accumulate them.
  if (offset_ > 0 && (offset_ == buffer_.size() || offset_ > (64u << 10))) {
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
  buffer_.append(data, size);
}

Result<std::optional<Json>> FrameDecoder::next() {
  if (failed_) return Error{ErrorCode::kBadFrame, "stream already failed"};
  const std::size_t available = buffer_.size() - offset_;
  if (available < kFrameHeaderBytes) return std::optional<Json>{};
  const auto* p = reinterpret_cast<const unsigned char*>(buffer_.data() + offset_);
  const std::size_t length = (std::size_t{p[0]} << 24) | (std::size_t{p[1]} << 16) |
                             (std::size_t{p[2]} << 8) | std::size_t{p[3]};
  if (length == 0) {
    failed_ = true;
    return Error{ErrorCode::kBadFrame, "empty frame (length 0)"};
  }
  if (length > max_frame_bytes_) {
    failed_ = true;
    return Error{ErrorCode::kFrameTooLarge, "frame of " + std::to_string(length) +
                                                " bytes exceeds the limit of " +
                                                std::to_string(max_frame_bytes_)};
  }
  if (available < kFrameHeaderBytes + length) return std::optional<Json>{};
  const auto* body = p + kFrameHeaderBytes;
  offset_ += kFrameHeaderBytes + length;
  Json decoded;
  BoundedDomBuilder builder(decoded);
  const bool parsed = Json::sax_parse(body, body + length, &builder, Json::input_format_t::msgpack,
                                      /*strict=*/true);
  if (builder.exceeded()) {
    failed_ = true;
    return Error{ErrorCode::kBadFrame, "frame body nests deeper than " +
                                           std::to_string(BoundedDomBuilder::kMaxDepth) +
                                           " levels or holds too many elements"};
  }
  if (!parsed || decoded.is_discarded()) {
    failed_ = true;
    return Error{ErrorCode::kBadFrame, "frame body is not valid MessagePack"};
  }
  if (!decoded.is_object()) {
    failed_ = true;
    return Error{ErrorCode::kBadFrame, "frame body is not a map"};
  }
  return std::optional<Json>{std::move(decoded)};
}

}  // namespace ctrun::rendezvous

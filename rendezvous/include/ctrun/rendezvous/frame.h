// Wire framing: a 4-byte big-endian length, then a MessagePack body that decodes to a map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"

namespace ctrun::rendezvous {

inline constexpr std::uint32_t kProtocolVersion = 1;
inline constexpr std::size_t kFrameHeaderBytes = 4;
inline constexpr std::size_t kDefaultMaxFrameBytes = 16u << 20;
// What ctrun's clients send first, before the daemon's challenge: a listener that also serves
// torch's TCPStore wire (ServiceOptions::worker_store_job) tells its two kinds of client apart by
// it. No TCPStore command starts with 'C', and no frame can (its length would be over 1 GiB).
inline constexpr std::string_view kClientPreamble = "CTRN";

// Appends one encoded frame to `out` (so a writer can coalesce several frames in one write).
void append_frame(std::string& out, const Json& body);
std::string encode_frame(const Json& body);

// Incremental decoder: feed bytes as they arrive, take whole frames out. After an error it stays
// failed (the stream cannot be resynchronised), and the caller closes the connection.
class FrameDecoder {
 public:
  explicit FrameDecoder(std::size_t max_frame_bytes = kDefaultMaxFrameBytes);

  void feed(const char* data, std::size_t size);
  // The next whole frame, nullopt when more bytes are needed, or the reason the stream is bad.
  Result<std::optional<Json>> next();
  // True while a frame has started but not fully arrived (used for the slow-sender deadline).
  bool mid_frame() const { return buffer_.size() > offset_; }
  bool failed() const { return failed_; }

 private:
  std::size_t max_frame_bytes_;
  std::string buffer_;
  std::size_t offset_ = 0;
  bool failed_ = false;
};

}  // namespace ctrun::rendezvous

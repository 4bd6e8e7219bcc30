#include "rendezvous/core/state_log.h"

#include <boost/crc.hpp>

namespace ctrun::rendezvous {

namespace {

constexpr std::size_t kRecordHeaderBytes = 8;
// A record is one job's key or rendezvous; anything larger than a frame could not have been
// sent to the daemon, so a length beyond this is damage, not data.
constexpr std::uint32_t kMaxRecordBytes = 1u << 30;

std::uint32_t crc32(std::string_view bytes) {
  boost::crc_32_type crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint32_t get_u32(std::string_view in) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

}  // namespace

std::string encode_state_record(const Json& record) {
  std::string body;
  Json::to_msgpack(record, body);
  std::string out;
  out.reserve(kRecordHeaderBytes + body.size());
  put_u32(out, static_cast<std::uint32_t>(body.size()));
  put_u32(out, crc32(body));
  out += body;
  return out;
}

DecodedRecords decode_state_records(std::string_view bytes) {
  DecodedRecords out;
  std::size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < kRecordHeaderBytes) {
      out.damage = "a record header cut short";
      break;
    }
    const std::uint32_t size = get_u32(bytes.substr(at));
    const std::uint32_t crc = get_u32(bytes.substr(at + 4));
    if (size > kMaxRecordBytes || bytes.size() - at - kRecordHeaderBytes < size) {
      out.damage = "a record of " + std::to_string(size) + " bytes cut short";
      break;
    }
    const std::string_view body = bytes.substr(at + kRecordHeaderBytes, size);
    if (crc32(body) != crc) {
      out.damage = "a record whose checksum does not match";
      break;
    }
    Json record = Json::from_msgpack(body, /*strict=*/true, /*allow_exceptions=*/false);
    if (record.is_discarded() || !record.is_object()) {
      out.damage = "a record that is not a MessagePack map";
      break;
    }
    out.records.push_back(std::move(record));
    at += kRecordHeaderBytes + size;
    out.good_bytes = at;
  }
  return out;
}

}  // namespace ctrun::rendezvous

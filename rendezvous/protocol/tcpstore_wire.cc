#include "rendezvous/protocol/tcpstore_wire.h"

#include <array>
#include <cstring>
#include <stdexcept>

namespace ctrun::rendezvous::tcpstore {
namespace {

// Command bytes of each numbering, indexed by the byte; VALIDATE has no Op.
constexpr std::array<Op, 9> kLegacyOps = {
    Op::kSet,  Op::kCompareSet, Op::kGet,      Op::kAdd,       Op::kCheck,
    Op::kWait, Op::kNumKeys,    Op::kWatchKey, Op::kDeleteKey,
};
constexpr std::array<Op, 12> kTorch21Ops = {
    Op::kSet,     Op::kCompareSet, Op::kGet,    Op::kAdd,      Op::kCheck,    Op::kWait,
    Op::kNumKeys, Op::kDeleteKey,  Op::kAppend, Op::kMultiGet, Op::kMultiSet, Op::kCancelWait,
};
constexpr std::uint8_t kValidate = 0;
constexpr std::array<Op, 18> kValidatedOps = {
    // from byte 1
    Op::kSet,     Op::kCompareSet, Op::kGet,      Op::kAdd,      Op::kCheck,    Op::kWait,
    Op::kNumKeys, Op::kDeleteKey,  Op::kAppend,   Op::kMultiGet, Op::kMultiSet, Op::kCancelWait,
    Op::kPing,    Op::kQueuePush,  Op::kQueuePop, Op::kQueueLen, Op::kListKeys, Op::kBarrier,
};

// Reads fields from the unconsumed bytes. A read past the end sets `short_by` (how many more
// bytes are needed at least) and every later read fails too, so a parse simply runs on and the
// caller looks at the outcome once.
class Reader {
 public:
  Reader(const char* data, std::size_t size) : data_(data), size_(size) {}

  bool has(std::size_t n) {
    if (short_ || error_) return false;
    if (size_ - pos_ >= n) return true;
    short_ = true;
    need_ = pos_ + n;
    return false;
  }
  template <typename T>
  T raw() {
    T v{};
    if (!has(sizeof(T))) return v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // A length-prefixed string of at most `max` bytes.
  std::string bytes(std::size_t max, const char* what) {
    const auto n = raw<std::uint64_t>();
    if (short_ || error_) return {};
    if (n > max) {
      error_ = std::string(what) + " of " + std::to_string(n) + " bytes exceeds the limit of " +
               std::to_string(max);
      return {};
    }
    if (!has(static_cast<std::size_t>(n))) return {};
    std::string s(data_ + pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  std::size_t count(std::size_t max) {
    const auto n = raw<std::uint64_t>();
    if (short_ || error_) return 0;
    if (n > max) {
      error_ =
          "request names " + std::to_string(n) + " keys, over the limit of " + std::to_string(max);
      return 0;
    }
    return static_cast<std::size_t>(n);
  }
  bool ok() const { return !short_ && !error_; }
  bool is_short() const { return short_; }
  const std::optional<std::string>& error() const { return error_; }
  std::size_t pos() const { return pos_; }
  std::size_t need() const { return need_; }

 private:
  const char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::size_t need_ = 0;
  bool short_ = false;
  std::optional<std::string> error_;
};

// What follows each command's byte: one definition for the decoder and the encoder.
enum class Layout {
  kNothing,
  kKey,            // key
  kKeyValue,       // key, value
  kKeyTwoValues,   // key, value, value
  kKeyNumber,      // key, int64
  kKeys,           // uint64 count, that many keys
  kKeyValuePairs,  // uint64 count, that many (key, value)
  kNonce,          // uint32
};

Layout layout_of(Op op) {
  switch (op) {
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      return Layout::kKeyValue;
    case Op::kCompareSet:
      return Layout::kKeyTwoValues;
    case Op::kGet:
    case Op::kWatchKey:
    case Op::kDeleteKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      return Layout::kKey;
    case Op::kAdd:
    case Op::kBarrier:
      return Layout::kKeyNumber;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      return Layout::kKeys;
    case Op::kMultiSet:
      return Layout::kKeyValuePairs;
    case Op::kPing:
      return Layout::kNonce;
    case Op::kNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
      return Layout::kNothing;
  }
  return Layout::kNothing;
}

// The fields after the command byte; the reader tells whether they were complete and good.
void read_fields(Reader& r, Request& req, const Limits& limits) {
  auto key = [&] { req.keys.push_back(r.bytes(limits.max_key_bytes, "key")); };
  auto value = [&] { req.values.push_back(r.bytes(limits.max_value_bytes, "value")); };
  switch (layout_of(req.op)) {
    case Layout::kKeyTwoValues:
      key();
      value();
      value();
      break;
    case Layout::kKeyValue:
      key();
      value();
      break;
    case Layout::kKey:
      key();
      break;
    case Layout::kKeyNumber:
      key();
      req.number = r.raw<std::int64_t>();
      break;
    case Layout::kKeys: {
      const std::size_t n = r.count(limits.max_keys);
      for (std::size_t i = 0; i < n && r.ok(); ++i) key();
      break;
    }
    case Layout::kKeyValuePairs: {
      const std::size_t n = r.count(limits.max_keys);
      for (std::size_t i = 0; i < n && r.ok(); ++i) {
        key();
        value();
      }
      break;
    }
    case Layout::kNonce:
      req.nonce = r.raw<std::uint32_t>();
      break;
    case Layout::kNothing:
      break;
  }
}

}  // namespace

std::string_view dialect_name(Dialect d) {
  switch (d) {
    case Dialect::kUndecided:
      return "undecided";
    case Dialect::kUnvalidated:
      return "torch<=2.1";
    case Dialect::kLegacy:
      return "torch<=2.0";
    case Dialect::kTorch21:
      return "torch 2.1";
    case Dialect::kValidated:
      return "torch>=2.2";
  }
  return "?";
}

std::string_view op_name(Op op) {
  static constexpr std::array<std::string_view, 19> kNames = {
      "set",        "compare_set", "get",       "add",       "check",     "wait",        "num_keys",
      "watch_key",  "delete_key",  "append",    "multi_get", "multi_set", "cancel_wait", "ping",
      "queue_push", "queue_pop",   "queue_len", "list_keys", "barrier",
  };
  return kNames.at(static_cast<std::size_t>(op));
}

Decoder::Decoder(Limits limits) : limits_(limits) {}

void Decoder::feed(const char* data, std::size_t size) {
  if (failed_) return;
  if (offset_ > 0 && offset_ >= buffer_.size() / 2) {  // keep the buffer from creeping
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
  buffer_.append(data, size);
}

Result<std::optional<Request>> Decoder::fail(std::string message) {
  failed_ = true;
  buffer_.clear();
  offset_ = 0;
  return Error{ErrorCode::kBadFrame, std::move(message)};
}

std::optional<Dialect> Decoder::tell_unvalidated(std::uint8_t command, const char* data,
                                                 std::size_t available) {
  if (hint_ == Dialect::kLegacy || hint_ == Dialect::kTorch21) return hint_;
  if (command <= 6) return Dialect::kUnvalidated;
  // 1.13 and 2.0 send WATCH_KEY only on a connection of its own, as its first request; 2.1's
  // byte 7 is DELETE_KEY, which comes after others.
  if (command == 7) return any_request_ ? Dialect::kTorch21 : Dialect::kLegacy;
  if (command != 8) return Dialect::kTorch21;  // 9..11: APPEND's neighbours exist only in 2.1
  // 8 is 1.13's DELETE_KEY (a key, then the client waits for the answer) or 2.1's APPEND (a key
  // and a value, written at once): bytes after the key tell.
  Reader r(data + 1, available - 1);
  r.bytes(limits_.max_key_bytes, "key");
  if (r.is_short()) {
    need_ = 1 + r.need();
    return std::nullopt;
  }
  if (r.error()) return Dialect::kLegacy;  // the parse below says what is wrong
  return 1 + r.pos() < available ? Dialect::kTorch21 : Dialect::kLegacy;
}

Result<std::optional<Request>> Decoder::next() {
  if (failed_) return Error{ErrorCode::kBadFrame, "stream already failed"};
  while (true) {
    const std::size_t available = buffer_.size() - offset_;
    if (available == 0 || available < need_) return std::optional<Request>{};
    const char* data = buffer_.data() + offset_;
    const auto command = static_cast<std::uint8_t>(data[0]);

    // The dialect: a validated client opens with VALIDATE and the magic; anything else is a
    // client of torch <= 2.0, whose SET is byte 0 (followed by at least 8 bytes, so waiting for
    // the 4 that would hold the magic cannot stall it).
    if (command == kValidate &&
        (dialect_ == Dialect::kUndecided || dialect_ == Dialect::kValidated)) {
      Reader r(data + 1, available - 1);
      const auto magic = r.raw<std::uint32_t>();
      if (r.is_short()) {
        need_ = 1 + r.need();
        return std::optional<Request>{};
      }
      if (magic == kValidationMagic) {
        dialect_ = Dialect::kValidated;
        offset_ += 5;
        need_ = 0;
        continue;
      }
      if (dialect_ == Dialect::kValidated) return fail("VALIDATE with a wrong magic number");
    }
    if (dialect_ == Dialect::kUndecided) dialect_ = Dialect::kUnvalidated;
    if (dialect_ == Dialect::kUnvalidated) {
      if (command >= kTorch21Ops.size()) {
        return fail("unknown command " + std::to_string(command) + " (torch<=2.1 numbering)");
      }
      const auto told = tell_unvalidated(command, data, available);
      if (!told) return std::optional<Request>{};
      dialect_ = *told;
    }

    Request req;
    if (dialect_ == Dialect::kLegacy || dialect_ == Dialect::kUnvalidated) {
      if (command >= kLegacyOps.size()) {
        return fail("unknown command " + std::to_string(command) + " (torch<=2.0 numbering)");
      }
      req.op = kLegacyOps[command];
    } else if (dialect_ == Dialect::kTorch21) {
      if (command >= kTorch21Ops.size()) {
        return fail("unknown command " + std::to_string(command) + " (torch 2.1 numbering)");
      }
      req.op = kTorch21Ops[command];
    } else {
      if (command == kValidate || command > kValidatedOps.size()) {
        return fail("unknown command " + std::to_string(command) + " (torch>=2.2 numbering)");
      }
      req.op = kValidatedOps[command - 1];
    }
    Reader r(data + 1, available - 1);
    read_fields(r, req, limits_);
    if (r.error()) return fail(std::string(op_name(req.op)) + ": " + *r.error());
    const std::size_t size = 1 + (r.is_short() ? r.need() : r.pos());
    if (size > limits_.max_request_bytes) {
      return fail(std::string(op_name(req.op)) + " request of " +
                  (r.is_short() ? "at least " : "") + std::to_string(size) +
                  " bytes exceeds the limit of " + std::to_string(limits_.max_request_bytes));
    }
    if (r.is_short()) {
      need_ = size;
      return std::optional<Request>{};
    }
    offset_ += 1 + r.pos();
    need_ = 0;
    any_request_ = true;
    return std::optional<Request>{std::move(req)};
  }
}

void append_u8(std::string& out, std::uint8_t v) { out.push_back(static_cast<char>(v)); }

void append_u32(std::string& out, std::uint32_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void append_i64(std::string& out, std::int64_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

void append_bytes(std::string& out, std::string_view bytes) {
  const std::uint64_t n = bytes.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out.append(bytes.data(), bytes.size());
}

std::string encode_validate() {
  std::string out;
  append_u8(out, kValidate);
  append_u32(out, kValidationMagic);
  return out;
}

std::string encode_request(Dialect dialect, const Request& req) {
  std::string out;
  const bool validated = dialect == Dialect::kValidated;
  const bool torch21 = dialect == Dialect::kTorch21;
  const Op* ops = validated ? kValidatedOps.data()
                  : torch21 ? kTorch21Ops.data()
                            : kLegacyOps.data();
  const std::size_t n = validated ? kValidatedOps.size()
                        : torch21 ? kTorch21Ops.size()
                                  : kLegacyOps.size();
  std::size_t index = 0;
  while (index < n && ops[index] != req.op) ++index;
  if (index == n) {
    throw std::invalid_argument(std::string(op_name(req.op)) + " does not exist in the " +
                                std::string(dialect_name(dialect)) + " numbering");
  }
  append_u8(out, static_cast<std::uint8_t>(validated ? index + 1 : index));
  switch (layout_of(req.op)) {
    case Layout::kKeyTwoValues:
      append_bytes(out, req.keys.at(0));
      append_bytes(out, req.values.at(0));
      append_bytes(out, req.values.at(1));
      break;
    case Layout::kKeyValue:
      append_bytes(out, req.keys.at(0));
      append_bytes(out, req.values.at(0));
      break;
    case Layout::kKey:
      append_bytes(out, req.keys.at(0));
      break;
    case Layout::kKeyNumber:
      append_bytes(out, req.keys.at(0));
      append_i64(out, req.number);
      break;
    case Layout::kKeys:
      append_i64(out, static_cast<std::int64_t>(req.keys.size()));
      for (const auto& k : req.keys) append_bytes(out, k);
      break;
    case Layout::kKeyValuePairs:
      append_i64(out, static_cast<std::int64_t>(req.keys.size()));
      for (std::size_t i = 0; i < req.keys.size(); ++i) {
        append_bytes(out, req.keys[i]);
        append_bytes(out, req.values.at(i));
      }
      break;
    case Layout::kNonce:
      append_u32(out, req.nonce);
      break;
    case Layout::kNothing:
      break;
  }
  return out;
}

}  // namespace ctrun::rendezvous::tcpstore

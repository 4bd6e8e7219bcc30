// c10d TCPStore's wire protocol, the part of the rendezvous that lets torch workers use a job's
// store as if it were torch's own TCPStore (docs/protocol.md, "The TCPStore wire"). Pure: bytes
// in, requests out, answers as bytes; no sockets, no store. Part of the wire code: it knows no
// store, job or state machine.
//
// A request is one command byte and its fields; strings and values are a uint64 length (host
// order, as torch writes it) and the bytes; the add delta is a raw int64. Three numberings exist
// (read from TCPStore.cpp and TCPStoreBackend.hpp of each release): torch 1.13 and 2.0 start at
// SET = 0 and have WATCH_KEY = 7, DELETE_KEY = 8; torch 2.1 dropped WATCH_KEY, so DELETE_KEY = 7,
// and added APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT (8..11); torch 2.2 on opens every connection
// with VALIDATE = 0 and a magic number, which shifts every command up by one (PING from 2.5,
// queues from 2.7 or 2.8, LIST_KEYS and BARRIER later). A connection's first bytes tell VALIDATE
// from the rest; 1.13/2.0 from 2.1 by the first command where they differ (docs/protocol.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ctrun/rendezvous/error.h"

namespace ctrun::rendezvous::tcpstore {

inline constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;

enum class Dialect {
  kUndecided,
  kUnvalidated,  // no VALIDATE: torch <= 2.1, which one not told yet (SET..GETNUMKEYS agree)
  kLegacy,       // torch 1.13 and 2.0: SET = 0 ... WATCH_KEY = 7, DELETE_KEY = 8
  kTorch21,      // torch 2.1: SET = 0 ... DELETE_KEY = 7, APPEND = 8 ... CANCEL_WAIT = 11
  kValidated,    // torch >= 2.2: VALIDATE = 0, SET = 1 ... BARRIER = 18
};
std::string_view dialect_name(Dialect d);

// What a client asks, in one numbering of our own. VALIDATE is taken by the decoder.
enum class Op {
  kSet,         // keys[0], values[0]; no answer
  kCompareSet,  // keys[0], values = {expected, desired}; answers bytes
  kGet,         // keys[0]; answers bytes
  kAdd,         // keys[0], number = delta; answers int64
  kCheck,       // keys; answers u8 ready / not ready
  kWait,        // keys; answers u8 stop-waiting once every key exists
  kNumKeys,     // answers int64
  kWatchKey,    // keys[0]; answers u8 callback-registered (torch <= 2.0)
  kDeleteKey,   // keys[0]; answers int64 (keys deleted)
  kAppend,      // keys[0], values[0]; no answer
  kMultiGet,    // keys; answers one bytes per key
  kMultiSet,    // keys, values; no answer
  kCancelWait,  // answers u8 wait-canceled
  kPing,        // nonce; answers the nonce
  kQueuePush,   // keys[0], values[0]; no answer
  kQueuePop,    // keys[0]; answers int64 length before the pop, then bytes when it was > 0
  kQueueLen,    // keys[0]; answers int64
  kListKeys,    // answers int64 count, then each key
  kBarrier,     // keys[0], number = world size; answers u8 stop-waiting when all arrived
};
std::string_view op_name(Op op);

struct Request {
  Op op = Op::kSet;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  std::int64_t number = 0;
  std::uint32_t nonce = 0;
};

// Bounds on what one request may make the server buffer (the same as torch's libuv server, and a
// total so that many large values cannot add up without limit).
struct Limits {
  std::size_t max_key_bytes = 8u << 10;
  std::size_t max_value_bytes = 8u << 20;
  std::size_t max_keys = 128u << 10;  // per check, wait, multi_get, multi_set
  std::size_t max_request_bytes = 64u << 20;
};

// Incremental: feed bytes as they arrive, take whole requests out. A request is checked against
// the limits as soon as its sizes are known, before its bytes are buffered. After an error it
// stays failed; the caller closes the connection (as torch's server does: the protocol has no
// error answer).
class Decoder {
 public:
  explicit Decoder(Limits limits = {});

  void feed(const char* data, std::size_t size);
  Result<std::optional<Request>> next();
  Dialect dialect() const { return dialect_; }
  // What other connections of the job told (kLegacy or kTorch21): every rank of a job runs one
  // torch, so a connection whose own commands cannot tell yet is read in that numbering.
  void set_hint(Dialect hint) { hint_ = hint; }
  bool failed() const { return failed_; }
  bool mid_request() const { return buffer_.size() > offset_; }

 private:
  Result<std::optional<Request>> fail(std::string message);
  // For a connection without VALIDATE whose numbering is not told yet: which one `command` (at
  // `data`, `available` bytes) tells, kUnvalidated when it is the same in both, or nullopt while
  // more bytes are needed to tell.
  std::optional<Dialect> tell_unvalidated(std::uint8_t command, const char* data,
                                          std::size_t available);

  Limits limits_;
  Dialect dialect_ = Dialect::kUndecided;
  Dialect hint_ = Dialect::kUndecided;
  bool any_request_ = false;  // a request was decoded on this connection
  std::string buffer_;
  std::size_t offset_ = 0;
  std::size_t need_ = 0;  // bytes from offset_ the last incomplete parse showed are needed
  bool failed_ = false;
};

// Answers, appended to what a connection will send.
inline constexpr std::uint8_t kCheckReady = 0;
inline constexpr std::uint8_t kCheckNotReady = 1;
inline constexpr std::uint8_t kStopWaiting = 0;
inline constexpr std::uint8_t kWaitCanceled = 1;
inline constexpr std::uint8_t kCallbackRegistered = 3;

void append_u8(std::string& out, std::uint8_t v);
void append_u32(std::string& out, std::uint32_t v);
void append_i64(std::string& out, std::int64_t v);
void append_bytes(std::string& out, std::string_view bytes);  // uint64 length + bytes

// Requests as a client writes them (tests, the fuzzer's seeds, the bootstrap benchmark).
std::string encode_request(Dialect dialect, const Request& request);
std::string encode_validate();

}  // namespace ctrun::rendezvous::tcpstore

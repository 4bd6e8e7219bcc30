// The value of a job's "rendezvous" key: Rendezvous::save() JSON, deflated. Every agent's watch
// brings the whole value at every write (about 220 bytes a node: 1,024 agents hearing a
// 225 KB state is 230 MB a write, through etcd's JSON gateway in base64); deflated it is about
// a tenth. Plain JSON (what ctrun wrote before) still reads.
#pragma once

#include <string>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/json.h"

namespace ctrun::rendezvous::etcd {

// "deflate:<size>:" and the raw deflate (RFC 1951) of the JSON text, <size> bytes; a worker's
// failure text that is not UTF-8 is replaced, never a throw.
std::string encode_state_value(const Json& saved);
// The JSON, from either form; an error for anything else (a key written by another program, a
// damaged value), naming `key`.
Result<Json> decode_state_value(const std::string& key, const std::string& value);

}  // namespace ctrun::rendezvous::etcd

// The JSON value the parts pass around (requests, state records, events, status): nlohmann's,
// with binary values (frames carry them as MessagePack bin). A header of its own, so the pure
// parts (the state machine, the event log) need not include the wire code to name it.
#pragma once

#include <nlohmann/json.hpp>

namespace ctrun::rendezvous {

using Json = nlohmann::json;

}  // namespace ctrun::rendezvous

// Where a worker finds the rendezvous daemon's store for its round: what the agent passes in
// CTRUN_STORE_ADDR, CTRUN_STORE_PORT, CTRUN_STORE_PREFIX and CTRUN_RDZV_TOKEN (docs/env.md), and
// what the worker runtime reads back.
#pragma once

#include <optional>
#include <string>

namespace ctrun::rendezvous {

struct StoreAddress {
  std::string host;
  int port = 0;
  std::string prefix;  // the round's key prefix, "rdzv/<generation>/<round>/"
  std::optional<std::string> token;
};

}  // namespace ctrun::rendezvous

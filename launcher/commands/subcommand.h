// What ctrun's subcommands (`ctrun status`, `ctrun fault`) share: the rendezvous they talk to
// (--rdzv_endpoint, --rdzv_id, --rdzv_backend, --token_file, --timeout) and the parse of their
// arguments with CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include "ctrun/rendezvous/error.h"
#include "ctrun/rendezvous/store_address.h"
#include "ctrun/rendezvous/store_client.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ctrun::launcher {

struct RendezvousTarget {
  std::string endpoint;
  std::string id;
  std::string backend = "c10d";
  std::string token_file;
  std::string rdzv_conf;  // TLS (protocol, cacert, cert, key) and etcd's user
  double timeout = 5;     // seconds to keep trying to reach the rendezvous
  bool etcd() const { return backend == "etcd" || backend == "etcd-v2"; }
};

// Adds the target's options to `app`; `id_help` says what --rdzv_id means to this command.
void add_rendezvous_options(CLI::App& app, RendezvousTarget& target, const std::string& id_help);

// Parses `args` (argv after the subcommand's name) and checks the target's backend and endpoint.
// Returns the exit code when the command ends here (0 after printing --help; 2 after a bad
// flag, reported through `fail`), or nothing to go on.
// How to get in (TLS; etcd's user) from --rdzv_endpoint and --rdzv_conf, as the agents do.
rendezvous::Result<rendezvous::StoreAccess> target_store_access(const RendezvousTarget& target);

// The job's store (ctrund's or etcd's) as its agents reach it. Errors: kConnection when the
// rendezvous cannot be reached, anything else for bad input (an endpoint, a token file).
rendezvous::Result<std::unique_ptr<rendezvous::StoreClient>> connect_job_store(
    const RendezvousTarget& target,
    const std::function<std::optional<std::string>(const std::string&)>& env);

std::optional<int> parse_subcommand(
    CLI::App& app, const std::vector<std::string>& args, const RendezvousTarget& target,
    const std::function<int(const std::string& message, int code)>& fail);

}  // namespace ctrun::launcher

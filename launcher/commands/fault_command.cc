#include "launcher/commands/fault_command.h"

#include <chrono>
#include <cstdio>

#include "ctrun/rendezvous/round.h"
#include "ctrun/rendezvous/store_client.h"
#include "launcher/commands/subcommand.h"
#include "launcher/faults/fault_plan.h"
#include "rendezvous/protocol/fault_keys.h"

namespace ctrun::launcher {

namespace rdzv = ctrun::rendezvous;

namespace {

int fail(const std::string& message, int code) {
  std::fprintf(stderr, "ctrun fault: error: %s\n", message.c_str());
  return code;
}

rdzv::Duration seconds(double s) {
  return std::chrono::duration_cast<rdzv::Duration>(std::chrono::duration<double>(s));
}

}  // namespace

int run_fault_command(const std::vector<std::string>& args, const EnvLookup& env) {
  CLI::App app{"ctrun fault: inject one fault into a running job started with --faults",
               "ctrun fault"};
  RendezvousTarget target;
  target.endpoint = env("PET_RDZV_ENDPOINT").value_or("");
  target.id = env("PET_RDZV_ID").value_or("");
  target.backend = env("PET_RDZV_BACKEND").value_or("c10d");
  std::string fault;
  double wait = 10;
  add_rendezvous_options(app, target, "the job");
  app.add_option("--wait", wait,
                 "seconds to wait for an agent to inject it (10; 0: only ask, do not wait)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("fault", fault,
                 "KIND:key=value,... as in an inline --faults plan (kill:rank=3, "
                 "hang:rank=1,duration=20, exception:rank=0,at_step=500); at once without a time")
      ->required();
  if (auto code = parse_subcommand(app, args, target, fail)) return *code;
  const std::string& id = target.id;
  if (id.empty()) return fail("--rdzv_id is required: the job to inject into", 2);
  auto request = parse_fault_request(fault);
  if (!request) return fail(request.error().message.substr(std::string("ctrun fault: ").size()), 2);

  auto store = connect_job_store(target, env);
  if (!store) {
    return fail(store.error().message, store.error().code == rdzv::ErrorCode::kConnection ? 1 : 2);
  }
  auto number = store.value()->add(rdzv::kFaultRequestsKey, 1);
  rdzv::Status asked =
      number ? store.value()->set(rdzv::kFaultRequestPrefix + std::to_string(number.value()),
                                  request.value().dump())
             : rdzv::Status(number.error());
  if (!asked) return fail("cannot ask job '" + id + "': " + asked.error().message, 1);
  std::printf("ctrun fault: asked job '%s' for fault %lld: %s\n", id.c_str(),
              static_cast<long long>(number.value()), request.value().dump().c_str());
  std::fflush(stdout);
  if (wait <= 0) return 0;

  const std::string done =
      rdzv::kFaultRequestPrefix + std::to_string(number.value()) + rdzv::kFaultRequestDoneSuffix;
  auto injected = store.value()->get(done, seconds(wait));
  if (!injected) {
    if (injected.error().code != rdzv::ErrorCode::kTimeout) {
      return fail(injected.error().message, 1);
    }
    return fail("not injected within " + std::to_string(static_cast<int>(wait)) +
                    " s: no agent of job '" + id +
                    "' took it (agents take faults only when started with --faults; a fault at "
                    "a step waits for that step; --wait=0 does not wait)",
                1);
  }
  const rdzv::Json record = rdzv::Json::parse(injected.value(), nullptr, false);
  if (record.is_object()) {
    std::printf("ctrun fault: injected on node %s (%s): %s, pid %d\n",
                record.value("node", std::string()).c_str(),
                record.value("host", std::string()).c_str(),
                record.value("what", std::string()).c_str(), record.value("pid", 0));
  } else {
    std::printf("ctrun fault: injected: %s\n", injected.value().c_str());
  }
  return 0;
}

}  // namespace ctrun::launcher

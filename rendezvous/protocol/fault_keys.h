// The keys of ctrun's fault injection in a job's store (docs/faults.md): what `ctrun fault`,
// the agents that inject faults, ctrund (an injected store latency, the metrics of injected
// faults) and `ctrun status` say to each other. Private to the tree: no user program needs them.
#pragma once

namespace ctrun::rendezvous {

// Faults (docs/faults.md). `ctrun fault` adds one to kFaultRequestsKey and sets the fault, as a
// plan's JSON holds one, under kFaultRequestPrefix + N; the agents of a job started with --faults
// wait for the next N. The agent that injects a fault, planned or asked for, adds one to
// kFaultsInjectedKey and sets what it did ({"time", "node", "rank", "what", ...}) under
// kFaultInjectedPrefix + M, and for an asked-for fault under kFaultRequestPrefix + N +
// kFaultRequestDoneSuffix, which `ctrun fault` waits for.
inline constexpr const char* kFaultRequestsKey = "ctrun/fault_requests";
inline constexpr const char* kFaultRequestPrefix = "ctrun/fault_request/";
inline constexpr const char* kFaultRequestDoneSuffix = "/injected";
inline constexpr const char* kFaultsInjectedKey = "ctrun/faults_injected";
inline constexpr const char* kFaultInjectedPrefix = "ctrun/fault_injected/";
// An injected store latency: {"ms": M, "seconds": S} set here makes ctrund (or an agent's
// embedded daemon) answer the job's requests M ms late for S seconds from then.
inline constexpr const char* kStoreLatencyKey = "ctrun/fault/store_latency";
// Each node's address under its round's store prefix + kFaultHostKey + its group rank, set as
// its workers start in a job with --faults: an agent cutting its link to a peer looks it up.
inline constexpr const char* kFaultHostKey = "ctrun/fault/host/";

}  // namespace ctrun::rendezvous

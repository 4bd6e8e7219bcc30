#include "rendezvous/service/service.h"

#include <cstdio>
#include <cstdlib>
#include <unordered_set>
#include <utility>

#include "rendezvous/protocol/auth.h"
#include "rendezvous/protocol/message.h"
#include "rendezvous/protocol/step_keys.h"
#include "rendezvous/protocol/step_verdict.h"
#include "rendezvous/service/service_impl.h"

namespace ctrun::rendezvous {

const std::unordered_map<std::string_view, Service::Impl::Handler> Service::Impl::kHandlers = {
    {"hello", &Service::Impl::op_hello},
    {"ping", &Service::Impl::op_ping},
    {"set", &Service::Impl::op_set},
    {"get", &Service::Impl::op_get},
    {"add", &Service::Impl::op_add},
    {"compare_set", &Service::Impl::op_compare_set},
    {"check", &Service::Impl::op_check},
    {"wait", &Service::Impl::op_wait},
    {"delete", &Service::Impl::op_delete},
    {"num_keys", &Service::Impl::op_num_keys},
    {"multi_get", &Service::Impl::op_multi_get},
    {"multi_set", &Service::Impl::op_multi_set},
    {"join", &Service::Impl::op_join},
    {"leave", &Service::Impl::op_leave},
    {"keep_alive", &Service::Impl::op_keep_alive},
    {"report", &Service::Impl::op_report},
    {"close", &Service::Impl::op_close},
    {"resume", &Service::Impl::op_resume},
    {"status", &Service::Impl::op_status},
    {"jobs", &Service::Impl::op_jobs},
    {"quorum", &Service::Impl::op_quorum},
    {"quorum_heartbeat", &Service::Impl::op_quorum_heartbeat},
};

namespace {

// Well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(const std::string& s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int extra = 0;
    unsigned cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xe0) == 0xc0) {
      extra = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;  // truncated sequence
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3f);
    }
    static constexpr unsigned kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += extra + 1;
  }
  return true;
}

// Keys quoted in error messages are cut short, so an error frame stays small.
std::string shorten(const std::string& key) {
  return key.size() <= 128 ? key : key.substr(0, 128) + "...";
}

// The restarts a job has used, as its agents count them in its store.
std::int64_t restarts_used(const KeyValueStore& store) {
  const std::string* used = store.find(kRestartsKey);
  return used ? counter_value(*used, 0) : 0;
}

// The faults its agents injected (ctrun --faults), as they count them in its store.
std::int64_t faults_injected(const KeyValueStore& store) {
  const std::string* injected = store.find(kFaultsInjectedKey);
  return injected ? counter_value(*injected, 0) : 0;
}

// The job's straggler verdict, as its node 0's agent last set it (step_keys.h), for the
// metrics: a value that is not one counts as none.
void read_stragglers(const KeyValueStore& store, JobMetrics& j) {
  const std::string* text = store.find(kStragglersKey);
  if (!text) return;
  const auto verdict = step_verdict_from_json(Json::parse(*text, nullptr, false));
  if (!verdict) return;
  j.steps_judged = true;
  j.median_step_seconds = verdict.value().median;
  for (int rank : verdict.value().stragglers) {
    j.stragglers.emplace_back(rank, verdict.value().slowdown(rank));
    j.straggler_holds.emplace_back(rank, verdict.value().holds(rank));
  }
}

}  // namespace

Service::Impl::Impl(ServiceOptions options, const Clock& clock, Transport& transport)
    : options_(std::move(options)),
      clock_(clock),
      transport_(transport),
      answers_(transport),
      limits_(options_, clock, [this](const std::string& line) { log(line); }),
      journal_(options_.state, options_.compact_bytes,
               [this](const std::string& line) { log(line); }) {
  if (!options_.random) options_.random = random_bytes;
}

void Service::Impl::log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

bool Service::Impl::admit_ctrund(ConnectionId id, const std::string& peer) {
  auto refusal = limits_.admit_ctrund(peer);
  if (!refusal) return true;
  transport_.send(id, encode_frame(error_response(0, Error{ErrorCode::kLimit, *refusal})));
  transport_.close(id);
  ++counters_.connections_refused;
  return false;
}

Service::Impl::Job& Service::Impl::job_named(const std::string& name) {
  auto [it, created] = jobs_.try_emplace(name, nullptr);
  if (created) it->second = std::make_unique<Job>(name, options_.store_limits);
  return *it->second;
}

std::size_t Service::Impl::job_ranks(Job& job) {
  const Rendezvous* r = job.rendezvous.get();
  if (!r) return 0;
  if (job.ranks_of != r || job.ranks_revision != r->revision()) {
    job.ranks_of = r;
    job.ranks_revision = r->revision();
    job.ranks = r->ranks();
  }
  // Each rank holds at least one descriptor here (torch 1.13's clients two).
  constexpr std::size_t kHeadroom = 256;
  if (options_.open_file_limit > 0 && job.ranks > job.ranks_warned &&
      job.ranks + kHeadroom > options_.open_file_limit) {
    job.ranks_warned = job.ranks;
    log("job '" + job.name + "' has " + std::to_string(job.ranks) +
        " ranks: its worker store needs at least " + std::to_string(job.ranks + kHeadroom) +
        " open files (twice the ranks for torch 1.13's clients), and the open-file limit is " +
        std::to_string(options_.open_file_limit) +
        ": raise it (ulimit -n within the hard limit, LimitNOFILE= for the ctrund service)");
  }
  return job.ranks;
}

std::size_t Service::Impl::worker_store_limit(Job* job) {
  return limits_.worker_store_limit([this, job] { return job ? job_ranks(*job) : 0; });
}

bool Service::Impl::admit_tcpstore(Job& job, const std::string& peer) {
  if (limits_.admit_tcpstore(
          job.name, job.tcpstore_connections, [this, &job] { return job_ranks(job); }, peer)) {
    return true;
  }
  ++counters_.connections_refused;
  return false;
}

void Service::Impl::on_connect(ConnectionId id, std::string peer,
                               std::optional<std::string> worker_store_job) {
  if (worker_store_job) {  // a job's own worker-store port: torch's clients only
    if (!admit_tcpstore(job_named(*worker_store_job), peer)) return transport_.close(id);
  } else if (options_.worker_store_job) {
    // The first bytes tell ctrun's clients from torch's; until then only the total is bounded,
    // with room for every rank of the job (torch 1.13's second connection stays silent).
    auto job = jobs_.find(*options_.worker_store_job);
    const std::size_t limit = options_.max_connections +
                              worker_store_limit(job == jobs_.end() ? nullptr : job->second.get());
    if (connections_.size() >= limit) {
      limits_.refused(peer + " refused: " + std::to_string(connections_.size()) +
                      " connections already open, the most this rendezvous and its worker store "
                      "take (--rdzv_conf max_connections, worker_store_max_connections)");
      ++counters_.connections_refused;
      return transport_.close(id);  // no bytes: either protocol's client reads a closed socket
    }
  } else if (!admit_ctrund(id, peer)) {
    return;
  }
  ++counters_.connections_accepted;
  auto c = std::make_unique<Connection>();
  c->id = id;
  c->peer = std::move(peer);
  c->decoder = FrameDecoder(options_.max_frame_bytes);
  c->opened_at = clock_.now();
  c->nonce = options_.random(kNonceBytes);
  // A listener that serves the worker store too waits for the first bytes to know the
  // protocol; a job's own worker-store port speaks only TCPStore; otherwise the daemon speaks
  // first, and a preamble from the client is simply passed over.
  if (worker_store_job) {
    c->opened = true;
    start_tcpstore(*c, *worker_store_job);
  } else if (!options_.worker_store_job) {
    c->wire = Wire::kCtrund;
    send_challenge(*c);
  }
  connections_.emplace(id, std::move(c));
}

void Service::Impl::send_challenge(const Connection& c) {
  transport_.send(c.id, encode_frame(Json{{"event", "challenge"},
                                          {"version", kProtocolVersion},
                                          {"nonce", to_binary(c.nonce)},
                                          {"auth", options_.token.has_value()}}));
}

void Service::Impl::on_data(ConnectionId id, const char* data, std::size_t size) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& first = *it->second;
  std::string_view bytes(data, size);
  std::string joined;  // the opening bytes held back so far, and these
  if (!first.opened) {
    joined = first.opening;
    joined.append(data, size);
    const std::size_t n = std::min(joined.size(), kClientPreamble.size());
    if (joined.compare(0, n, kClientPreamble.data(), n) == 0) {
      if (joined.size() < kClientPreamble.size()) {  // the preamble may come in pieces
        first.opening = std::move(joined);
        return;
      }
      bytes = std::string_view(joined).substr(kClientPreamble.size());
      first.opened = true;
      first.opening.clear();
      if (first.wire == Wire::kUndecided) {
        if (!admit_ctrund(id, first.peer)) return drop(id, "refused");
        first.wire = Wire::kCtrund;
        send_challenge(first);
      }
    } else {
      bytes = joined;
      first.opened = true;
      first.opening.clear();
      if (first.wire == Wire::kUndecided) {
        if (!admit_tcpstore(job_named(*options_.worker_store_job), first.peer)) {
          transport_.close(id);
          return drop(id, "refused");
        }
        start_tcpstore(first, *options_.worker_store_job);
      }
    }
  }
  if (first.wire == Wire::kTcpStore) return on_tcpstore_data(first, bytes.data(), bytes.size());
  first.decoder.feed(bytes.data(), bytes.size());
  while (true) {
    it = connections_.find(id);  // a handler may have closed it
    if (it == connections_.end()) return;
    Connection& c = *it->second;
    auto frame = c.decoder.next();
    if (!frame) return reject(c, 0, frame.error());
    if (!frame.value()) break;
    handle_frame(c, std::move(*frame.value()));
  }
  Connection& c = *it->second;
  if (!c.decoder.mid_frame()) {
    c.mid_frame_since.reset();
  } else if (!c.mid_frame_since) {
    c.mid_frame_since = clock_.now();
  }
}

void Service::Impl::on_disconnect(ConnectionId id) {
  if (connections_.count(id)) drop(id, "connection closed by peer");
}

void Service::Impl::drop(ConnectionId id, const std::string& why) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  std::unique_ptr<Connection> c = std::move(it->second);
  connections_.erase(it);
  answers_.forget(id);  // held answers go with the connection
  if (c->wire == Wire::kCtrund) {
    limits_.ctrund_closed(c->peer);
  }
  if (!c->job.empty()) {  // past hello, or a TCPStore connection
    Job& job = *jobs_.at(c->job);
    if (c->wire == Wire::kTcpStore) {
      end_tcpstore(*c, /*keep_watches=*/false);
      --job.tcpstore_connections;
      if (--job.tcpstore_prefixes[c->key_prefix] == 0 && !shutting_down_) drop_stale_rounds(job);
    }
    for (auto w : c->waiters) job.store.cancel(w);
    if (!c->replicas.empty() && !shutting_down_) drop_replicas(job, *c);
    if (--job.connections == 0) job.idle_since = clock_.now();
    auto bound = c->node.empty() ? job.node_connections.end() : job.node_connections.find(c->node);
    if (bound != job.node_connections.end() && bound->second == id) {
      job.node_connections.erase(bound);
      if (job.rendezvous && !shutting_down_) {
        deliver(job, job.rendezvous->remove_node(c->node, why));
      }
    }
  }
}

void Service::Impl::reply(const Connection& c, std::uint64_t id, Json body) {
  body["id"] = id;
  body["ok"] = true;
  std::string frame = encode_frame(body);
  if (frame.size() - kFrameHeaderBytes > options_.max_frame_bytes) {
    // The client could not accept it (e.g. a multi_get of many large values): say so instead.
    return fail(
        c, id,
        Error{ErrorCode::kLimit, "answer of " + std::to_string(frame.size() - kFrameHeaderBytes) +
                                     " bytes exceeds the frame limit of " +
                                     std::to_string(options_.max_frame_bytes)});
  }
  send_to(c.id, std::move(frame));
}

void Service::Impl::fail(const Connection& c, std::uint64_t id, const Error& e) {
  send_to(c.id, encode_frame(error_response(id, e)));
}

void Service::Impl::send_to(ConnectionId id, std::string bytes) {
  const TimePoint now = clock_.now();
  answers_.send(id, std::move(bytes), now, [this, id, now]() -> Duration {
    auto c = connections_.find(id);
    if (c == connections_.end() || c->second->job.empty()) return Duration::zero();
    auto job = jobs_.find(c->second->job);
    if (job == jobs_.end() || now >= job->second->answer_delay_until) return Duration::zero();
    return job->second->answer_delay;
  });
}

void Service::Impl::start_store_latency(Job& job, const std::string& value) {
  const Json spec = Json::parse(value, nullptr, /*allow_exceptions=*/false);
  const double ms = spec.is_object() ? spec.value("ms", 0.0) : 0.0;
  const double seconds = spec.is_object() ? spec.value("seconds", 0.0) : 0.0;
  if (!(ms > 0 && ms <= 600000 && seconds > 0 && seconds <= 86400)) {
    log("job '" + job.name + "': ignored " + kStoreLatencyKey + " '" + value.substr(0, 64) +
        "' (expected {\"ms\": 1..600000, \"seconds\": 1..86400})");
    return;
  }
  job.answer_delay = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(ms / 1000));
  job.answer_delay_until =
      clock_.now() + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(seconds));
  answers_.slowed_until(job.answer_delay_until);
  char text[160];
  std::snprintf(text, sizeof text, "answering %ld ms late for %.3f s", std::lround(ms), seconds);
  log("job '" + job.name + "': " + text + " (an injected fault: ctrun --faults store_latency)");
}

void Service::Impl::reject(Connection& c, std::uint64_t id, const Error& e) {
  ++(e.code == ErrorCode::kAuthFailed ? counters_.auth_failures : counters_.frame_errors);
  log(c.peer + " closed: " + std::string(error_code_name(e.code)) + ": " + e.message);
  // What was held back for it goes first, then the error, at once: the connection closes now.
  answers_.send_all(c.id);
  if (c.wire != Wire::kTcpStore) {  // TCPStore's wire has no error answer
    transport_.send(c.id, encode_frame(error_response(id, e)));
  }
  const ConnectionId cid = c.id;
  drop(cid, std::string(error_code_name(e.code)));
  transport_.close(cid);
}

Service::Impl::Job& Service::Impl::job_of(Connection& c) { return *jobs_.at(c.job); }

void Service::Impl::handle_frame(Connection& c, Json frame) {
  // Any non-negative integer encoding is accepted: MessagePack libraries differ in which
  // integer format they pick for small positive numbers.
  auto id_field = frame.find("id");
  if (id_field == frame.end() || !id_field->is_number_integer() ||
      (!id_field->is_number_unsigned() && id_field->get<std::int64_t>() < 0)) {
    return reject(c, 0, Error{ErrorCode::kBadRequest, "request has no non-negative integer 'id'"});
  }
  const auto id = id_field->get<std::uint64_t>();
  auto op = frame.find("op");
  if (op == frame.end() || !op->is_string()) {
    return reject(c, id, Error{ErrorCode::kBadRequest, "request has no string 'op'"});
  }
  const auto& name = op->get_ref<const std::string&>();
  auto handler = kHandlers.find(name);
  if (handler == kHandlers.end()) {
    return reject(c, id, Error{ErrorCode::kUnknownOp, "unknown op '" + name.substr(0, 64) + "'"});
  }
  if (!c.authenticated && name != "hello") {
    return reject(c, id, Error{ErrorCode::kNotAuthenticated, "'" + name + "' before hello"});
  }
  if (c.authenticated && !c.node.empty()) {
    Job& job = job_of(c);
    if (job.rendezvous) job.rendezvous->keep_alive(c.node);
  }
  ++request_counts_[handler->first];
  (this->*handler->second)(c, id, frame);
}

// ---- handshake -------------------------------------------------------------------------------

void Service::Impl::op_hello(Connection& c, std::uint64_t id, const Json& req) {
  if (c.authenticated) return fail(c, id, Error{ErrorCode::kBadRequest, "hello was already said"});
  auto version = get_int(req, "version");
  if (!version) return reject(c, id, version.error());
  if (version.value() != kProtocolVersion) {
    return reject(
        c, id,
        Error{ErrorCode::kBadVersion, "protocol version " + std::to_string(version.value()) +
                                          " is not supported; this daemon speaks version " +
                                          std::to_string(kProtocolVersion)});
  }
  auto job = get_string(req, "job");
  if (!job) return reject(c, id, job.error());
  if (job.value().empty() || job.value().size() > options_.max_job_bytes) {
    return reject(c, id,
                  Error{ErrorCode::kBadRequest,
                        "job id must be 1.." + std::to_string(options_.max_job_bytes) + " bytes"});
  }
  // It is shown in logs, metrics labels, event logs and `ctrun status` JSON.
  if (!valid_utf8(job.value())) {
    return reject(c, id, Error{ErrorCode::kBadRequest, "job id is not valid UTF-8"});
  }
  Json body = Json::object();
  if (options_.token) {
    auto proof = get_bytes(req, "proof");
    if (!proof) {
      return reject(c, id, Error{ErrorCode::kAuthFailed, "this daemon requires a token"});
    }
    if (!constant_time_equal(proof.value(), client_proof(*options_.token, c.nonce, job.value()))) {
      return reject(c, id, Error{ErrorCode::kAuthFailed, "token proof does not match"});
    }
    if (auto client_nonce = get_bytes(req, "nonce")) {
      body["proof"] = to_binary(server_proof(*options_.token, client_nonce.value(), c.nonce));
    }
  }
  c.authenticated = true;
  c.job = job.value();
  auto [it, created] = jobs_.try_emplace(c.job, nullptr);
  if (created) it->second = std::make_unique<Job>(c.job, options_.store_limits);
  Job& joined = *it->second;
  ++joined.connections;
  body["version"] = kProtocolVersion;
  if (options_.worker_store_job == c.job) {
    body["worker_store"] = true;
  } else if (auto asked = req.find("worker_store");
             options_.worker_store_per_job && asked != req.end() && *asked == true) {
    if (joined.worker_store_port == 0) {
      auto opened = transport_.open_worker_store(c.job);
      if (opened) {
        joined.worker_store_port = opened.value();
        log("job '" + c.job + "': worker store on port " + std::to_string(opened.value()));
      } else {  // the agent's workers then host their own TCPStore, as without the option
        log("job '" + c.job + "': no worker store port: " + opened.error().message);
      }
    }
    if (joined.worker_store_port != 0) {
      body["worker_store"] = true;
      body["worker_store_port"] = joined.worker_store_port;
    }
  }
  reply(c, id, std::move(body));
}

void Service::Impl::op_ping(Connection& c, std::uint64_t id, const Json&) {
  reply(c, id, Json::object());
}

// ---- store -----------------------------------------------------------------------------------

void Service::Impl::op_set(Connection& c, std::uint64_t id, const Json& req) {
  auto key = get_string(req, "key");
  if (!key) return reject(c, id, key.error());
  auto value = get_bytes(req, "value");
  if (!value) return reject(c, id, value.error());
  // An injected store latency is read as it is set (the value moves into the store).
  const std::string latency = key.value() == kStoreLatencyKey ? value.value() : std::string();
  auto s = job_of(c).store.set(key.value(), std::move(value).value());
  if (!s) return fail(c, id, s.error());
  record_key(c.job, key.value());
  if (!latency.empty()) start_store_latency(job_of(c), latency);
  reply(c, id, Json::object());
}

void Service::Impl::op_get(Connection& c, std::uint64_t id, const Json& req) {
  wait_for_keys(c, id, req, /*with_values=*/true);
}

void Service::Impl::op_wait(Connection& c, std::uint64_t id, const Json& req) {
  wait_for_keys(c, id, req, /*with_values=*/false);
}

void Service::Impl::op_multi_get(Connection& c, std::uint64_t id, const Json& req) {
  wait_for_keys(c, id, req, /*with_values=*/true);
}

void Service::Impl::wait_for_keys(Connection& c, std::uint64_t id, const Json& req,
                                  bool with_values) {
  // get names one "key" and answers "value"; wait and multi_get name "keys".
  const bool single = req.contains("key");
  std::vector<std::string> keys;
  if (single) {
    auto key = get_string(req, "key");
    if (!key) return reject(c, id, key.error());
    keys.push_back(std::move(key).value());
  } else {
    auto list = get_string_list(req, "keys");
    if (!list) return reject(c, id, list.error());
    keys = std::move(list).value();
  }
  // timeout_ms: absent = wait as long as the connection lives, 0 = do not wait, > 0 = deadline.
  auto timeout = get_int_or(req, "timeout_ms", -1);
  if (!timeout) return reject(c, id, timeout.error());
  if (req.contains("timeout_ms") && (timeout.value() < 0 || timeout.value() > kMaxTimeoutMillis)) {
    return reject(c, id,
                  Error{ErrorCode::kBadRequest,
                        "field 'timeout_ms' is outside 0.." + std::to_string(kMaxTimeoutMillis)});
  }
  Job& job = job_of(c);
  const bool ready = job.store.check(keys);
  if (timeout.value() == 0 && !ready) {
    for (const auto& k : keys) {
      if (!job.store.find(k)) {
        return fail(c, id, Error{ErrorCode::kNotFound, "key '" + shorten(k) + "' not found"});
      }
    }
  }
  if (!ready && c.waiters.size() >= options_.max_waiters_per_connection) {
    return fail(c, id, Error{ErrorCode::kLimit, "too many waits outstanding on this connection"});
  }
  const TimePoint deadline = timeout.value() < 0
                                 ? TimePoint::max()
                                 : clock_.now() + std::chrono::milliseconds(timeout.value());
  auto slot = std::make_shared<KeyValueStore::WaiterId>(0);
  const ConnectionId cid = c.id;
  const std::string job_name = c.job;
  auto done = [this, cid, id, job_name, keys, single, with_values, slot](Status s) {
    auto it = connections_.find(cid);
    if (it == connections_.end()) return;
    Connection& conn = *it->second;
    conn.waiters.erase(*slot);
    if (!s) {
      return fail(
          conn, id,
          Error{ErrorCode::kTimeout, "timed out waiting for " + std::to_string(keys.size()) +
                                         " key(s), first '" + shorten(keys.front()) + "'"});
    }
    Json body = Json::object();
    if (with_values) {
      const KeyValueStore& store = jobs_.at(job_name)->store;
      if (single) {
        body["value"] = to_binary(*store.find(keys.front()));
      } else {
        Json values = Json::array();
        for (const auto& k : keys) values.push_back(to_binary(*store.find(k)));
        body["values"] = std::move(values);
      }
    }
    reply(conn, id, std::move(body));
  };
  *slot = job.store.wait(keys, deadline, std::move(done));
  if (*slot != 0) c.waiters.insert(*slot);
}

void Service::Impl::op_add(Connection& c, std::uint64_t id, const Json& req) {
  auto key = get_string(req, "key");
  if (!key) return reject(c, id, key.error());
  auto delta = get_int(req, "delta");
  if (!delta) return reject(c, id, delta.error());
  auto v = job_of(c).store.add(key.value(), delta.value());
  if (!v) return fail(c, id, v.error());
  if (key.value() == kRestartsKey && delta.value() > 0) counters_.restarts += delta.value();
  if (key.value() == kFaultsInjectedKey && delta.value() > 0) {
    counters_.faults_injected += delta.value();
  }
  record_key(c.job, key.value());
  reply(c, id, Json{{"value", v.value()}});
}

void Service::Impl::op_compare_set(Connection& c, std::uint64_t id, const Json& req) {
  auto key = get_string(req, "key");
  if (!key) return reject(c, id, key.error());
  auto expected = get_bytes(req, "expected");
  if (!expected) return reject(c, id, expected.error());
  auto desired = get_bytes(req, "desired");
  if (!desired) return reject(c, id, desired.error());
  auto v = job_of(c).store.compare_set(key.value(), expected.value(), std::move(desired).value());
  if (!v) return fail(c, id, v.error());
  record_key(c.job, key.value());
  reply(c, id, Json{{"value", to_binary(v.value())}});
}

void Service::Impl::op_check(Connection& c, std::uint64_t id, const Json& req) {
  auto keys = get_string_list(req, "keys");
  if (!keys) return reject(c, id, keys.error());
  reply(c, id, Json{{"ready", job_of(c).store.check(keys.value())}});
}

void Service::Impl::op_delete(Connection& c, std::uint64_t id, const Json& req) {
  auto key = get_string(req, "key");
  if (!key) return reject(c, id, key.error());
  const bool deleted = job_of(c).store.erase(key.value());
  if (deleted) record_key(c.job, key.value());
  reply(c, id, Json{{"deleted", deleted}});
}

void Service::Impl::op_num_keys(Connection& c, std::uint64_t id, const Json&) {
  reply(c, id, Json{{"count", job_of(c).store.num_keys()}});
}

void Service::Impl::op_multi_set(Connection& c, std::uint64_t id, const Json& req) {
  auto keys = get_string_list(req, "keys");
  if (!keys) return reject(c, id, keys.error());
  auto values = get_bytes_list(req, "values");
  if (!values) return reject(c, id, values.error());
  auto s = job_of(c).store.multi_set(keys.value(), std::move(values).value());
  if (!s) return fail(c, id, s.error());
  for (const auto& k : keys.value()) record_key(c.job, k);
  reply(c, id, Json::object());
}

// ---- rendezvous ------------------------------------------------------------------------------

void Service::Impl::op_join(Connection& c, std::uint64_t id, const Json& req) {
  auto request = join_request_from_json(req);
  if (!request) return reject(c, id, request.error());
  const NodeInfo& info = request.value().node;
  const RendezvousConfig& config = request.value().config;
  if (auto s = validate(config); !s) return fail(c, id, s.error());
  if (!c.node.empty() && c.node != info.node_id) {
    return fail(
        c, id,
        Error{ErrorCode::kConflict, "this connection already speaks for node '" + c.node + "'"});
  }
  if (info.node_id.size() > options_.max_job_bytes || info.host.size() > options_.max_job_bytes) {
    return reject(
        c, id,
        Error{ErrorCode::kBadRequest, "node and host must be at most " +
                                          std::to_string(options_.max_job_bytes) + " bytes"});
  }
  Job& job = job_of(c);
  // Every node of an ended job is gone: the same id starts a new job (torchrun's default run id
  // is "none", so a long-lived daemon sees the same id again and again). The new rendezvous is
  // kept only if this join is accepted, so a refused join leaves the job as it was.
  const bool replace = job.rendezvous && job.rendezvous->state() != JobState::kRunning &&
                       job.node_connections.empty();
  std::unique_ptr<Rendezvous> fresh;
  if (!job.rendezvous || replace) {
    fresh = std::make_unique<Rendezvous>(c.job, config, clock_, options_.log,
                                         job.generation + (replace ? 1 : 0));
    fresh->set_event_sink(options_.events);
  } else if (job.rendezvous->config().min_nodes != config.min_nodes ||
             job.rendezvous->config().max_nodes != config.max_nodes) {
    const auto& have = job.rendezvous->config();
    return fail(
        c, id,
        Error{ErrorCode::kConflict,
              "job '" + c.job + "' runs with nnodes " + std::to_string(have.min_nodes) + ":" +
                  std::to_string(have.max_nodes) + ", this node asked for " +
                  std::to_string(config.min_nodes) + ":" + std::to_string(config.max_nodes)});
  }
  Rendezvous& rendezvous = fresh ? *fresh : *job.rendezvous;
  auto notices = rendezvous.join(info);
  if (!notices) return fail(c, id, notices.error());  // refused: nothing changes
  if (fresh) {
    if (replace) {
      log("job '" + c.job + "': ended job replaced by a new one");
      ++job.generation;
    }
    job.rendezvous = std::move(fresh);
  }
  bind_node(c, job, info.node_id);
  if (c.join_request) {
    fail(c, *c.join_request, Error{ErrorCode::kConflict, "superseded by a newer join"});
  }
  c.join_request = id;
  deliver(job, std::move(notices).value(), /*acknowledged=*/false);
}

// A node that reconnects on a new connection takes its binding along.
void Service::Impl::bind_node(Connection& c, Job& job, const std::string& node) {
  if (auto bound = job.node_connections.find(node);
      bound != job.node_connections.end() && bound->second != c.id) {
    auto old = connections_.find(bound->second);
    if (old != connections_.end()) {
      Connection& o = *old->second;
      if (o.join_request) {
        fail(o, *o.join_request,
             Error{ErrorCode::kConflict, "superseded by a join on another connection"});
      }
      o.join_request.reset();
      o.node.clear();
    }
  }
  c.node = node;
  job.node_connections[node] = c.id;
}

// A node coming back on a new connection (its agent lost the old one, or the daemon restarted
// from --state_dir) takes up its place without asking for a new round.
void Service::Impl::op_resume(Connection& c, std::uint64_t id, const Json& req) {
  auto node = get_string(req, "node");
  if (!node) return reject(c, id, node.error());
  Job& job = job_of(c);
  if (!job.rendezvous || !job.rendezvous->has_node(node.value())) {
    return fail(c, id,
                Error{ErrorCode::kNotFound, "node '" + node.value() + "' is not in job '" + c.job +
                                                "' (it was dropped, or the daemon forgot it)"});
  }
  if (!c.node.empty() && c.node != node.value()) {
    return fail(
        c, id,
        Error{ErrorCode::kConflict, "this connection already speaks for node '" + c.node + "'"});
  }
  bind_node(c, job, node.value());
  job.rendezvous->keep_alive(node.value());
  const Rendezvous& r = *job.rendezvous;
  reply(c, id,
        Json{{"round", r.round()}, {"formed", r.formed()}, {"state", job_state_name(r.state())}});
}

void Service::Impl::deliver(Job& job, std::vector<Notice> notices, bool acknowledged) {
  // Every member of a round learns the job's restart count as the round formed: read after
  // the join, a peer's restart for a failure in this very round could already be in it (its
  // workers would then think this round a later attempt than the others' do).
  if (job.rendezvous->round_restart_count_unset()) {
    job.rendezvous->set_round_restart_count(static_cast<int>(restarts_used(job.store)));
  }
  // Before anyone hears of the change. A change nobody hears of yet (a join waiting for its
  // round, what a tick did without notices) is recorded with the next that is heard of: a join
  // storm of N agents writes the rendezvous once, not N times (a daemon restarted meanwhile does
  // not know the waiting joins, whose agents are told so at resume and join again).
  if (acknowledged || !notices.empty()) record_rendezvous(job);
  // A job whose store torch's clients use, when the round moved (a round forms or reopens only
  // with notices, so ticks without any cost nothing): a size the open-file limit cannot serve is
  // said now, before its workers start.
  if (!notices.empty() && (job.worker_store_port != 0 || options_.worker_store_job == job.name)) {
    job_ranks(job);
    drop_stale_rounds(job);  // a new round: the last one's keys go once its workers have
  }
  for (auto& n : notices) {
    if (n.kind == Notice::Kind::kRoundFormed && n.assignment.group_rank == 0) {
      ++counters_.rounds_formed;
    }
    auto bound = job.node_connections.find(n.node_id);
    if (bound == job.node_connections.end()) continue;
    auto it = connections_.find(bound->second);
    if (it == connections_.end()) continue;
    Connection& c = *it->second;
    switch (n.kind) {
      case Notice::Kind::kRoundFormed:
        // (One node at a time: a round of thousands must not build every assignment for each.)
        if (auto told = job.rendezvous->member_restart_count(n.node_id);
            told && job.rendezvous->round() == n.assignment.round) {
          n.assignment.restart_count = *told;
        } else {  // formed and reopened at once: this answer is moot, the count now will do
          n.assignment.restart_count = static_cast<int>(restarts_used(job.store));
        }
        if (c.join_request) reply(c, *c.join_request, to_json(n.assignment));
        c.join_request.reset();
        break;
      case Notice::Kind::kJoinFailed:
        if (c.join_request) fail(c, *c.join_request, n.error);
        c.join_request.reset();
        break;
      case Notice::Kind::kRoundReopened:
        send_to(c.id, encode_frame(Json{{"event", "round_reopened"},
                                        {"job", c.job},
                                        {"round", n.round},
                                        {"reason", n.reason}}));
        break;
      case Notice::Kind::kJobEnded:
        send_to(c.id, encode_frame(Json{{"event", "job_ended"},
                                        {"job", c.job},
                                        {"state", job_state_name(n.state)},
                                        {"reason", n.reason}}));
        break;
    }
  }
}

void Service::Impl::op_leave(Connection& c, std::uint64_t id, const Json&) {
  Job& job = job_of(c);
  if (c.node.empty() || !job.rendezvous) {
    return fail(c, id, Error{ErrorCode::kConflict, "this connection has not joined"});
  }
  const std::string node = c.node;
  if (c.join_request)
    fail(c, *c.join_request, Error{ErrorCode::kClosed, "left before the round formed"});
  c.join_request.reset();
  c.node.clear();
  job.node_connections.erase(node);
  deliver(job, job.rendezvous->remove_node(node, "left"));
  reply(c, id, Json::object());
}

void Service::Impl::op_keep_alive(Connection& c, std::uint64_t id, const Json&) {
  reply(c, id, Json::object());  // handle_frame already refreshed the node
}

void Service::Impl::op_report(Connection& c, std::uint64_t id, const Json& req) {
  Job& job = job_of(c);
  if (c.node.empty() || !job.rendezvous) {
    return fail(c, id, Error{ErrorCode::kConflict, "this connection has not joined"});
  }
  auto result = get_string(req, "result");
  if (!result) return reject(c, id, result.error());
  if (result.value() != "succeeded" && result.value() != "failed") {
    return reject(c, id, Error{ErrorCode::kBadRequest, "result must be 'succeeded' or 'failed'"});
  }
  auto message = get_string_or(req, "message", "");
  if (!message) return reject(c, id, message.error());
  auto notices = job.rendezvous->report(c.node, result.value() == "succeeded", message.value());
  if (!notices) return fail(c, id, notices.error());
  reply(c, id, Json::object());
  deliver(job, std::move(notices).value());
}

void Service::Impl::op_close(Connection& c, std::uint64_t id, const Json&) {
  Job& job = job_of(c);
  if (job.rendezvous) {
    const std::string by = c.node.empty() ? c.peer : "node '" + c.node + "'";
    deliver(job, job.rendezvous->close("closed by " + by));
  }
  reply(c, id, Json::object());
}

void Service::Impl::op_status(Connection& c, std::uint64_t id, const Json&) {
  Job& job = job_of(c);
  Json body{{"job", c.job},
            {"keys", job.store.num_keys()},
            {"restarts", restarts_used(job.store)},
            {"faults_injected", faults_injected(job.store)},
            {"connections", job.connections},
            {"rendezvous", job.rendezvous ? job.rendezvous->describe() : Json()}};
  if (job.quorum) body["quorum"] = job.quorum->describe();
  reply(c, id, std::move(body));
}

ServiceMetrics Service::Impl::metrics() const {
  ServiceMetrics m = counters_;
  for (const auto& [op, n] : request_counts_) m.requests[std::string(op)] = n;
  for (const auto& [op, n] : tcpstore_counts_) m.requests["tcpstore_" + std::string(op)] = n;
  m.connections = connections_.size();
  for (const auto& [name, job] : jobs_) {
    JobMetrics j;
    j.job = name;
    j.state = job->rendezvous ? std::string(job_state_name(job->rendezvous->state())) : "store";
    j.round = job->rendezvous ? job->rendezvous->round() : 0;
    j.nodes = job->rendezvous ? job->rendezvous->num_nodes() : 0;
    j.keys = job->store.num_keys();
    j.connections = job->connections;
    j.restarts = restarts_used(job->store);
    j.faults_injected = faults_injected(job->store);
    read_stragglers(job->store, j);
    m.jobs.push_back(std::move(j));
  }
  return m;
}

void Service::Impl::op_jobs(Connection& c, std::uint64_t id, const Json&) {
  Json list = Json::array();
  for (const auto& [name, job] : jobs_) {
    // The asker's own job, when it holds nothing, only exists because it asked (ctrun status).
    if (name == c.job && !job->rendezvous && job->store.num_keys() == 0) continue;
    list.push_back({{"job", name},
                    {"restarts", restarts_used(job->store)},
                    {"faults_injected", faults_injected(job->store)},
                    {"keys", job->store.num_keys()},
                    {"connections", job->connections},
                    {"state", job->rendezvous ? job_state_name(job->rendezvous->state()) : "store"},
                    {"round", job->rendezvous ? job->rendezvous->round() : 0},
                    {"nodes", job->rendezvous ? job->rendezvous->num_nodes() : 0}});
  }
  reply(c, id, Json{{"jobs", std::move(list)}});
}

// ---- time ------------------------------------------------------------------------------------

void Service::Impl::tick() {
  const TimePoint now = clock_.now();
  answers_.send_due(now);
  std::vector<std::pair<ConnectionId, std::string>> late;
  for (const auto& [id, c] : connections_) {
    // Only ctrun's clients owe a hello. A connection that has said nothing yet on a listener
    // serving the worker store may be torch 1.13's second TCPStore connection, which stays
    // silent until a watch: it is bounded by the connection limits, not by time.
    if (c->wire == Wire::kCtrund && !c->authenticated &&
        now - c->opened_at >= options_.hello_timeout) {
      late.emplace_back(
          id, "no hello within " + std::to_string(to_millis(options_.hello_timeout)) + " ms");
    } else if (c->mid_frame_since && now - *c->mid_frame_since >= options_.frame_timeout) {
      late.emplace_back(id, "frame incomplete after " +
                                std::to_string(to_millis(options_.frame_timeout)) + " ms");
    }
  }
  for (const auto& [id, why] : late) {
    auto it = connections_.find(id);
    if (it != connections_.end()) reject(*it->second, 0, Error{ErrorCode::kTimeout, why});
  }
  for (auto& [name, job] : jobs_) {
    job->store.expire(now);
    if (job->rendezvous) {
      deliver(*job, job->rendezvous->tick(), /*acknowledged=*/false);
      close_dropped_nodes(*job);
    }
    if (job->quorum) deliver_quorum(*job, job->quorum->tick());
  }
  gc_jobs();
  journal_.tick([this] { return snapshot_records(); });
}

// A node the rendezvous dropped on its timers (keep-alives missed, join timed out) whose
// connection is still open, say across a network partition that healed, must not go on as if it
// were a member: closing the connection sends its agent back through resume, which tells it.
void Service::Impl::close_dropped_nodes(Job& job) {
  std::vector<std::pair<std::string, ConnectionId>> dropped;
  for (const auto& [node, cid] : job.node_connections) {
    if (!job.rendezvous->has_node(node)) dropped.emplace_back(node, cid);
  }
  for (const auto& [node, cid] : dropped) {
    job.node_connections.erase(node);
    auto it = connections_.find(cid);
    if (it == connections_.end()) continue;
    Connection& c = *it->second;
    c.node.clear();
    c.join_request.reset();
    reject(c, 0,
           Error{ErrorCode::kClosed,
                 "node '" + node + "' was dropped from job '" + job.name + "'; join again"});
  }
}

// ---- state (--state_dir) ---------------------------------------------------------------------

void Service::Impl::record_key(const std::string& job, const std::string& key) {
  if (!journal_.on()) return;
  const std::string* value = jobs_.at(job)->store.find(key);
  journal_.append(value ? set_record(job, key, *value) : delete_record(job, key));
}

void Service::Impl::record_rendezvous(Job& job) {
  if (!journal_.on()) return;
  const Rendezvous* r = job.rendezvous.get();
  if (r == job.saved_rendezvous && (!r || r->revision() == job.saved_revision)) return;
  job.saved_rendezvous = r;
  job.saved_revision = r ? r->revision() : 0;
  journal_.append(rendezvous_record(job.name, job.generation, r ? r->save() : Json()));
}

std::vector<Json> Service::Impl::snapshot_records() const {
  std::vector<Json> records;
  for (const auto& [name, job] : jobs_) {
    for (const auto& [key, value] : job->store.entries()) {
      records.push_back(set_record(name, key, value));
    }
    records.push_back(rendezvous_record(name, job->generation,
                                        job->rendezvous ? job->rendezvous->save() : Json()));
  }
  return records;
}

Status Service::Impl::apply_record(const Json& r) {
  auto decoded = decode_job_record(r);
  if (!decoded) return decoded.error();
  JobRecord& record = decoded.value();
  if (record.kind == JobRecord::Kind::kDrop) {
    jobs_.erase(record.job);
    return ok_status();
  }
  auto [it, created] = jobs_.try_emplace(record.job, nullptr);
  if (created) {
    it->second = std::make_unique<Job>(record.job, options_.store_limits);
    it->second->idle_since = clock_.now();
  }
  Job& job = *it->second;
  switch (record.kind) {
    case JobRecord::Kind::kDelete:
      job.store.erase(record.key);
      return ok_status();
    case JobRecord::Kind::kSet:
      return job.store.set(record.key, std::move(record.value));
    case JobRecord::Kind::kRendezvous:
      job.generation = record.generation;
      if (record.state.is_null()) {
        job.rendezvous.reset();
      } else {
        auto restored = Rendezvous::restore(record.state, clock_, options_.log);
        if (!restored) return restored.error();
        job.rendezvous = std::move(restored).value();
        job.rendezvous->set_event_sink(options_.events);
      }
      job.saved_rendezvous = job.rendezvous.get();
      job.saved_revision = job.rendezvous ? job.rendezvous->revision() : 0;
      return ok_status();
    case JobRecord::Kind::kDrop:
      break;
  }
  return ok_status();
}

Status Service::Impl::restore() {
  if (!journal_.on()) return ok_status();
  auto records = journal_.load();
  if (!records) return records.error();
  std::size_t applied = 0;
  for (const auto& r : records.value()) {
    if (auto s = apply_record(r); !s) {
      return Error{ErrorCode::kInternal, "state record " + std::to_string(applied + 1) +
                                             " cannot be applied: " + s.error().message};
    }
    ++applied;
  }
  if (!journal_.load_note().empty()) log("state: " + journal_.load_note());
  std::size_t keys = 0;
  std::size_t nodes = 0;
  for (const auto& [name, job] : jobs_) {
    keys += job->store.num_keys();
    nodes += job->rendezvous ? job->rendezvous->num_nodes() : 0;
  }
  log("state: restored " + std::to_string(jobs_.size()) + " job(s), " + std::to_string(keys) +
      " key(s), " + std::to_string(nodes) + " node(s) from " + std::to_string(applied) +
      " record(s)");
  // One compact file to start from; it also drops what the replay superseded.
  if (!journal_.rewrite(snapshot_records())) {
    return Error{ErrorCode::kInternal, "cannot write the state snapshot"};
  }
  return ok_status();
}

void Service::Impl::gc_jobs() {
  const TimePoint now = clock_.now();
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    const Job& job = *it->second;
    Duration keep = options_.idle_job_timeout;
    if (job.rendezvous && job.rendezvous->state() != JobState::kRunning) {
      keep = job.rendezvous->config().close_timeout;
    } else if (!job.rendezvous && job.store.num_keys() == 0) {
      keep = Duration::zero();  // nothing to keep (a `ctrun status` that looked and left)
    }
    if (job.connections == 0 && now - job.idle_since >= keep) {
      log("job '" + it->first + "' dropped: no connections for " + std::to_string(to_millis(keep)) +
          " ms");
      journal_.append(drop_record(it->first));
      if (options_.events) options_.events("job_dropped", Json{{"job", it->first}});
      if (job.worker_store_port != 0) transport_.close_worker_store(it->first);
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
}

// ---- the public face ---------------------------------------------------------------------------

Service::Service(ServiceOptions options, const Clock& clock, Transport& transport)
    : impl_(std::make_unique<Impl>(std::move(options), clock, transport)) {}
Service::~Service() = default;
Status Service::restore() { return impl_->restore(); }
void Service::shutdown() { impl_->shutdown(); }
void Service::on_connect(ConnectionId id, std::string peer,
                         std::optional<std::string> worker_store_job) {
  impl_->on_connect(id, std::move(peer), std::move(worker_store_job));
}
void Service::on_data(ConnectionId id, const char* data, std::size_t size) {
  impl_->on_data(id, data, size);
}
void Service::on_disconnect(ConnectionId id) { impl_->on_disconnect(id); }
void Service::tick() { impl_->tick(); }
std::size_t Service::num_connections() const { return impl_->connections_.size(); }
std::size_t Service::num_jobs() const { return impl_->jobs_.size(); }
ServiceMetrics Service::metrics() const { return impl_->metrics(); }

}  // namespace ctrun::rendezvous

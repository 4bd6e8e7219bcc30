#include "launcher/workers/file_timers.h"

#include <algorithm>
#include <csignal>

#include "ctrun/rendezvous/json.h"

namespace ctrun::launcher {

namespace rdzv = ctrun::rendezvous;

namespace {

rdzv::Error bad_request(const std::string& why) {
  return rdzv::Error{rdzv::ErrorCode::kBadRequest, "file timer request: " + why};
}

}  // namespace

rdzv::Result<FileTimerRequest> parse_file_timer_request(std::string_view line) {
  const rdzv::Json json = rdzv::Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) return bad_request("not a JSON object");
  FileTimerRequest request;
  const auto pid = json.find("pid");
  if (pid == json.end() || !pid->is_number_integer() || pid->get<long long>() <= 0 ||
      pid->get<long long>() > 0x7fffffff) {
    return bad_request("\"pid\" is not a process id");
  }
  request.pid = static_cast<int>(pid->get<long long>());
  const auto scope = json.find("scope_id");
  if (scope == json.end() || !scope->is_string()) return bad_request("\"scope_id\" is not text");
  request.scope_id = scope->get<std::string>();
  const auto expiration = json.find("expiration_time");
  if (expiration == json.end() || !expiration->is_number()) {
    return bad_request("\"expiration_time\" is not a number");
  }
  request.expiration_time = expiration->get<double>();
  const auto signal = json.find("signal");
  if (signal == json.end() || !signal->is_number_integer() || signal->get<long long>() >= NSIG) {
    return bad_request("\"signal\" is not a signal number");
  }
  // 0 or below: expire without a kill, as torch's server does.
  request.signal = static_cast<int>(std::max<long long>(signal->get<long long>(), 0));
  return request;
}

std::string scope_list(const std::vector<std::string>& scopes) {
  std::string text;
  for (const auto& s : scopes) text += (text.empty() ? "'" : ", '") + s + "'";
  return "[" + text + "]";
}

void FileTimers::apply(const FileTimerRequest& request) {
  auto key = std::make_pair(request.pid, request.scope_id);
  if (request.expiration_time < 0) {
    timers_.erase(key);
  } else {
    timers_[std::move(key)] = Timer{request.expiration_time, request.signal};
  }
}

std::vector<FileTimerExpiry> FileTimers::take_expired(double now) {
  std::map<int, std::vector<std::pair<double, std::pair<std::string, int>>>> expired;
  for (const auto& [key, timer] : timers_) {
    if (timer.expiration_time <= now) {
      expired[key.first].push_back({timer.expiration_time, {key.second, timer.signal}});
    }
  }
  std::vector<FileTimerExpiry> out;
  for (auto& [pid, timers] : expired) {
    std::sort(timers.begin(), timers.end());
    FileTimerExpiry expiry;
    expiry.pid = pid;
    for (const auto& [when, scope_signal] : timers) {
      expiry.scopes.push_back(scope_signal.first);
      if (expiry.signal == 0 && scope_signal.second > 0) {
        expiry.signal = scope_signal.second;
        expiry.signal_scope = scope_signal.first;
      }
    }
    forget(pid);
    out.push_back(std::move(expiry));
  }
  return out;
}

void FileTimers::forget(int pid) {
  auto it = timers_.lower_bound({pid, std::string()});
  while (it != timers_.end() && it->first.first == pid) it = timers_.erase(it);
}

std::vector<int> FileTimers::pids() const {
  std::vector<int> out;
  for (const auto& [key, timer] : timers_) {
    if (out.empty() || out.back() != key.first) out.push_back(key.first);
  }
  return out;
}

}  // namespace ctrun::launcher

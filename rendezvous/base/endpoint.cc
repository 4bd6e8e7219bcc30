#include "ctrun/rendezvous/endpoint.h"

#include <algorithm>
#include <charconv>
#include <optional>

namespace ctrun::rendezvous {
namespace {

Error bad(const std::string& message) {
  return Error{ErrorCode::kBadRequest, "--rdzv_endpoint: " + message};
}

}  // namespace

Result<Endpoint> parse_endpoint(const std::string& text, std::uint16_t default_port) {
  std::string t = text;
  t.erase(0, t.find_first_not_of(" \t"));
  t.erase(t.find_last_not_of(" \t") + 1);
  Endpoint ep{t, default_port};
  std::string port;
  if (!t.empty() && t.front() == '[') {
    const auto close = t.find(']');
    if (close == std::string::npos) return bad("unclosed '[' in '" + t + "'");
    ep.host = t.substr(1, close - 1);
    if (close + 1 < t.size()) {
      if (t[close + 1] != ':') return bad("expected ':' after ']' in '" + t + "'");
      port = t.substr(close + 2);
      if (port.empty()) return bad("no port after ':' in '" + t + "'");
    }
  } else if (std::count(t.begin(), t.end(), ':') == 1) {
    ep.host = t.substr(0, t.find(':'));
    port = t.substr(t.find(':') + 1);
    if (port.empty()) return bad("no port after ':' in '" + t + "'");
  } else if (std::count(t.begin(), t.end(), ':') > 1) {
    return bad("write an IPv6 address in brackets, as [" + t + "]:" + std::to_string(default_port));
  }
  if (ep.host.empty()) return bad("no host in '" + t + "'");
  if (!port.empty()) {
    int p = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (ec != std::errc() || end != port.data() + port.size() || p < 1 || p > 65535) {
      return bad("port must be 1..65535, got '" + port + "'");
    }
    ep.port = static_cast<std::uint16_t>(p);
  }
  return ep;
}

std::string format_endpoint(const Endpoint& endpoint) {
  const bool v6 = endpoint.host.find(':') != std::string::npos;
  return (v6 ? "[" + endpoint.host + "]" : endpoint.host) + ":" + std::to_string(endpoint.port);
}

Result<bool> endpoint_list_https(const std::string& text) {
  std::optional<bool> https;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    start = comma + 1;
    std::optional<bool> this_one;
    if (item.rfind("https://", 0) == 0) this_one = true;
    if (item.rfind("http://", 0) == 0) this_one = false;
    if (!this_one) continue;
    if (https && *https != *this_one) {
      return Error{ErrorCode::kBadRequest,
                   "--rdzv_endpoint: '" + text + "' mixes http:// and https:// members"};
    }
    https = this_one;
  }
  return https.value_or(false);
}

Result<std::vector<Endpoint>> parse_endpoint_list(const std::string& text,
                                                  std::uint16_t default_port) {
  if (auto https = endpoint_list_https(text); !https) return https.error();
  std::vector<Endpoint> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, comma - start);
    start = comma + 1;
    if (item.rfind("https://", 0) == 0) item = item.substr(8);
    if (item.rfind("http://", 0) == 0) item = item.substr(7);
    while (!item.empty() && item.back() == '/') item.pop_back();
    if (item.empty()) {
      return Error{ErrorCode::kBadRequest,
                   "--rdzv_endpoint: empty etcd endpoint in '" + text + "'"};
    }
    auto ep = parse_endpoint(item, default_port);
    if (!ep) return ep.error();
    out.push_back(std::move(ep).value());
  }
  return out;
}

std::string format_endpoint_list(const std::vector<Endpoint>& endpoints) {
  std::string out;
  for (const auto& ep : endpoints) {
    // Appended piece by piece: g++ 12 -O3 sees a false -Wrestrict in `"," + string`.
    if (!out.empty()) out += ',';
    out += format_endpoint(ep);
  }
  return out;
}

}  // namespace ctrun::rendezvous

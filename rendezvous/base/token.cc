#include "rendezvous/base/token.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ctrun::rendezvous {

Result<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Error{ErrorCode::kBadRequest,
                 "cannot read token file '" + path + "': " + std::strerror(errno)};
  }
  std::ostringstream content;
  content << in.rdbuf();
  return clean_token(content.str(), "token file '" + path + "'");
}

Result<std::optional<std::string>> resolve_token(const std::string& token_file,
                                                 const std::optional<std::string>& env_token) {
  if (!token_file.empty()) {
    auto token = read_token_file(token_file);
    if (!token) return token.error();
    return std::optional<std::string>(token.value());
  }
  if (!env_token) return std::optional<std::string>();
  auto token = clean_token(*env_token, kTokenVariable);
  if (!token) return token.error();
  return std::optional<std::string>(token.value());
}

Result<std::string> clean_token(std::string token, const std::string& source) {
  const char* space = " \t\r\n";
  token.erase(0, token.find_first_not_of(space) == std::string::npos
                     ? token.size()
                     : token.find_first_not_of(space));
  while (!token.empty() && std::strchr(space, token.back()) != nullptr) token.pop_back();
  if (token.empty()) return Error{ErrorCode::kBadRequest, source + " is empty"};
  return token;
}

}  // namespace ctrun::rendezvous

#include "rendezvous/protocol/auth.h"
#include "ctrun/rendezvous/endpoint.h"
#include "rendezvous/base/token.h"

#include <cstdio>
#include <fstream>

#include "catch.h"

using namespace ctrun::rendezvous;

TEST_CASE("auth: proofs depend on token, nonce and job") {
  const std::string nonce = random_bytes(kNonceBytes);
  CHECK(nonce.size() == kNonceBytes);
  CHECK(random_bytes(kNonceBytes) != nonce);
  const std::string p = client_proof("secret", nonce, "job");
  CHECK(p.size() == 32);
  CHECK(p == client_proof("secret", nonce, "job"));
  CHECK(p != client_proof("Secret", nonce, "job"));
  CHECK(p != client_proof("secret", random_bytes(kNonceBytes), "job"));
  CHECK(p != client_proof("secret", nonce, "job2"));
  // The server's proof is labelled differently: a client proof cannot be reflected back.
  CHECK(server_proof("secret", nonce, nonce) != client_proof("secret", nonce, nonce));
}

TEST_CASE("auth: constant_time_equal") {
  CHECK(constant_time_equal("abc", "abc"));
  CHECK_FALSE(constant_time_equal("abc", "abd"));
  CHECK_FALSE(constant_time_equal("abc", "abcd"));
  CHECK(constant_time_equal("", ""));
}

TEST_CASE("auth: token files") {
  const std::string path = "ctrun_auth_test_token";
  { std::ofstream(path) << "s3cret \n"; }
  CHECK(read_token_file(path).value() == "s3cret");
  { std::ofstream(path) << "\n\n"; }
  auto empty = read_token_file(path);
  REQUIRE_FALSE(empty);
  CHECK(empty.error().message.find("is empty") != std::string::npos);
  std::remove(path.c_str());
  auto missing = read_token_file(path);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message.find("cannot read token file") != std::string::npos);
}

TEST_CASE("auth: tokens from the environment are trimmed like files") {
  CHECK(clean_token("  tok\n", "CTRUN_RDZV_TOKEN").value() == "tok");
  auto blank = clean_token(" \t\n", "CTRUN_RDZV_TOKEN");
  REQUIRE_FALSE(blank);
  CHECK(blank.error().message == "CTRUN_RDZV_TOKEN is empty");
}

TEST_CASE("auth: the token file wins over the environment, which wins over none") {
  const std::string path = "ctrun_auth_test_resolve";
  { std::ofstream(path) << "from-file\n"; }
  CHECK(resolve_token(path, std::string("from-env")).value() ==
        std::optional<std::string>("from-file"));
  CHECK(resolve_token("", std::string(" from-env ")).value() ==
        std::optional<std::string>("from-env"));
  CHECK_FALSE(resolve_token("", std::nullopt).value().has_value());
  auto blank = resolve_token("", std::string("  "));
  REQUIRE_FALSE(blank);
  CHECK(blank.error().message == "CTRUN_RDZV_TOKEN is empty");
  std::remove(path.c_str());
  auto missing = resolve_token(path, std::string("from-env"));  // a named file must be there
  REQUIRE_FALSE(missing);
  CHECK(missing.error().message.find("cannot read token file") != std::string::npos);
}

TEST_CASE("endpoint: format_endpoint brackets IPv6 and reads back") {
  CHECK(format_endpoint({"10.0.0.1", 29400}) == "10.0.0.1:29400");
  CHECK(format_endpoint({"node-3.example", 1}) == "node-3.example:1");
  CHECK(format_endpoint({"::1", 29400}) == "[::1]:29400");
  for (const Endpoint& ep : {Endpoint{"::1", 80}, Endpoint{"h", 65535}, Endpoint{"fe80::2", 7}}) {
    auto back = parse_endpoint(format_endpoint(ep), 1);
    REQUIRE(back.ok());
    CHECK(back.value().host == ep.host);
    CHECK(back.value().port == ep.port);
  }
}

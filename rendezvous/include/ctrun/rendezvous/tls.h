// TLS as a client of the rendezvous sees it (etcd over https): what it trusts and who it is.
// Paths only; the files are read when a connection is set up.
#pragma once

#include <string>

namespace ctrun::rendezvous {

struct TlsClientFiles {
  std::string ca_file;    // the CAs a server's certificate must chain to; empty: the system's
  std::string cert_file;  // with key_file: this client's certificate (mutual TLS)
  std::string key_file;
};

}  // namespace ctrun::rendezvous

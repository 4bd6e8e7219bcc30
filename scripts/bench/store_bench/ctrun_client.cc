#include <stdexcept>

#include "ctrun/rendezvous/client.h"
#include "store_client.h"

namespace store_bench {
namespace {

namespace rdzv = ctrun::rendezvous;

class CtrunStoreClient final : public StoreClient {
 public:
  explicit CtrunStoreClient(std::unique_ptr<rdzv::Client> client) : client_(std::move(client)) {}

  void set(const std::string& key, const std::string& value) override {
    if (auto s = client_->set(key, value); !s)
      throw std::runtime_error("ctrund set: " + s.error().message);
  }

  std::string get(const std::string& key) override {
    auto v = client_->get(key);
    if (!v) throw std::runtime_error("ctrund get: " + v.error().message);
    return std::move(v).value();
  }

 private:
  std::unique_ptr<rdzv::Client> client_;
};

}  // namespace

std::unique_ptr<StoreClient> connect_ctrun(int port) {
  rdzv::ClientOptions options;
  options.host = "127.0.0.1";
  options.port = static_cast<std::uint16_t>(port);
  options.job = "store_bench";
  options.connect_timeout = std::chrono::seconds(20);
  auto client = rdzv::Client::connect(options);
  if (!client) throw std::runtime_error("connect to ctrund: " + client.error().message);
  return std::make_unique<CtrunStoreClient>(std::move(client).value());
}

}  // namespace store_bench

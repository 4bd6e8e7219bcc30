#include <stdexcept>

#include "ctrun/rendezvous/client.h"
#include "store_client.h"

namespace store_bench {
namespace {

namespace rdzv = ctrun::rendezvous;

class CtrunStoreClient final : public StoreClient {
 public:
  CtrunStoreClient(std::unique_ptr<rdzv::Client> client, bool post_sets)
      : client_(std::move(client)), post_sets_(post_sets) {}

  void set(const std::string& key, const std::string& value) override {
    if (auto s = post_sets_ ? client_->post_set(key, value) : client_->set(key, value); !s)
      throw std::runtime_error("ctrund set: " + s.error().message);
  }

  // Every posted set was answered well, or the benchmark reports no number.
  void finish() override {
    if (auto s = client_->flush(); !s) throw std::runtime_error("ctrund set: " + s.error().message);
  }

  std::string get(const std::string& key) override {
    auto v = client_->get(key);
    if (!v) throw std::runtime_error("ctrund get: " + v.error().message);
    return std::move(v).value();
  }

 private:
  std::unique_ptr<rdzv::Client> client_;
  bool post_sets_;
};

}  // namespace

std::unique_ptr<StoreClient> connect_ctrun(int port, bool post_sets) {
  rdzv::ClientOptions options;
  options.host = "127.0.0.1";
  options.port = static_cast<std::uint16_t>(port);
  options.job = "store_bench";
  options.connect_timeout = std::chrono::seconds(20);
  auto client = rdzv::Client::connect(options);
  if (!client) throw std::runtime_error("connect to ctrund: " + client.error().message);
  return std::make_unique<CtrunStoreClient>(std::move(client).value(), post_sets);
}

}  // namespace store_bench

// c10d::Store over the job's store (ctrund's, or etcd's with --rdzv_backend=etcd), so torch's
// process groups (ProcessGroupGloo) bootstrap through the rendezvous. Keys live under a prefix:
// the round's, so a later round never reads an earlier round's addresses.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <mutex>

#include "ctrun/rendezvous/store_address.h"
#include "ctrun/rendezvous/store_client.h"

namespace ctrun::worker {

class CtrunStore : public c10d::Store {
 public:
  // Connects (to ctrund: retrying until `timeout`); throws std::runtime_error naming the store
  // otherwise.
  CtrunStore(const rendezvous::StoreAddress& address, const std::string& job,
             std::string key_prefix, std::chrono::milliseconds timeout);
  ~CtrunStore() override;

  using c10d::Store::set;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
  // LibTorch 2.8 made clone() pure virtual: a second connection to the same store.
  c10::intrusive_ptr<c10d::Store> clone() override;
#endif

 private:
  std::string key(const std::string& k) const { return prefix_ + k; }
  std::vector<std::string> keys(const std::vector<std::string>& ks) const;

  rendezvous::StoreAddress address_;
  std::string job_;
  std::string prefix_;
  std::string where_;  // "host:port" (ctrund) or "etcd h1:p1,h2:p2", for error messages
  std::mutex mutex_;   // the blocking client serves one call at a time
  std::unique_ptr<rendezvous::StoreClient> client_;
};

}  // namespace ctrun::worker

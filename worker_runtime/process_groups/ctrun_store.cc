#include "worker_runtime/process_groups/ctrun_store.h"

#include <stdexcept>

#include "ctrun/rendezvous/endpoint.h"

namespace ctrun::worker {
namespace {

std::string to_string(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}
std::vector<uint8_t> to_bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

}  // namespace

CtrunStore::CtrunStore(const rendezvous::StoreAddress& address, const std::string& job,
                       std::string key_prefix, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), address_(address), job_(job), prefix_(std::move(key_prefix)) {
  if (address.backend == rendezvous::StoreAddress::Backend::kEtcd) {
    where_ = "etcd " + rendezvous::format_endpoint_list(address.etcd_endpoints);
  } else {
    where_ = rendezvous::format_endpoint({address.host, static_cast<std::uint16_t>(address.port)});
  }
  auto client = rendezvous::connect_store(address, job, timeout);
  if (!client) {
    throw std::runtime_error("ctrun store at " + where_ + ": " + client.error().message);
  }
  client_ = std::move(client.value());
}

CtrunStore::~CtrunStore() = default;

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
c10::intrusive_ptr<c10d::Store> CtrunStore::clone() {
  return c10::make_intrusive<CtrunStore>(address_, job_, prefix_, timeout_);
}
#endif

std::vector<std::string> CtrunStore::keys(const std::vector<std::string>& ks) const {
  std::vector<std::string> out;
  out.reserve(ks.size());
  for (const auto& k : ks) out.push_back(key(k));
  return out;
}

// Failures become exceptions here because c10d::Store's interface has no other way to say so;
// ProcessGroupGloo passes them on to the caller that is bootstrapping. (A Status is a
// Result<Ok>: the same function serves calls that return nothing.)
template <typename T>
static T unwrap(rendezvous::Result<T> r, const std::string& where, const char* op,
                const std::string& k) {
  if (!r)
    throw std::runtime_error("ctrun store at " + where + ": " + op + " '" + k +
                             "': " + r.error().message);
  return std::move(r.value());
}

void CtrunStore::set(const std::string& k, const std::vector<uint8_t>& value) {
  std::lock_guard lock(mutex_);
  unwrap(client_->set(key(k), to_string(value)), where_, "set", k);
}

std::vector<uint8_t> CtrunStore::compareSet(const std::string& k,
                                            const std::vector<uint8_t>& expected,
                                            const std::vector<uint8_t>& desired) {
  std::lock_guard lock(mutex_);
  return to_bytes(unwrap(client_->compare_set(key(k), to_string(expected), to_string(desired)),
                         where_, "compare_set", k));
}

std::vector<uint8_t> CtrunStore::get(const std::string& k) {
  std::lock_guard lock(mutex_);
  return to_bytes(unwrap(client_->get(key(k), timeout_), where_, "get", k));
}

int64_t CtrunStore::add(const std::string& k, int64_t value) {
  std::lock_guard lock(mutex_);
  return unwrap(client_->add(key(k), value), where_, "add", k);
}

bool CtrunStore::deleteKey(const std::string& k) {
  std::lock_guard lock(mutex_);
  return unwrap(client_->erase(key(k)), where_, "delete", k);
}

bool CtrunStore::check(const std::vector<std::string>& ks) {
  std::lock_guard lock(mutex_);
  return unwrap(client_->check(keys(ks)), where_, "check", ks.empty() ? "" : ks.front());
}

int64_t CtrunStore::getNumKeys() {
  std::lock_guard lock(mutex_);
  return unwrap(client_->num_keys(), where_, "num_keys", "");
}

void CtrunStore::wait(const std::vector<std::string>& ks) { wait(ks, timeout_); }

void CtrunStore::wait(const std::vector<std::string>& ks,
                      const std::chrono::milliseconds& timeout) {
  std::lock_guard lock(mutex_);
  unwrap(client_->wait(keys(ks), timeout), where_, "wait", ks.empty() ? "" : ks.front());
}

}  // namespace ctrun::worker

#include "worker_runtime/fault_tolerance/replica_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "ctrun/worker/sampler.h"
#include "worker_runtime/base/error_text.h"
#include "worker_runtime/sharded/sharded_access.h"

namespace ctrun::worker {

std::string save_replica_state(const ReplicaState& state, std::int64_t committed_step) {
  torch::serialize::OutputArchive archive;
  for (const auto& item : state.module->named_parameters()) {
    // Sharded: the trained parameters are the shards (written below); frozen ones stay whole.
    if (state.sharded != nullptr && item.value().requires_grad()) continue;
    archive.write("parameter/" + item.key(), item.value());
  }
  if (state.sharded != nullptr) {
    const auto shards = state.sharded->shard_parameters();
    for (std::size_t u = 0; u < shards.size(); ++u) {
      archive.write("shard/" + std::to_string(u), shards[u].detach());
    }
  }
  for (const auto& item : state.module->named_buffers()) {
    archive.write("buffer/" + item.key(), item.value(), /*is_buffer=*/true);
  }
  torch::serialize::OutputArchive optimizer;
  state.optimizer->save(optimizer);
  archive.write("optimizer", optimizer);
  nlohmann::json progress = {{"step", committed_step}};
  if (state.sampler != nullptr) {
    progress["epoch"] = state.sampler->epoch();
    progress["committed"] = state.sampler->committed();
  }
  archive.write("progress", c10::IValue(progress.dump()));
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard lock(generator.mutex());
    archive.write("rng_cpu", generator.get_state());
  }
  std::ostringstream out;
  archive.save_to(out);
  return std::move(out).str();
}

std::int64_t load_replica_state(const ReplicaState& state, const std::string& bytes) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size());
    c10::IValue progress_value;
    archive.read("progress", progress_value);
    const auto progress = nlohmann::json::parse(progress_value.toStringRef());
    // Copied into the tensors the module has, not swapped in (Module::load's set_): DDP's
    // gradient hooks hang on these tensors.
    torch::NoGradGuard no_grad;
    for (auto& item : state.module->named_parameters()) {
      if (state.sharded != nullptr && item.value().requires_grad()) continue;
      at::Tensor value;
      archive.read("parameter/" + item.key(), value);
      item.value().copy_(value);
    }
    if (state.sharded != nullptr) {
      auto shards = state.sharded->shard_parameters();
      for (std::size_t u = 0; u < shards.size(); ++u) {
        at::Tensor value;
        archive.read("shard/" + std::to_string(u), value);
        if (!value.sizes().equals(shards[u].sizes())) {
          throw std::runtime_error("shard " + std::to_string(u) + ": the peer sent " +
                                   std::to_string(value.numel()) + " elements, this one has " +
                                   std::to_string(shards[u].numel()) +
                                   " (another model, or another shard group size)");
        }
        shards[u].detach().copy_(value);
      }
      ShardedAccess::discard_step(*state.sharded);  // the parameters, from the new shards
    }
    for (auto& item : state.module->named_buffers()) {
      at::Tensor value;
      archive.read("buffer/" + item.key(), value, /*is_buffer=*/true);
      item.value().copy_(value);
    }
    torch::serialize::InputArchive optimizer;
    archive.read("optimizer", optimizer);
    state.optimizer->load(optimizer);
    if (state.sampler != nullptr) {
      state.sampler->restore(progress.at("epoch").get<std::uint64_t>(),
                             progress.at("committed").get<std::uint64_t>());
    }
    at::Tensor rng;
    archive.read("rng_cpu", rng);
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard lock(generator.mutex());
    generator.set_state(rng);
    return progress.at("step").get<std::int64_t>();
  } catch (const std::exception& e) {
    throw std::runtime_error("the state received from the peer does not load into this model: " +
                             first_line(e.what()));
  }
}

void send_replica_bytes(ProcessGroup& group, const std::string& bytes, int to, at::Device device) {
  at::Tensor length = at::full({1}, static_cast<std::int64_t>(bytes.size()), at::kLong);
  group.send(length.to(device), to);
  at::Tensor data = at::from_blob(const_cast<char*>(bytes.data()),
                                  {static_cast<std::int64_t>(bytes.size())}, at::kByte);
  group.send(data.to(device), to);
}

std::string recv_replica_bytes(ProcessGroup& group, int from, at::Device device) {
  at::Tensor length = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(device));
  group.recv(length, from);
  const std::int64_t size = length.cpu().item<std::int64_t>();
  if (size <= 0 || size > (std::int64_t{1} << 40)) {
    throw std::runtime_error("healing: the peer announced " + std::to_string(size) + " bytes");
  }
  at::Tensor data = at::empty({size}, at::TensorOptions().dtype(at::kByte).device(device));
  group.recv(data, from);
  data = data.cpu();
  return std::string(static_cast<const char*>(data.data_ptr()), static_cast<std::size_t>(size));
}

}  // namespace ctrun::worker

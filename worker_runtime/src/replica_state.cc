#include "replica_state.h"

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
#include "error_text.h"

namespace ctrun::worker {

std::string save_replica_state(const ReplicaState& state, std::int64_t committed_step) {
  torch::serialize::OutputArchive archive;
  for (const auto& item : state.module->named_parameters()) {
    archive.write("parameter/" + item.key(), item.value());
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
      at::Tensor value;
      archive.read("parameter/" + item.key(), value);
      item.value().copy_(value);
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

}  // namespace ctrun::worker

#include "ctrun/worker/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "rendezvous/base/durable_file.h"
#include "worker_runtime/base/error_text.h"
#include "worker_runtime/checkpoints/checkpoint_files.h"
#include "worker_runtime/checkpoints/sharded_checkpoint_reader.h"

namespace ctrun::worker {

Checkpointer::Checkpointer(std::string directory, int rank, int keep)
    : directory_(std::move(directory)), rank_(rank), keep_(std::max(keep, 1)) {}

std::vector<std::string> Checkpointer::list() const {
  std::vector<std::string> paths;
  for (auto& entry : list_checkpoints(directory_)) paths.push_back(std::move(entry.path));
  return paths;
}

void Checkpointer::save(const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
                        const TrainingProgress& progress) const {
  if (rank_ != 0) return;
  std::error_code ec;
  std::filesystem::create_directories(directory_, ec);
  if (ec) throw std::runtime_error("checkpoint: create " + directory_ + ": " + ec.message());

  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model_archive;
  module.save(model_archive);
  archive.write("model", model_archive);
  torch::serialize::OutputArchive optimizer_archive;
  optimizer.save(optimizer_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("progress", c10::IValue(progress_to_json(progress).dump()));
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard lock(generator.mutex());
    archive.write("rng_cpu", generator.get_state());
  }

  const std::string path = whole_checkpoint_path(directory_, progress.step);
  write_file_durably(path, [&](int fd, std::string& write_error) {
    archive.save_to([&](const void* data, std::size_t size) -> std::size_t {
      if (!write_error.empty()) return 0;
      auto s = rendezvous::write_fully(fd, {static_cast<const char*>(data), size}, path);
      if (!s) write_error = s.error().message;
      return s ? size : 0;
    });
    return write_error.empty();
  });
  if (auto s = rendezvous::sync_directory(directory_); !s) {
    throw std::runtime_error("checkpoint: " + s.error().message);
  }
  // Only now that the new one is whole do older ones go; also temporaries a killed writer left.
  prune_checkpoints(directory_, keep_);
}

std::optional<TrainingProgress> Checkpointer::load_latest(
    torch::nn::Module& module, torch::optim::Optimizer& optimizer) const {
  for (const auto& [step, path, sharded] : list_checkpoints(directory_)) {
    try {
      if (sharded) return load_sharded_into_whole(path, module, optimizer);
      torch::serialize::InputArchive archive;
      archive.load_from(path);
      c10::IValue progress_value;
      archive.read("progress", progress_value);
      TrainingProgress progress =
          progress_from_json(nlohmann::json::parse(progress_value.toStringRef()));
      at::Tensor rng;
      archive.read("rng_cpu", rng);
      torch::serialize::InputArchive model_archive;
      archive.read("model", model_archive);
      module.load(model_archive);
      torch::serialize::InputArchive optimizer_archive;
      archive.read("optimizer", optimizer_archive);
      optimizer.load(optimizer_archive);
      auto generator = at::detail::getDefaultCPUGenerator();
      std::lock_guard lock(generator.mutex());
      generator.set_state(rng);
      return progress;
    } catch (const std::exception& e) {
      std::cerr << "[ctrun] checkpoint " << path
                << " is unreadable, trying an older one: " << first_line(e.what()) << std::endl;
    }
  }
  return std::nullopt;
}

}  // namespace ctrun::worker

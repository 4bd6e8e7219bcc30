#include "ctrun/worker/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "error_text.h"
#include "rendezvous/base/durable_file.h"

namespace ctrun::worker {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPrefix = "checkpoint-";
constexpr const char* kSuffix = ".pt";

std::string errno_text() { return std::strerror(errno); }

// The step a checkpoint file name carries; nullopt for anything else (temporaries included).
std::optional<std::int64_t> step_of(const std::string& name) {
  const std::string prefix = kPrefix;
  const std::string suffix = kSuffix;
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit) ||
      digits.size() > 18) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

std::string progress_json(const TrainingProgress& p) {
  nlohmann::json j = {{"epoch", p.epoch},
                      {"step", p.step},
                      {"epoch_consumed", p.epoch_consumed},
                      {"world_size", p.world_size},
                      {"values", p.values}};
  return j.dump();
}

TrainingProgress progress_from_json(const std::string& text) {
  const auto j = nlohmann::json::parse(text);
  TrainingProgress p;
  p.epoch = j.at("epoch").get<std::int64_t>();
  p.step = j.at("step").get<std::int64_t>();
  p.epoch_consumed = j.at("epoch_consumed").get<std::uint64_t>();
  p.world_size = j.at("world_size").get<int>();
  p.values = j.at("values").get<std::map<std::string, double>>();
  return p;
}

}  // namespace

Checkpointer::Checkpointer(std::string directory, int rank, int keep)
    : directory_(std::move(directory)), rank_(rank), keep_(std::max(keep, 1)) {}

std::vector<std::string> Checkpointer::list() const {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    if (auto step = step_of(entry.path().filename().string())) {
      found.emplace_back(*step, entry.path().string());
    }
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

void Checkpointer::save(const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
                        const TrainingProgress& progress) const {
  if (rank_ != 0) return;
  std::error_code ec;
  fs::create_directories(directory_, ec);
  if (ec) throw std::runtime_error("checkpoint: create " + directory_ + ": " + ec.message());

  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model_archive;
  module.save(model_archive);
  archive.write("model", model_archive);
  torch::serialize::OutputArchive optimizer_archive;
  optimizer.save(optimizer_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("progress", c10::IValue(progress_json(progress)));
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard lock(generator.mutex());
    archive.write("rng_cpu", generator.get_state());
  }

  const std::string final_path =
      directory_ + "/" + kPrefix + std::to_string(progress.step) + kSuffix;
  const std::string temp_path = final_path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("checkpoint: create " + temp_path + ": " + errno_text());
  std::string write_error;
  archive.save_to([&](const void* data, std::size_t size) -> std::size_t {
    if (!write_error.empty()) return 0;
    auto s = rendezvous::write_fully(fd, {static_cast<const char*>(data), size}, temp_path);
    if (!s) write_error = s.error().message;
    return s ? size : 0;
  });
  if (write_error.empty() && ::fsync(fd) != 0) {
    write_error = "cannot sync '" + temp_path + "': " + errno_text();
  }
  ::close(fd);
  if (!write_error.empty()) {
    ::unlink(temp_path.c_str());
    throw std::runtime_error("checkpoint: " + write_error);
  }
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    const std::string err = errno_text();
    ::unlink(temp_path.c_str());
    throw std::runtime_error("checkpoint: rename to " + final_path + ": " + err);
  }
  if (auto s = rendezvous::sync_directory(directory_); !s) {
    throw std::runtime_error("checkpoint: " + s.error().message);
  }

  // Only now that the new one is whole do older ones go; also temporaries a killed writer left.
  const auto whole = list();
  for (std::size_t i = static_cast<std::size_t>(keep_); i < whole.size(); ++i) {
    fs::remove(whole[i], ec);
  }
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) == 0 && name.find(".tmp.") != std::string::npos) {
      fs::remove(entry.path(), ec);
    }
  }
}

std::optional<TrainingProgress> Checkpointer::load_latest(
    torch::nn::Module& module, torch::optim::Optimizer& optimizer) const {
  for (const auto& path : list()) {
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(path);
      c10::IValue progress_value;
      archive.read("progress", progress_value);
      TrainingProgress progress = progress_from_json(progress_value.toStringRef());
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

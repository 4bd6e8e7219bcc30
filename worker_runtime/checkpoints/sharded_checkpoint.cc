#include "ctrun/worker/sharded_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "rendezvous/base/durable_file.h"
#include "worker_runtime/base/error_text.h"
#include "worker_runtime/checkpoints/checkpoint_files.h"
#include "worker_runtime/checkpoints/sharded_checkpoint_reader.h"
#include "worker_runtime/data_parallel/optimizer_state.h"
#include "worker_runtime/sharded/sharded_access.h"

namespace ctrun::worker {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "ctrun-sharded-checkpoint-1";
constexpr const char* kMetadata = "metadata.json";
constexpr const char* kRng = "rng_cpu";

// The names tensors have in a checkpoint.
std::string model_key(const std::string& name) { return "model/" + name; }
std::string state_key(const std::string& name, const std::string& field) {
  return "optimizer/" + name + "/" + field;
}
std::string shard_file(int rank) { return "shard-" + std::to_string(rank) + ".bin"; }

at::ScalarType scalar_type_named(const std::string& name) {
  for (auto type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kByte, at::kChar,
                    at::kShort, at::kInt, at::kLong, at::kBool}) {
    if (name == c10::toString(type)) return type;
  }
  throw std::runtime_error("unknown tensor type '" + name + "'");
}

at::Tensor on_cpu(const at::Tensor& t) { return t.detach().to(at::kCPU).contiguous(); }

// Buffers and frozen parameters: whole on every rank, written by rank 0.
std::vector<std::pair<std::string, at::Tensor>> replicated_tensors(const torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : m.named_parameters()) {
    if (!item.value().requires_grad()) out.emplace_back(item.key(), item.value());
  }
  for (const auto& item : m.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

// One rank's file as it is written, and the chunks it adds to the metadata.
class ShardFileWriter {
 public:
  ShardFileWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  void append(const at::Tensor& tensor) {
    const at::Tensor cpu = on_cpu(tensor);
    auto written = rendezvous::write_fully(
        fd_, {static_cast<const char*>(cpu.data_ptr()), cpu.nbytes()}, path_);
    if (!written) throw std::runtime_error(written.error().message);
    bytes_ += static_cast<int64_t>(cpu.nbytes());
  }
  int64_t bytes() const { return bytes_; }

 private:
  int fd_;
  std::string path_;
  int64_t bytes_ = 0;
};

void add_chunk(nlohmann::json& tensors, const std::string& key, const at::Tensor& like,
               const std::vector<int64_t>& shape, int64_t offset, int64_t length,
               const std::string& file, int64_t byte) {
  nlohmann::json& entry = tensors[key];
  if (!entry.contains("shape")) {
    entry["shape"] = shape;
    entry["dtype"] = c10::toString(like.scalar_type());
    entry["chunks"] = nlohmann::json::array();
  }
  entry["chunks"].push_back(
      {{"offset", offset}, {"length", length}, {"file", file}, {"byte", byte}});
}

// The fields the optimizer keeps for the first unit's shard (the same for every unit, on every
// rank: they all step together); none before the first step.
std::vector<std::string> state_fields(const torch::optim::Optimizer& optimizer,
                                      const std::vector<ShardedUnitView>& units) {
  std::vector<std::string> fields;
  if (auto state = read_param_state(optimizer, units.front().shard)) {
    for (const auto& [name, tensor] : state->fields) fields.push_back(name);
  }
  return fields;
}

// Tensor `name` read from a whole checkpoint's module archive, where a dotted name is a path of
// nested archives (torch::nn::Module::save's layout).
at::Tensor read_archived(torch::serialize::InputArchive& archive, const std::string& name,
                         bool is_buffer) {
  const auto dot = name.find('.');
  if (dot == std::string::npos) {
    at::Tensor t;
    if (!archive.try_read(name, t, is_buffer)) {
      throw std::runtime_error("it has no tensor '" + name + "'");
    }
    return t;
  }
  torch::serialize::InputArchive child;
  if (!archive.try_read(name.substr(0, dot), child)) {
    throw std::runtime_error("it has no module '" + name.substr(0, dot) + "'");
  }
  return read_archived(child, name.substr(dot + 1), is_buffer);
}

void check_shape(const std::string& name, const std::vector<int64_t>& saved,
                 const std::vector<int64_t>& model) {
  if (saved != model) {
    throw std::runtime_error("tensor '" + name + "' has shape " + c10::str(at::IntArrayRef(saved)) +
                             ", the model's " + c10::str(at::IntArrayRef(model)));
  }
}

void restore_rng(const at::Tensor& state) {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard lock(generator.mutex());
  generator.set_state(state);
}

// The pieces of a unit's shard, each read by `read(tensor index, tensor offset, destination)`,
// into a new shard-shaped tensor (the padding zero), on the shard's device.
at::Tensor assemble_shard(const ShardedUnitView& unit, int rank,
                          const std::function<void(std::size_t, int64_t, at::Tensor)>& read) {
  at::Tensor cpu = at::zeros({unit.layout.shard}, unit.shard.options().device(at::kCPU));
  for (const auto& piece : unit.layout.pieces(rank)) {
    read(piece.tensor, piece.tensor_offset, cpu.narrow(0, piece.shard_offset, piece.length));
  }
  return cpu.to(unit.shard.device());
}

// Loads values into `model`'s shards: `read_values` fills pieces of parameter values, and
// `read_state` (when the checkpoint has optimizer state: step and fields) pieces of each field.
void load_into_shards(ShardedDataParallel& model, torch::optim::Optimizer& optimizer,
                      const std::function<void(const std::string&, int64_t, at::Tensor)>& values,
                      std::optional<std::int64_t> step, const std::vector<std::string>& fields,
                      const std::function<void(const std::string&, const std::string&, int64_t,
                                               at::Tensor)>& field_values) {
  at::NoGradGuard no_grad;
  const int rank = ShardedAccess::group(model).rank();
  ShardedAccess::release_all(model);
  for (const auto& unit : ShardedAccess::units(model)) {
    unit.shard.detach().copy_(
        assemble_shard(unit, rank, [&](std::size_t t, int64_t offset, at::Tensor out) {
          values(unit.names[t], offset, out);
        }));
    if (!step) continue;
    ParamState state;
    state.step = *step;
    for (const auto& field : fields) {
      state.fields.emplace_back(
          field, assemble_shard(unit, rank, [&](std::size_t t, int64_t offset, at::Tensor out) {
            field_values(unit.names[t], field, offset, out);
          }));
    }
    write_param_state(optimizer, unit.shard, state);
  }
}

}  // namespace

// ---- reading ----

ShardedCheckpointReader::ShardedCheckpointReader(std::string directory)
    : directory_(std::move(directory)) {
  const std::string path = directory_ + "/" + kMetadata;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  try {
    metadata_ = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + " is not JSON: " + first_line(e.what()));
  }
  if (metadata_.value("format", "") != kFormat) {
    throw std::runtime_error(path + ": not a ctrun sharded checkpoint (format '" +
                             metadata_.value("format", "") + "')");
  }
}

ShardedCheckpointReader::~ShardedCheckpointReader() {
  for (const auto& [name, fd] : files_) ::close(fd);
}

TrainingProgress ShardedCheckpointReader::progress() const {
  return progress_from_json(metadata_.at("progress"));
}

std::int64_t ShardedCheckpointReader::optimizer_step() const {
  return metadata_.at("optimizer_step").get<std::int64_t>();
}

std::vector<std::string> ShardedCheckpointReader::optimizer_fields() const {
  return metadata_.at("optimizer_fields").get<std::vector<std::string>>();
}

bool ShardedCheckpointReader::has(const std::string& name) const {
  return metadata_.at("tensors").contains(name);
}

const nlohmann::json& ShardedCheckpointReader::entry(const std::string& name) const {
  const auto& tensors = metadata_.at("tensors");
  const auto found = tensors.find(name);
  if (found == tensors.end()) {
    throw std::runtime_error("checkpoint " + directory_ + " has no tensor '" + name + "'");
  }
  return *found;
}

std::vector<int64_t> ShardedCheckpointReader::shape(const std::string& name) const {
  return entry(name).at("shape").get<std::vector<int64_t>>();
}

int ShardedCheckpointReader::file(const std::string& name) const {
  if (name.find('/') != std::string::npos) {
    throw std::runtime_error("checkpoint " + directory_ + ": bad file name '" + name + "'");
  }
  auto found = files_.find(name);
  if (found != files_.end()) return found->second;
  const std::string path = directory_ + "/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  files_[name] = fd;
  return fd;
}

void ShardedCheckpointReader::read(const std::string& name, int64_t offset, at::Tensor out) const {
  const nlohmann::json& e = entry(name);
  if (scalar_type_named(e.at("dtype").get<std::string>()) != out.scalar_type()) {
    throw std::runtime_error("checkpoint " + directory_ + ": tensor '" + name + "' is " +
                             e.at("dtype").get<std::string>() + ", expected " +
                             c10::toString(out.scalar_type()));
  }
  const int64_t element = static_cast<int64_t>(out.element_size());
  const int64_t end = offset + out.numel();
  auto* base = static_cast<char*>(out.data_ptr());
  int64_t covered = 0;
  for (const auto& chunk : e.at("chunks")) {
    const int64_t chunk_offset = chunk.at("offset").get<int64_t>();
    const int64_t chunk_end = chunk_offset + chunk.at("length").get<int64_t>();
    const int64_t from = std::max(offset, chunk_offset);
    const int64_t to = std::min(end, chunk_end);
    if (from >= to) continue;
    const std::string file_name = chunk.at("file").get<std::string>();
    const int fd = file(file_name);
    char* dest = base + (from - offset) * element;
    std::size_t left = static_cast<std::size_t>((to - from) * element);
    off_t at =
        static_cast<off_t>(chunk.at("byte").get<int64_t>() + (from - chunk_offset) * element);
    while (left > 0) {
      const ssize_t n = ::pread(fd, dest, left, at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw std::runtime_error("checkpoint " + directory_ + ": " + file_name +
                                 " is shorter than its metadata says (tensor '" + name + "')");
      }
      dest += n;
      left -= static_cast<std::size_t>(n);
      at += n;
    }
    covered += to - from;
  }
  if (covered != out.numel()) {
    throw std::runtime_error("checkpoint " + directory_ + ": tensor '" + name +
                             "' misses elements in [" + std::to_string(offset) + ", " +
                             std::to_string(end) + ")");
  }
}

at::Tensor ShardedCheckpointReader::read_whole(const std::string& name) const {
  const nlohmann::json& e = entry(name);
  at::Tensor out =
      at::empty(shape(name), at::TensorOptions().dtype(scalar_type_named(e.at("dtype"))));
  read(name, 0, out.view({-1}));
  return out;
}

TrainingProgress load_sharded_into_whole(const std::string& directory, torch::nn::Module& module,
                                         torch::optim::Optimizer& optimizer) {
  ShardedCheckpointReader reader(directory);
  at::NoGradGuard no_grad;
  const auto fields = reader.optimizer_fields();
  // All checked before anything is copied: a checkpoint of another model changes nothing.
  for (const auto& item : module.named_parameters()) {
    check_shape(item.key(), reader.shape(model_key(item.key())), item.value().sizes().vec());
  }
  for (const auto& item : module.named_parameters()) {
    at::Tensor p = item.value();
    const std::string key = model_key(item.key());
    p.detach().copy_(reader.read_whole(key));
    if (fields.empty() || !p.requires_grad()) continue;
    ParamState state;
    state.step = reader.optimizer_step();
    for (const auto& field : fields) {
      state.fields.emplace_back(field,
                                reader.read_whole(state_key(item.key(), field)).to(p.device()));
    }
    write_param_state(optimizer, p, state);
  }
  for (const auto& item : module.named_buffers()) {
    const std::string key = model_key(item.key());
    if (reader.has(key)) item.value().detach().copy_(reader.read_whole(key));
  }
  restore_rng(reader.read_whole(kRng));
  return reader.progress();
}

// ---- the checkpointer ----

namespace {

// What one save writes, as this rank sees it.
struct SavePlan {
  std::vector<ShardedUnitView> units;
  std::vector<std::string> fields;
  std::vector<std::pair<std::string, at::Tensor>> replicated;
  int stage = 0;
  int world = 1;
  int rank = 0;
  std::string directory;
  std::string temp_dir;
  std::string final_dir;
  int keep = 2;
};

// This rank's file in the temporary directory: its shards of each unit, each followed by its
// shards of the optimizer's fields; rank 0's also the replicated tensors and the generator.
// Returns the error, empty when the file is whole.
std::string write_rank_file(const SavePlan& plan, const torch::optim::Optimizer& optimizer) {
  std::string error;
  try {
    std::error_code ec;
    fs::create_directories(plan.temp_dir, ec);
    if (ec) throw std::runtime_error("checkpoint: create " + plan.temp_dir + ": " + ec.message());
    const std::string path = plan.temp_dir + "/" + shard_file(plan.rank);
    write_file_durably(path, [&](int fd, std::string& write_error) {
      try {
        ShardFileWriter writer(fd, path);
        for (const auto& unit : plan.units) {
          writer.append(unit.shard);
          const auto state = read_param_state(optimizer, unit.shard);
          if (!state && !plan.fields.empty()) {
            throw std::runtime_error("the optimizer has no state for a shard of '" +
                                     unit.names.front() + "'");
          }
          for (const auto& field : plan.fields) {
            const auto found = std::find_if(state->fields.begin(), state->fields.end(),
                                            [&](const auto& f) { return f.first == field; });
            if (found == state->fields.end()) {
              throw std::runtime_error("the optimizer keeps no '" + field + "' for a shard of '" +
                                       unit.names.front() + "'");
            }
            writer.append(found->second);
          }
        }
        if (plan.rank == 0) {
          for (const auto& [name, tensor] : plan.replicated) writer.append(tensor);
          auto generator = at::detail::getDefaultCPUGenerator();
          std::lock_guard lock(generator.mutex());
          writer.append(generator.get_state());
        }
        return true;
      } catch (const std::exception& e) {
        write_error = first_line(e.what());
        return false;
      }
    });
  } catch (const std::exception& e) {
    error = first_line(e.what());
  }
  return error;
}

// Rank 0's part, once every rank's file is whole: the metadata, the rename, the pruning.
void complete_save(const SavePlan& plan, const torch::optim::Optimizer& optimizer,
                   const TrainingProgress& progress) {
  // The metadata: where each rank's file put each chunk of each tensor (the layouts are the
  // same on every rank, so rank 0 knows them all).
  nlohmann::json tensors = nlohmann::json::object();
  const int64_t element = static_cast<int64_t>(plan.units.front().shard.element_size());
  int64_t byte = 0;
  for (const auto& unit : plan.units) {
    const int64_t block = unit.layout.shard * element;  // one shard-sized block in every file
    for (int r = 0; r < plan.world; ++r) {
      for (const auto& piece : unit.layout.pieces(r)) {
        const std::string& name = unit.names[piece.tensor];
        const int64_t within = piece.shard_offset * element;
        add_chunk(tensors, model_key(name), unit.shard, unit.shapes[piece.tensor],
                  piece.tensor_offset, piece.length, shard_file(r), byte + within);
        for (std::size_t f = 0; f < plan.fields.size(); ++f) {
          add_chunk(tensors, state_key(name, plan.fields[f]), unit.shard, unit.shapes[piece.tensor],
                    piece.tensor_offset, piece.length, shard_file(r),
                    byte + static_cast<int64_t>(f + 1) * block + within);
        }
      }
    }
    byte += static_cast<int64_t>(1 + plan.fields.size()) * block;
  }
  for (const auto& [name, tensor] : plan.replicated) {
    add_chunk(tensors, model_key(name), tensor, tensor.sizes().vec(), 0, tensor.numel(),
              shard_file(0), byte);
    byte += static_cast<int64_t>(tensor.numel() * tensor.element_size());
  }
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard lock(generator.mutex());
    const at::Tensor rng = generator.get_state();
    add_chunk(tensors, kRng, rng, rng.sizes().vec(), 0, rng.numel(), shard_file(0), byte);
  }
  std::int64_t optimizer_step = 0;
  if (auto state = read_param_state(optimizer, plan.units.front().shard))
    optimizer_step = state->step;
  const nlohmann::json metadata = {{"format", kFormat},
                                   {"world_size", plan.world},
                                   {"stage", plan.stage},
                                   {"progress", progress_to_json(progress)},
                                   {"optimizer_step", optimizer_step},
                                   {"optimizer_fields", plan.fields},
                                   {"tensors", tensors}};
  const std::string text = metadata.dump(1);
  const std::string metadata_path = plan.temp_dir + "/" + kMetadata;
  write_file_durably(metadata_path, [&](int fd, std::string& write_error) {
    auto written = rendezvous::write_fully(fd, text, metadata_path);
    if (!written) write_error = written.error().message;
    return bool(written);
  });
  if (auto s = rendezvous::sync_directory(plan.temp_dir); !s) {
    throw std::runtime_error("checkpoint: " + s.error().message);
  }
  // A save of a step saved before (a restarted job) replaces it: the old one steps aside first,
  // and goes only once the new one is in place.
  const std::string old_dir = plan.final_dir + ".old";
  remove_tree(old_dir);
  if (path_exists(plan.final_dir)) ::rename(plan.final_dir.c_str(), old_dir.c_str());
  if (::rename(plan.temp_dir.c_str(), plan.final_dir.c_str()) != 0) {
    throw std::runtime_error("checkpoint: rename " + plan.temp_dir + " to " + plan.final_dir +
                             ": " + std::strerror(errno));
  }
  if (auto s = rendezvous::sync_directory(plan.directory); !s) {
    throw std::runtime_error("checkpoint: " + s.error().message);
  }
  prune_checkpoints(plan.directory, plan.keep);
}

// Whether `ok` holds on every rank (a collective): the ranks save and load as one.
bool on_every_rank(ProcessGroup& group, bool ok, const at::Device& device) {
  at::Tensor failures = at::tensor({ok ? 0L : 1L}, at::kLong).to(device);
  group.all_reduce(failures);
  return failures.item<int64_t>() == 0;
}

}  // namespace

ShardedCheckpointer::ShardedCheckpointer(std::string directory, int keep)
    : directory_(std::move(directory)), keep_(std::max(keep, 1)) {}

void ShardedCheckpointer::save(ShardedDataParallel& model, const torch::optim::Optimizer& optimizer,
                               const TrainingProgress& progress) const {
  ProcessGroup& group = ShardedAccess::group(model);
  SavePlan plan;
  plan.units = ShardedAccess::units(model);
  plan.fields = state_fields(optimizer, plan.units);
  plan.replicated = replicated_tensors(*model.module());
  plan.stage = model.stage();
  plan.world = group.size();
  plan.rank = group.rank();
  plan.directory = directory_;
  plan.final_dir = sharded_checkpoint_path(directory_, progress.step);
  plan.temp_dir = plan.final_dir + ".tmp";
  plan.keep = keep_;
  const at::Device device = plan.units.front().shard.device();
  std::string error = write_rank_file(plan, optimizer);
  if (!on_every_rank(group, error.empty(), device)) {
    throw std::runtime_error(!error.empty() ? error
                                            : "checkpoint: another rank could not write its "
                                              "shard of step " +
                                                  std::to_string(progress.step));
  }
  // The others wait for rank 0, so that none starts the next save (in a .tmp directory that
  // rank 0's pruning removes) before this one is in place, and all learn how it ended.
  if (plan.rank == 0) {
    try {
      complete_save(plan, optimizer, progress);
    } catch (const std::exception& e) {
      error = first_line(e.what());
    }
  }
  if (!on_every_rank(group, error.empty(), device)) {
    throw std::runtime_error(!error.empty() ? error
                                            : "checkpoint: rank 0 could not complete step " +
                                                  std::to_string(progress.step));
  }
}

namespace {

// One candidate into this rank's shards (no collective); throws when it does not read back.
TrainingProgress load_candidate(const CheckpointEntry& candidate, ShardedDataParallel& model,
                                torch::optim::Optimizer& optimizer) {
  const auto units = ShardedAccess::units(model);
  if (candidate.sharded) {
    ShardedCheckpointReader reader(candidate.path);
    for (const auto& unit : units) {
      for (std::size_t t = 0; t < unit.names.size(); ++t) {
        check_shape(unit.names[t], reader.shape(model_key(unit.names[t])), unit.shapes[t]);
      }
    }
    const auto fields = reader.optimizer_fields();
    load_into_shards(
        model, optimizer,
        [&](const std::string& name, int64_t offset, at::Tensor out) {
          reader.read(model_key(name), offset, out);
        },
        fields.empty() ? std::nullopt : std::optional(reader.optimizer_step()), fields,
        [&](const std::string& name, const std::string& field, int64_t offset, at::Tensor out) {
          reader.read(state_key(name, field), offset, out);
        });
    at::NoGradGuard no_grad;
    for (const auto& [name, tensor] : replicated_tensors(*model.module())) {
      if (reader.has(model_key(name))) {
        tensor.detach().copy_(reader.read_whole(model_key(name)));
      }
    }
    restore_rng(reader.read_whole(kRng));
    return reader.progress();
  }
  // A whole checkpoint (Checkpointer's): each tensor whole, then this rank's pieces of it.
  torch::serialize::InputArchive archive;
  archive.load_from(candidate.path);
  c10::IValue progress_value;
  archive.read("progress", progress_value);
  TrainingProgress progress =
      progress_from_json(nlohmann::json::parse(progress_value.toStringRef()));
  torch::serialize::InputArchive modules;
  archive.read("model", modules);
  std::map<std::string, at::Tensor> whole;
  for (const auto& unit : units) {
    for (std::size_t t = 0; t < unit.names.size(); ++t) {
      at::Tensor value = read_archived(modules, unit.names[t], false);
      check_shape(unit.names[t], value.sizes().vec(), unit.shapes[t]);
      whole[unit.names[t]] = value.to(at::kCPU).to(unit.shard.scalar_type()).contiguous();
    }
  }
  // Its optimizer was over every parameter of the module, in order: read it into one of the
  // same kind over tensors of those shapes.
  std::vector<at::Tensor> stand_ins;
  std::map<std::string, at::Tensor> stand_in_of;
  std::map<std::string, std::vector<int64_t>> sharded_shape;
  for (const auto& unit : units) {
    for (std::size_t t = 0; t < unit.names.size(); ++t) {
      sharded_shape[unit.names[t]] = unit.shapes[t];
    }
  }
  for (const auto& item : model.module()->named_parameters()) {
    const auto sharded = sharded_shape.find(item.key());
    stand_ins.push_back(
        at::zeros(sharded != sharded_shape.end() ? sharded->second : item.value().sizes().vec(),
                  item.value().options().device(at::kCPU).requires_grad(false)));
    stand_in_of[item.key()] = stand_ins.back();
  }
  auto stand_in_optimizer = optimizer_like(optimizer, stand_ins);
  torch::serialize::InputArchive optimizer_archive;
  archive.read("optimizer", optimizer_archive);
  stand_in_optimizer->load(optimizer_archive);
  std::optional<std::int64_t> step;
  std::vector<std::string> fields;
  std::map<std::string, std::map<std::string, at::Tensor>> state_of;
  for (const auto& [name, tensor] : stand_in_of) {
    if (auto state = read_param_state(*stand_in_optimizer, tensor)) {
      step = state->step;
      fields.clear();
      for (const auto& [field, value] : state->fields) {
        fields.push_back(field);
        state_of[name][field] = value.to(at::kCPU).contiguous();
      }
    }
  }
  load_into_shards(
      model, optimizer,
      [&](const std::string& name, int64_t offset, at::Tensor out) {
        out.copy_(whole.at(name).view({-1}).narrow(0, offset, out.numel()));
      },
      step, fields,
      [&](const std::string& name, const std::string& field, int64_t offset, at::Tensor out) {
        out.copy_(state_of.at(name).at(field).view({-1}).narrow(0, offset, out.numel()));
      });
  at::NoGradGuard no_grad;
  for (const auto& item : model.module()->named_parameters()) {
    if (sharded_shape.count(item.key()) == 0) {
      item.value().detach().copy_(read_archived(modules, item.key(), false));
    }
  }
  for (const auto& item : model.module()->named_buffers()) {
    item.value().detach().copy_(read_archived(modules, item.key(), true));
  }
  at::Tensor rng;
  archive.read("rng_cpu", rng);
  restore_rng(rng);
  return progress;
}

}  // namespace

std::optional<TrainingProgress> ShardedCheckpointer::load_latest(
    ShardedDataParallel& model, torch::optim::Optimizer& optimizer) const {
  ProcessGroup& group = ShardedAccess::group(model);
  const at::Device device = ShardedAccess::units(model).front().shard.device();
  // Every rank tries the same candidates (the directory is shared) and takes one only if every
  // rank read its part of it: the ranks never resume from different steps.
  for (const auto& candidate : list_checkpoints(directory_)) {
    std::optional<TrainingProgress> progress;
    std::string error;
    try {
      progress = load_candidate(candidate, model, optimizer);
    } catch (const std::exception& e) {
      error = first_line(e.what());
    }
    if (on_every_rank(group, error.empty(), device)) {
      ShardedAccess::gather_shards(model);  // stages 1-2: every rank's shard, whole
      return progress;
    }
    std::cerr << "[ctrun] checkpoint " << candidate.path << " is unreadable, trying an older one: "
              << (error.empty() ? "another rank could not read its part" : error) << std::endl;
  }
  return std::nullopt;
}

}  // namespace ctrun::worker

// gpt: a small byte-level transformer language model trained data-parallel on generated prose
// (or --text FILE): many parameters, many gradient buckets, overlap that matters.
//   ctrun --standalone --nproc_per_node=2 build/trainers/gpt --epochs 1 --max_steps 50
#include <ATen/autocast_mode.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include <torch/version.h>
#include "ctrun/worker/optimizers.h"

#include "src/gpt_model.h"
#include "src/text_corpus.h"
#include "src/trainer_main.h"

namespace {

using namespace ctrun::trainers;

// bf16 autocast for the forward pass, as torch.autocast("cuda", torch.bfloat16) does.
class Bf16Autocast {
 public:
  explicit Bf16Autocast(bool on) : on_(on) {
    if (on_) enable(true);
  }
  ~Bf16Autocast() {
    if (!on_) return;
    enable(false);
    at::autocast::clear_cache();
  }

 private:
  // LibTorch 2.4 replaced the CUDA-only calls with per-device ones (the old are deprecated).
  static void enable(bool enabled) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCUDA, enabled);
#else
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(enabled);
#endif
  }

  bool on_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel byte-level transformer LM over libctrun_worker", "gpt"};
  GptConfig config;
  std::string text_path;
  std::size_t corpus_bytes = 1 << 20;
  bool bf16 = false;
  std::int64_t eval_windows = 64;
  app.add_option("--text", text_path, "Train on this file instead of generated prose");
  app.add_option("--corpus_bytes", corpus_bytes, "Size of the generated corpus")
      ->check(CLI::Range(std::size_t{1024}, std::size_t{1} << 32));
  app.add_option("--context", config.context, "Bytes of context")->check(CLI::Range(2, 4096));
  auto* width = app.add_option("--width", config.width, "Model width")->check(CLI::Range(8, 8192));
  auto* layers =
      app.add_option("--layers", config.layers, "Transformer blocks")->check(CLI::Range(1, 256));
  auto* heads = app.add_option("--heads", config.heads, "Attention heads (divide --width)")
                    ->check(CLI::Range(1, 256));
  // GPT-2's shapes (with a byte vocabulary: a few million parameters fewer), for models whose
  // training state no longer fits one rank's memory without --zero.
  std::string size;
  app.add_option("--size", size,
                 "GPT-2's width, layers and heads: small (85 M parameters), medium (302 M), "
                 "large (709 M), xl (1.47 B)")
      ->check(CLI::IsMember({"small", "medium", "large", "xl"}))
      ->excludes(width)
      ->excludes(layers)
      ->excludes(heads);
  app.add_flag("--bf16", bf16,
               "bfloat16 autocast in the forward pass (--device cuda); with --zero, bf16 "
               "parameters and gradients too, the optimizer on fp32 master shards");
  app.add_option("--eval_windows", eval_windows, "Windows in the final evaluation")
      ->check(CLI::PositiveNumber);
  // A transformer step is much heavier than the MLP's: a smaller batch, GPT-like rate.
  TrainOptions defaults;
  defaults.batch_size = 16;
  defaults.lr = 3e-4;
  return trainer_main(app, argc, argv, defaults, [&](const TrainOptions& options, const Run& run) {
    if (size == "small") config = {config.vocab, config.context, 768, 12, 12};
    if (size == "medium") config = {config.vocab, config.context, 1024, 24, 16};
    if (size == "large") config = {config.vocab, config.context, 1280, 36, 20};
    if (size == "xl") config = {config.vocab, config.context, 1600, 48, 25};
    if (config.width % config.heads != 0) {
      throw std::invalid_argument("--heads " + std::to_string(config.heads) +
                                  " does not divide --width " + std::to_string(config.width));
    }
    if (bf16 && run.device.is_cpu()) throw std::invalid_argument("--bf16 needs --device cuda");
    const std::string text =
        text_path.empty() ? generate_corpus(corpus_bytes, options.seed) : read_corpus(text_path);
    const int64_t window = config.context + 1;  // inputs and the next byte of each
    const int64_t windows = static_cast<int64_t>(text.size()) / window;
    if (windows < 1) throw std::invalid_argument("the corpus is shorter than one context window");
    auto bytes = torch::from_blob(const_cast<char*>(text.data()), {windows * window}, torch::kUInt8)
                     .to(torch::kLong)
                     .view({windows, window})
                     .to(run.device);
    auto model = Gpt(config);
    model->to(run.device);
    // Captured as a shared_ptr: its pointee stays mutable inside a const lambda.
    std::shared_ptr<GptImpl> net = model.ptr();
    auto loss_on = [net, bytes, bf16, device = run.device](const torch::Tensor& indices) {
      const torch::Tensor rows = bytes.index_select(0, indices.to(device));
      Bf16Autocast autocast(bf16);
      const torch::Tensor logits = net->forward(rows.slice(1, 0, -1));
      return torch::nn::functional::cross_entropy(
          logits.reshape({-1, logits.size(2)}).to(torch::kFloat), rows.slice(1, 1).reshape({-1}));
    };
    TrainTask task;
    task.model = net;
    task.dataset_size = static_cast<std::uint64_t>(windows);
    task.loss = loss_on;
    task.evaluate = [loss_on, windows, eval_windows] {
      torch::NoGradGuard no_grad;
      return loss_on(torch::arange(std::min(windows, eval_windows), torch::kLong)).item<double>();
    };
    task.make_optimizer = [kernel =
                               ctrun::worker::parse_optimizer_kernel(options.optimizer_kernel)](
                              std::vector<torch::Tensor> parameters,
                              double lr) -> std::unique_ptr<torch::optim::Optimizer> {
      return std::make_unique<ctrun::worker::AdamW>(std::move(parameters),
                                                    torch::optim::AdamWOptions(lr), kernel);
    };
    for (const auto& block : net->blocks()) task.shard_units.push_back(block.ptr());
    if (bf16) task.shard_param_dtype = torch::kBFloat16;
    task.route_unit_forward = [net](ctrun::worker::UnitForward forward) {
      net->set_unit_forward(std::move(forward));
    };
    return task;
  });
}

// mlp: the seeds' model (784 -> 256 -> ReLU -> 10, cross-entropy, Adam) trained data-parallel on
// a synthetic dataset every rank generates identically from --seed:
//   ctrun --standalone --nproc_per_node=2 build/trainers/mlp --epochs 3
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include "ctrun/worker/optimizers.h"

#include <ATen/CPUGeneratorImpl.h>

#include "src/trainer_main.h"

namespace {

using namespace ctrun::trainers;

struct SyntheticDigits {
  torch::Tensor inputs;  // [n, 784]
  torch::Tensor labels;  // [n]
};

// Inputs from a normal distribution, labels from a fixed random linear "teacher": learnable,
// and the same on every rank without reading a file.
SyntheticDigits make_data(std::int64_t n, std::uint64_t seed, const torch::Device& device) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x5eedda7aULL);
  SyntheticDigits d;
  d.inputs = at::randn({n, 784}, generator, torch::kFloat);
  const torch::Tensor teacher = at::randn({784, 10}, generator, torch::kFloat);
  d.labels = d.inputs.matmul(teacher).argmax(1);
  d.inputs = d.inputs.to(device);
  d.labels = d.labels.to(device);
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel MLP on synthetic digits (the seeds' model) over libctrun_worker",
               "mlp"};
  std::int64_t samples = 10000;
  app.add_option("--samples", samples, "Synthetic dataset size")->check(CLI::PositiveNumber);
  return trainer_main(
      app, argc, argv, TrainOptions{}, [&](const TrainOptions& options, const Run& run) {
        auto data = std::make_shared<SyntheticDigits>(make_data(samples, options.seed, run.device));
        auto model = std::make_shared<torch::nn::SequentialImpl>(
            torch::nn::Linear(784, 256), torch::nn::ReLU(), torch::nn::Linear(256, 10));
        model->to(run.device);
        TrainTask task;
        task.model = model;
        task.dataset_size = static_cast<std::uint64_t>(samples);
        task.loss = [model, data, device = run.device](const torch::Tensor& indices) {
          const torch::Tensor idx = indices.to(device);
          return torch::nn::functional::cross_entropy(
              model->forward(data->inputs.index_select(0, idx)), data->labels.index_select(0, idx));
        };
        task.evaluate = [model, data] {
          torch::NoGradGuard no_grad;
          return torch::nn::functional::cross_entropy(model->forward(data->inputs), data->labels)
              .item<double>();
        };
        task.make_optimizer = [kernel =
                                   ctrun::worker::parse_optimizer_kernel(options.optimizer_kernel)](
                                  std::vector<torch::Tensor> parameters,
                                  double lr) -> std::unique_ptr<torch::optim::Optimizer> {
          return std::make_unique<ctrun::worker::Adam>(std::move(parameters),
                                                       torch::optim::AdamOptions(lr), kernel);
        };
        return task;
      });
}

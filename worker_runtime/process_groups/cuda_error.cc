#include "worker_runtime/process_groups/cuda_error.h"

#include <ATen/ATen.h>

#include <iostream>

#include "ctrun/worker/heartbeat.h"

namespace ctrun::worker {

void make_cuda_error(int device, const std::string& message) {
  std::cerr << message << ": launching a kernel that fails on cuda:" << device
            << " (an index out of bounds: a device-side assert)" << std::endl;
  const auto on_device =
      at::TensorOptions().device(at::kCUDA, static_cast<c10::DeviceIndex>(device));
  const at::Tensor values = at::zeros({1}, on_device.dtype(at::kFloat));
  const at::Tensor past_the_end = at::ones({1}, on_device.dtype(at::kLong));
  // Advanced indexing checks its indices on the device, not the host: the kernel asserts.
  const at::Tensor picked = values.index({past_the_end});
  // The copy to the host waits for the kernel and raises its error.
  (void)picked.cpu();
  throw InjectedFault(message +
                      ": the failing kernel did not fail on cuda:" + std::to_string(device));
}

}  // namespace ctrun::worker

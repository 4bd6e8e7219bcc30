// A planned CUDA error (`ctrun --faults` kind cuda_error), made the way a GPU fault breaks a
// training process: a kernel that fails on the device, leaving the process's CUDA context
// unusable, so that every later CUDA call (NCCL's included) fails too.
#pragma once

#include <string>

namespace ctrun::worker {

// Launches a kernel that indexes out of bounds on CUDA device `device` (a device-side assert)
// and waits for it: throws LibTorch's error for it ("CUDA error: device-side assert
// triggered"). Logs `message` (which fault) with the device first. Never returns.
[[noreturn]] void make_cuda_error(int device, const std::string& message);

}  // namespace ctrun::worker

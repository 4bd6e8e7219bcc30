// The torch classes the runtime's public headers name by reference only, declared here without
// torch's own headers: a file that includes those headers compiles without LibTorch's (slow)
// ones. No torch code: the torch-free base's.
#pragma once

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

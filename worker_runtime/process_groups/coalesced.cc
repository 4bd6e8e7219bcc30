#include "worker_runtime/process_groups/coalesced.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <string>
#include <utility>

namespace ctrun::worker {

void broadcast_coalesced(ProcessGroup& group, const std::vector<at::Tensor>& tensors) {
  if (group.size() == 1) return;
  at::NoGradGuard no_grad;
  std::map<std::pair<int, std::string>, std::vector<at::Tensor>> groups;
  for (const auto& t : tensors) {
    groups[{static_cast<int>(t.scalar_type()), t.device().str()}].push_back(t);
  }
  for (auto& [key, members] : groups) {
    std::vector<at::Tensor> flat_views;
    for (const auto& t : members) flat_views.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_views);
    group.broadcast(flat, 0);
    int64_t offset = 0;
    for (auto& t : members) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace ctrun::worker

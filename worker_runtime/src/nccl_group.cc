#include "nccl_group.h"

#ifdef CTRUN_WITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

#include <ATen/ATen.h>

#include <cstring>
#include <thread>

namespace ctrun::worker {

#ifndef CTRUN_WITH_NCCL

bool nccl_available() { return false; }

std::unique_ptr<ProcessGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>&, int, int, int,
                                              std::chrono::milliseconds) {
  throw CollectiveError(
      "nccl: this build of libctrun_worker has no NCCL backend (CUDA and NCCL were not found "
      "when it was configured); use --backend gloo");
}

#else

bool nccl_available() { return true; }

namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw CollectiveError(std::string("nccl: ") + what + ": " + cudaGetErrorString(rc));
  }
}

void check_nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess && rc != ncclInProgress) {
    throw CollectiveError(std::string("nccl: ") + what + ": " + ncclGetErrorString(rc));
  }
}

ncclDataType_t nccl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
    case at::kBool:  // the same bytes
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    default:
      throw CollectiveError(std::string("nccl: unsupported tensor type ") +
                            c10::toString(t.scalar_type()));
  }
}

// One communicator on one device, with its own stream. The stream is created blocking, so it
// is ordered against the legacy default stream, where LibTorch queues kernels unless the
// program picks other streams: a collective sees the gradients backward wrote, and later
// kernels see its result.
class NcclComm {
 public:
  NcclComm(ncclComm_t comm, cudaStream_t stream, int device, std::chrono::milliseconds timeout)
      : comm_(comm), stream_(stream), device_(device), timeout_(timeout) {}
  ~NcclComm() {
    cudaSetDevice(device_);
    if (aborted_) {
      ncclCommAbort(comm_);
    } else {
      ncclCommDestroy(comm_);
    }
    cudaStreamDestroy(stream_);
  }

  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

  // Waits for `event` on the host, polling NCCL for asynchronous errors (a dead peer), and
  // aborts the communicator when the deadline passes: a timeout, not a hang.
  void wait_for(cudaEvent_t event, const char* op) {
    const auto deadline = Clock::now() + timeout_;
    auto pause = std::chrono::microseconds(5);
    for (;;) {
      const cudaError_t rc = cudaEventQuery(event);
      if (rc == cudaSuccess) return;
      if (rc != cudaErrorNotReady) check_cuda(rc, op);
      ncclResult_t async_error = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async_error), op);
      if (async_error != ncclSuccess && async_error != ncclInProgress) {
        aborted_ = true;
        throw CollectiveError(std::string("nccl ") + op +
                              " failed: " + ncclGetErrorString(async_error));
      }
      if (Clock::now() > deadline) {
        aborted_ = true;
        throw CollectiveError(std::string("nccl ") + op + " timed out after " +
                              std::to_string(timeout_.count()) + " ms (a peer is gone or stuck)");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
  std::chrono::milliseconds timeout_;
  bool aborted_ = false;
};

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclComm> comm, at::Tensor keep_alive, const char* op)
      : comm_(std::move(comm)), tensor_(std::move(keep_alive)), op_(op) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(event_, comm_->stream()), "cudaEventRecord");
  }
  ~NcclWork() override { cudaEventDestroy(event_); }
  void wait() override { comm_->wait_for(event_, op_); }

 private:
  std::shared_ptr<NcclComm> comm_;
  at::Tensor tensor_;  // the collective's buffer stays allocated until it is done
  const char* op_;
  cudaEvent_t event_ = nullptr;
};

class NcclGroup : public ProcessGroup {
 public:
  NcclGroup(std::shared_ptr<NcclComm> comm, int rank, int size)
      : ProcessGroup(rank, size), comm_(std::move(comm)) {}

  Backend backend() const override { return Backend::kNccl; }

  std::unique_ptr<Work> all_reduce_async(at::Tensor tensor) override {
    check_tensor(tensor);
    check_nccl(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                             nccl_type(tensor), ncclSum, comm_->comm(), comm_->stream()),
               "all_reduce");
    return std::make_unique<NcclWork>(comm_, std::move(tensor), "all_reduce");
  }

  void broadcast(at::Tensor tensor, int root) override {
    check_tensor(tensor);
    check_nccl(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                             nccl_type(tensor), root, comm_->comm(), comm_->stream()),
               "broadcast");
    NcclWork(comm_, tensor, "broadcast").wait();
  }

  std::vector<at::Tensor> all_gather(const at::Tensor& tensor) override {
    check_tensor(tensor);
    std::vector<int64_t> shape{size()};
    for (auto d : tensor.sizes()) shape.push_back(d);
    at::Tensor out = at::empty(shape, tensor.options());
    check_nccl(ncclAllGather(tensor.data_ptr(), out.data_ptr(), tensor.numel(), nccl_type(tensor),
                             comm_->comm(), comm_->stream()),
               "all_gather");
    NcclWork(comm_, out, "all_gather").wait();
    return out.unbind(0);
  }

  void barrier() override {
    // An all-reduce of one element on the group's device, as c10d's NCCL barrier does.
    at::Tensor one =
        at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, comm_->device()));
    all_reduce_async(one)->wait();
  }

 private:
  void check_tensor(const at::Tensor& t) const {
    if (!t.is_cuda() || t.get_device() != comm_->device() || !t.is_contiguous()) {
      throw CollectiveError("nccl: tensors must be contiguous and on cuda:" +
                            std::to_string(comm_->device()) + ", got one on " + t.device().str());
    }
  }

  std::shared_ptr<NcclComm> comm_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size, int device,
                                              std::chrono::milliseconds timeout) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    throw CollectiveError("nccl: no CUDA device is visible to this process");
  }
  if (device >= devices) {
    throw CollectiveError("nccl: LOCAL_RANK " + std::to_string(device) + " has no CUDA device (" +
                          std::to_string(devices) + " visible)");
  }
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  // Rank 0 makes the communicator's id; the others read it from the store.
  ncclUniqueId id;
  const std::string key = "nccl/unique_id";
  if (rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const auto* p = reinterpret_cast<const uint8_t*>(&id);
    store->set(key, std::vector<uint8_t>(p, p + sizeof(id)));
  } else {
    const std::vector<uint8_t> bytes = store->get(key);
    if (bytes.size() != sizeof(id)) throw CollectiveError("nccl: malformed unique id in the store");
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  return std::make_unique<NcclGroup>(std::make_shared<NcclComm>(comm, stream, device, timeout),
                                     rank, size);
}

#endif

}  // namespace ctrun::worker

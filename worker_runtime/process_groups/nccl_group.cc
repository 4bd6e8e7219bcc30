#include "worker_runtime/process_groups/nccl_group.h"

#ifdef CTRUN_WITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
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

// A CUDA event that marks the end of one collective on the group's stream.
class CudaEvent {
 public:
  explicit CudaEvent(cudaStream_t stream) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
    if (const cudaError_t rc = cudaEventRecord(event_, stream); rc != cudaSuccess) {
      cudaEventDestroy(event_);
      check_cuda(rc, "cudaEventRecord");
    }
  }
  ~CudaEvent() { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  cudaEvent_t get() const { return event_; }
  bool done(const char* op) const {
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc != cudaSuccess && rc != cudaErrorNotReady) check_cuda(rc, op);
    return rc == cudaSuccess;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// One communicator on one device, with its own stream, and a watchdog thread.
//
// Ordering is left to the GPU: the stream is created blocking, so a collective starts after the
// kernels LibTorch queued before it on the legacy default stream (backward's gradients), and a
// wait() makes that stream wait for the collective's event. The host never blocks on a
// gradient all-reduce, so the optimizer's kernels are queued while the GPU still reduces.
// What the host no longer sees, the watchdog does: it follows every collective in flight, and
// when one outlives the timeout or NCCL reports an asynchronous error (a dead peer) it aborts
// the communicator (which ends the stuck kernels) and records why; the next call on the group
// throws that as a CollectiveError.
class NcclComm {
 public:
  NcclComm(ncclComm_t comm, cudaStream_t stream, int device, std::chrono::milliseconds timeout)
      : comm_(comm), stream_(stream), device_(device), timeout_(timeout) {}
  ~NcclComm() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    cudaSetDevice(device_);
    // A non-blocking communicator is finalized (flushing what is queued) before it is freed;
    // one that does not finalize within the timeout is aborted instead. One the watchdog
    // aborted is gone already.
    if (!aborted_ && !released_) {
      try {
        settle(ncclCommFinalize(comm_), "finalize");
      } catch (const CollectiveError&) {
        aborted_ = true;
      }
    }
    if (!released_) {
      if (aborted_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommDestroy(comm_);
      }
    }
    cudaStreamDestroy(stream_);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int device() const { return device_; }

  // Queues one collective, `call(comm, stream)`, and hands it to the watchdog; `buffers` stay
  // allocated until it is done. Under the lock, so the watchdog cannot abort the communicator
  // in the middle of the call.
  template <typename Call>
  std::shared_ptr<CudaEvent> enqueue(const char* op, std::vector<at::Tensor> buffers, Call call) {
    std::shared_ptr<CudaEvent> event;
    {
      std::lock_guard lock(mutex_);
      if (!failure_.empty()) throw CollectiveError(failure_);
      settle(call(comm_, stream_), op);
      event = std::make_shared<CudaEvent>(stream_);
      if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watch(); });
      in_flight_.push_back({event, std::move(buffers), op, Clock::now() + timeout_});
    }
    wake_.notify_one();
    return event;
  }

  // The communicator is non-blocking (so that forming it can time out): a call may return
  // ncclInProgress, and NCCL wants no other call on it until its state has settled.
  void settle(ncclResult_t rc, const char* op) {
    check_nccl(rc, op);
    if (rc != ncclInProgress) return;
    const auto deadline = Clock::now() + timeout_;
    auto pause = std::chrono::microseconds(5);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &state), op);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        aborted_ = true;
        throw CollectiveError(failed_text(op, state));
      }
      if (Clock::now() > deadline) {
        aborted_ = true;
        throw CollectiveError(timed_out_text(op));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  // Throws what the watchdog found, if anything: every call on the group checks first.
  void check_healthy() {
    std::lock_guard lock(mutex_);
    if (!failure_.empty()) throw CollectiveError(failure_);
  }

  // Blocks the host until `event` (a collective whose result the caller reads now) is done.
  void wait_on_host(const CudaEvent& event, const char* op) {
    auto pause = std::chrono::microseconds(5);
    while (!event.done(op)) {
      check_healthy();
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    check_healthy();
  }

 private:
  struct InFlight {
    std::shared_ptr<CudaEvent> event;
    std::vector<at::Tensor> buffers;
    const char* op;
    Clock::time_point deadline;
  };

  void watch() {
    cudaSetDevice(device_);
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      try {
        while (!in_flight_.empty() && in_flight_.front().event->done(in_flight_.front().op)) {
          in_flight_.pop_front();
        }
      } catch (const CollectiveError& e) {
        fail(e.what());
        continue;
      }
      if (in_flight_.empty()) {
        wake_.wait(lock);
        continue;
      }
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      const InFlight& oldest = in_flight_.front();
      if (state != ncclSuccess && state != ncclInProgress) {
        fail(failed_text(oldest.op, state));
      } else if (Clock::now() > oldest.deadline) {
        fail(timed_out_text(oldest.op));
      } else {
        // Completion is not urgent here (the GPU orders the work): a light poll.
        wake_.wait_for(lock, std::chrono::milliseconds(1));
      }
    }
  }

  static std::string failed_text(const char* op, ncclResult_t state) {
    return std::string("nccl ") + op + " failed: " + ncclGetErrorString(state);
  }
  std::string timed_out_text(const char* op) const {
    return std::string("nccl ") + op + " timed out after " + std::to_string(timeout_.count()) +
           " ms (a peer is gone or stuck)";
  }

  // Under mutex_, on the watchdog thread.
  void fail(const std::string& why) {
    failure_ = why;
    ncclCommAbort(comm_);  // ends the kernels that wait on a dead peer
    released_ = true;
    in_flight_.clear();
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
  std::chrono::milliseconds timeout_;
  bool aborted_ = false;   // to be aborted, not destroyed
  bool released_ = false;  // aborted by the watchdog: nothing left to free

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<InFlight> in_flight_;
  std::string failure_;
  bool stopping_ = false;
  std::thread watchdog_;
};

// A collective whose wait() orders the caller's later kernels after it, on the GPU.
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclComm> comm, std::shared_ptr<CudaEvent> event)
      : comm_(std::move(comm)), event_(std::move(event)) {}
  void wait() override {
    comm_->check_healthy();
    check_cuda(cudaStreamWaitEvent(cudaStreamLegacy, event_->get(), 0), "cudaStreamWaitEvent");
  }

 private:
  std::shared_ptr<NcclComm> comm_;
  std::shared_ptr<CudaEvent> event_;
};

class NcclGroup : public ProcessGroup {
 public:
  NcclGroup(std::shared_ptr<NcclComm> comm, int rank, int size)
      : ProcessGroup(rank, size), comm_(std::move(comm)) {}

  Backend backend() const override { return Backend::kNccl; }

  std::unique_ptr<Work> all_reduce_async(at::Tensor tensor) override {
    check_tensor(tensor);
    void* data = tensor.data_ptr();
    const ncclDataType_t type = nccl_type(tensor);
    const auto count = static_cast<std::size_t>(tensor.numel());
    auto event =
        comm_->enqueue("all_reduce", {std::move(tensor)}, [&](ncclComm_t c, cudaStream_t s) {
          return ncclAllReduce(data, data, count, type, ncclSum, c, s);
        });
    return std::make_unique<NcclWork>(comm_, std::move(event));
  }

  std::unique_ptr<Work> reduce_scatter_async(at::Tensor output, at::Tensor input) override {
    check_chunks("reduce_scatter", input, output);
    check_tensor(input);
    check_tensor(output);
    void* in = input.data_ptr();
    void* out = output.data_ptr();
    const ncclDataType_t type = nccl_type(input);
    const auto count = static_cast<std::size_t>(output.numel());
    auto event = comm_->enqueue("reduce_scatter", {std::move(input), std::move(output)},
                                [&](ncclComm_t c, cudaStream_t s) {
                                  return ncclReduceScatter(in, out, count, type, ncclSum, c, s);
                                });
    return std::make_unique<NcclWork>(comm_, std::move(event));
  }

  // In place when `input` is this rank's chunk of `output`, which NCCL allows.
  std::unique_ptr<Work> all_gather_into_async(at::Tensor output, at::Tensor input) override {
    check_chunks("all_gather", output, input);
    check_tensor(input);
    check_tensor(output);
    void* in = input.data_ptr();
    void* out = output.data_ptr();
    const ncclDataType_t type = nccl_type(input);
    const auto count = static_cast<std::size_t>(input.numel());
    auto event = comm_->enqueue(
        "all_gather", {std::move(input), std::move(output)},
        [&](ncclComm_t c, cudaStream_t s) { return ncclAllGather(in, out, count, type, c, s); });
    return std::make_unique<NcclWork>(comm_, std::move(event));
  }

  void broadcast(at::Tensor tensor, int root) override {
    check_tensor(tensor);
    auto event = comm_->enqueue("broadcast", {tensor}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), nccl_type(tensor),
                           root, c, s);
    });
    comm_->wait_on_host(*event, "broadcast");
  }

  std::vector<at::Tensor> all_gather(const at::Tensor& tensor) override {
    check_tensor(tensor);
    std::vector<int64_t> shape{size()};
    for (auto d : tensor.sizes()) shape.push_back(d);
    at::Tensor out = at::empty(shape, tensor.options());
    auto event = comm_->enqueue("all_gather", {out}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(tensor.data_ptr(), out.data_ptr(), tensor.numel(), nccl_type(tensor), c,
                           s);
    });
    comm_->wait_on_host(*event, "all_gather");
    return out.unbind(0);
  }

  void barrier() override {
    // An all-reduce of one element on the group's device, as c10d's NCCL barrier does, waited
    // on the host: a barrier holds the caller until every rank is there.
    at::Tensor one =
        at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, comm_->device()));
    auto event = comm_->enqueue("barrier", {one}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, c, s);
    });
    comm_->wait_on_host(*event, "barrier");
  }

  void send(const at::Tensor& tensor, int dst) override {
    check_tensor(tensor);
    auto event = comm_->enqueue("send", {tensor}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclSend(tensor.data_ptr(), tensor.numel(), nccl_type(tensor), dst, c, s);
    });
    comm_->wait_on_host(*event, "send");
  }

  void recv(at::Tensor tensor, int src) override {
    check_tensor(tensor);
    auto event = comm_->enqueue("recv", {tensor}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclRecv(tensor.data_ptr(), tensor.numel(), nccl_type(tensor), src, c, s);
    });
    comm_->wait_on_host(*event, "recv");
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
  // Non-blocking, so that a rank that never comes is a timeout (settle) and not a hang inside
  // ncclCommInitRank.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    check_nccl(rc, "ncclCommInitRank");
  }
  cudaStream_t stream = nullptr;
  if (const cudaError_t created = cudaStreamCreate(&stream); created != cudaSuccess) {
    ncclCommAbort(comm);
    check_cuda(created, "cudaStreamCreate");
  }
  auto owned = std::make_shared<NcclComm>(comm, stream, device, timeout);
  owned->settle(rc, "init (ncclCommInitRank)");
  return std::make_unique<NcclGroup>(std::move(owned), rank, size);
}

#endif

}  // namespace ctrun::worker

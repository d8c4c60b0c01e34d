// The NCCL backend of dist/collective.h: one rank per GPU of this process (ncclCommInitAll),
// device tensors. Built only with the CUDA backend and -DSUROGATE_NCCL=ON (kernels_native/
// CMakeLists.txt). UNTESTED ON A GPU: written against NCCL 2.32's nccl.h and compiled with
// nvcc (sm_90a) on a machine without GPUs; tests/native/test_collectives.py covers the threads
// backend only. Nothing in the trainer uses it yet (resolve_ranks refuses gpus > 1 on a GPU).
//
// Each call waits for the work already queued on its device's default stream (the stream every
// CUDA op launches on), runs on the rank's own stream and returns when the data has moved. The
// wait polls, so that abort() (another rank failed) ends it: the communicator is aborted
// (ncclCommAbort) and every later call fails.
//
// Differences from the threads backend: reductions follow NCCL's algorithms (ring / tree), not
// rank order, though every rank receives the same reduced values; the cross-rank check of the
// calls is absent (a mismatched call is NCCL's undefined behaviour, usually a hang that abort()
// ends); only tensors on the rank's own device are accepted.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <thread>

#include "dist/collective.h"

namespace surogate::dist {

namespace {

#define SG_NCCL(expr)                                                                                       \
  do {                                                                                                      \
    ncclResult_t _r = (expr);                                                                               \
    if (_r != ncclSuccess && _r != ncclInProgress) {                                                        \
      return ::surogate::Status(StatusCode::kDeviceError, str_cat(#expr, ": ", ncclGetErrorString(_r)),     \
                                __FILE__, __LINE__, "rerun with NCCL_DEBUG=INFO to see NCCL's own report"); \
    }                                                                                                       \
  } while (0)

#define SG_CUDA_CALL(expr)                                                                                         \
  do {                                                                                                             \
    cudaError_t _e = (expr);                                                                                       \
    if (_e != cudaSuccess) {                                                                                       \
      return ::surogate::Status(StatusCode::kDeviceError, str_cat(#expr, ": ", cudaGetErrorString(_e)), __FILE__, \
                                __LINE__, "");                                                                     \
    }                                                                                                              \
  } while (0)

bool reduce_type(DType dt, ncclDataType_t* out) {
  switch (dt) {
    case DType::kF32: *out = ncclFloat32; return true;
    case DType::kBF16: *out = ncclBfloat16; return true;
    case DType::kF16: *out = ncclFloat16; return true;
    default: return false;
  }
}

ncclRedOp_t red_op(ReduceOp op) { return op == ReduceOp::kMean ? ncclAvg : ncclSum; }

struct Shared {  // what the ranks of one group share
  std::atomic<bool> aborted{false};
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Shared> shared, ncclComm_t comm, int rank, int world, int device)
      : shared_(std::move(shared)), comm_(comm), rank_(rank), world_(world), device_(device) {}
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }

  Status init() {
    SG_CUDA_CALL(cudaSetDevice(device_));
    SG_CUDA_CALL(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    SG_CUDA_CALL(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    SG_CUDA_CALL(cudaMalloc(&scratch_, sizeof(float)));
    return Status::OK();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* backend() const override { return "nccl"; }

  Status all_reduce(const std::vector<Tensor>& bufs, ReduceOp op) override {
    SG_RETURN_IF_ERROR(check(bufs, true, "all_reduce"));
    SG_RETURN_IF_ERROR(begin());
    SG_NCCL(ncclGroupStart());
    for (const Tensor& t : bufs) {
      ncclDataType_t dt;
      reduce_type(t.dtype, &dt);
      SG_NCCL(ncclAllReduce(t.data, t.data, static_cast<size_t>(t.numel()), dt, red_op(op), comm_, stream_));
    }
    SG_NCCL(ncclGroupEnd());
    return wait();
  }

  Status reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    SG_RETURN_IF_ERROR(check({in, out}, true, "reduce_scatter"));
    SG_CHECK(in.dtype == out.dtype && in.numel() == out.numel() * world_, StatusCode::kShapeMismatch,
             str_cat("reduce_scatter: in ", in.describe(), ", out ", out.describe()),
             "in holds one chunk of out's size per rank, in out's dtype");
    SG_RETURN_IF_ERROR(begin());
    ncclDataType_t dt;
    reduce_type(in.dtype, &dt);
    SG_NCCL(ncclReduceScatter(in.data, out.data, static_cast<size_t>(out.numel()), dt, red_op(op), comm_, stream_));
    return wait();
  }

  Status all_gather(const Tensor& in, const Tensor& out) override {
    SG_RETURN_IF_ERROR(check({in, out}, false, "all_gather"));
    SG_CHECK(in.dtype == out.dtype && out.numel() == in.numel() * world_, StatusCode::kShapeMismatch,
             str_cat("all_gather: in ", in.describe(), ", out ", out.describe()),
             "out holds one chunk of in's size per rank, in in's dtype");
    SG_RETURN_IF_ERROR(begin());
    SG_NCCL(ncclAllGather(in.data, out.data, in.nbytes(), ncclUint8, comm_, stream_));
    return wait();
  }

  Status broadcast(const std::vector<Tensor>& bufs, int root) override {
    SG_RETURN_IF_ERROR(check(bufs, false, "broadcast"));
    SG_CHECK(root >= 0 && root < world_, StatusCode::kInvalidArgument,
             str_cat("broadcast: root ", root, " is not a rank of a group of ", world_), "");
    std::vector<int> owners(bufs.size(), root);
    return gather_from_owners(bufs, owners);
  }

  Status reduce_to_owners(const std::vector<Tensor>& bufs, const std::vector<int>& owners, ReduceOp op) override {
    SG_RETURN_IF_ERROR(check(bufs, true, "reduce_to_owners"));
    SG_RETURN_IF_ERROR(check_owners(bufs, owners, "reduce_to_owners"));
    SG_RETURN_IF_ERROR(begin());
    SG_NCCL(ncclGroupStart());
    for (size_t i = 0; i < bufs.size(); ++i) {
      ncclDataType_t dt;
      reduce_type(bufs[i].dtype, &dt);
      SG_NCCL(ncclReduce(bufs[i].data, bufs[i].data, static_cast<size_t>(bufs[i].numel()), dt, red_op(op), owners[i],
                         comm_, stream_));
    }
    SG_NCCL(ncclGroupEnd());
    return wait();
  }

  Status gather_from_owners(const std::vector<Tensor>& bufs, const std::vector<int>& owners) override {
    SG_RETURN_IF_ERROR(check(bufs, false, "gather_from_owners"));
    SG_RETURN_IF_ERROR(check_owners(bufs, owners, "gather_from_owners"));
    SG_RETURN_IF_ERROR(begin());
    SG_NCCL(ncclGroupStart());
    for (size_t i = 0; i < bufs.size(); ++i) {
      SG_NCCL(ncclBroadcast(bufs[i].data, bufs[i].data, bufs[i].nbytes(), ncclUint8, owners[i], comm_, stream_));
    }
    SG_NCCL(ncclGroupEnd());
    return wait();
  }

  Status barrier() override {
    SG_RETURN_IF_ERROR(begin());
    SG_NCCL(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_));
    return wait();
  }

  void abort(const std::string& why) override { shared_->aborted.store(true); }

 private:
  Status aborted() const {
    return SG_ERROR(StatusCode::kInternal, "collective aborted",
                    "another rank of the data-parallel group failed; its error is the one to read");
  }

  Status check(const std::vector<Tensor>& bufs, bool reduce, const char* what) const {
    for (size_t i = 0; i < bufs.size(); ++i) {
      const Tensor& t = bufs[i];
      SG_CHECK(t.device.type == DeviceType::kCUDA && t.device.index == device_, StatusCode::kInvalidArgument,
               str_cat(what, ": tensor ", i, " (", t.describe(), ") is not on cuda:", device_),
               "the NCCL backend moves the memory of each rank's own GPU");
      SG_CHECK(t.is_contiguous(), StatusCode::kInvalidArgument, str_cat(what, ": tensor ", i, " is not contiguous"), "");
      ncclDataType_t dt;
      SG_CHECK(!reduce || reduce_type(t.dtype, &dt), StatusCode::kDTypeUnsupported,
               str_cat(what, ": cannot reduce ", dtype_name(t.dtype)), "reduce float32, bfloat16 or float16");
    }
    return Status::OK();
  }

  Status check_owners(const std::vector<Tensor>& bufs, const std::vector<int>& owners, const char* what) const {
    SG_CHECK(owners.size() == bufs.size(), StatusCode::kInvalidArgument,
             str_cat(what, ": ", bufs.size(), " tensors but ", owners.size(), " owners"), "one owner per tensor");
    for (int o : owners) {
      SG_CHECK(o >= 0 && o < world_, StatusCode::kInvalidArgument,
               str_cat(what, ": owner ", o, " is not a rank of a group of ", world_), "");
    }
    return Status::OK();
  }

  // The rank's stream after the work queued on the device's default stream.
  Status begin() {
    if (shared_->aborted.load() || comm_ == nullptr) return aborted();
    SG_CUDA_CALL(cudaSetDevice(device_));
    SG_CUDA_CALL(cudaEventRecord(ready_, 0));
    SG_CUDA_CALL(cudaStreamWaitEvent(stream_, ready_, 0));
    return Status::OK();
  }

  // Until the stream is done, an error is reported, or the group is aborted.
  Status wait() {
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return Status::OK();
      if (e != cudaErrorNotReady) {
        return SG_ERROR(StatusCode::kDeviceError, str_cat("collective on cuda:", device_, ": ", cudaGetErrorString(e)), "");
      }
      ncclResult_t async = ncclSuccess;
      SG_NCCL(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        return SG_ERROR(StatusCode::kDeviceError, str_cat("NCCL on cuda:", device_, ": ", ncclGetErrorString(async)),
                        "rerun with NCCL_DEBUG=INFO to see NCCL's own report");
      }
      if (shared_->aborted.load()) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        return aborted();
      }
      std::this_thread::yield();
    }
  }

  std::shared_ptr<Shared> shared_;
  ncclComm_t comm_;
  const int rank_, world_, device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  float* scratch_ = nullptr;
};

}  // namespace

Status make_nccl_group(const std::vector<int>& devices, std::vector<std::shared_ptr<Communicator>>* out) {
  SG_CHECK(!devices.empty(), StatusCode::kInvalidArgument, "nccl group of no devices", "name at least one GPU");
  std::vector<ncclComm_t> comms(devices.size());
  SG_NCCL(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()));
  auto shared = std::make_shared<Shared>();
  out->clear();
  std::vector<std::shared_ptr<NcclCommunicator>> ranks;  // each owns its comm from here on
  for (size_t r = 0; r < devices.size(); ++r) {
    ranks.push_back(std::make_shared<NcclCommunicator>(shared, comms[r], static_cast<int>(r),
                                                       static_cast<int>(devices.size()), devices[r]));
  }
  for (auto& c : ranks) SG_RETURN_IF_ERROR(c->init());
  out->assign(ranks.begin(), ranks.end());
  return Status::OK();
}

}  // namespace surogate::dist

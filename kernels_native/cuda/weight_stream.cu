// Weight streaming on CUDA: weight_fetch copies one layer's packed weights from pinned host memory
// into a device staging buffer on a copy stream of its own, weight_wait makes the compute stream
// wait for that copy (argument rules in runtime/op_checks_weight_stream.h; the CPU reference is
// cpu/weight_stream.cpp). No kernels: the copy engine moves the bytes while the SMs run the layers
// before the one that needs them.
//
// Ordering, per staging buffer (dst), with two events:
//   weight_fetch: record `issued` on the compute stream (everything queued so far, among it the
//     last reader of the layer that held dst before: the compiler places the fetch after it),
//     the copy stream waits for it, copies, records `done`;
//   weight_wait: the compute stream waits for `done`.
// The same calls under CUDA graph capture make a fork and a join: the copy stream joins the
// capture through `issued` (recorded on the capturing stream) and leaves it through `done`, so
// the graph holds the copies as memcpy nodes beside the kernels, with the same dependencies, and
// a replay streams the weights again. A fetch is always waited for in the same Program (the
// compiler emits them in pairs), so a capture never ends with the copy stream unjoined.
//
// The copy stream is per thread and device (an engine thread captures on its own stream; another
// thread's eager copies never land in its capture). The events are per staging buffer (keyed by
// its device pointer, created on first use, kept for the process: two per buffer, and a runner
// has two buffers), shared by every Program that binds the buffer.
#include <cuda_runtime.h>

#include <mutex>
#include <unordered_map>

#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "runtime/op_checks_weight_stream.h"

namespace surogate::cuda {

namespace {

constexpr int kMaxDevices = 64;

// Run `fn` with `device` current, restoring the caller's device after.
template <typename Fn>
cudaError_t on_device(int device, Fn&& fn) {
  int before = 0;
  cudaError_t err = cudaGetDevice(&before);
  if (err == cudaSuccess && before != device) err = cudaSetDevice(device);
  if (err == cudaSuccess) err = fn();
  if (before != device) cudaSetDevice(before);
  return err;
}

Status copy_stream(int device, cudaStream_t* out) {
  thread_local cudaStream_t streams[kMaxDevices] = {};
  SG_CHECK(device >= 0 && device < kMaxDevices, StatusCode::kInvalidArgument,
           str_cat("weight_fetch: device index ", device, " is out of range"), "");
  if (streams[device] == nullptr) {
    SG_CUDA_CHECK(on_device(device, [&] { return cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking); }));
  }
  *out = streams[device];
  return Status::OK();
}

struct FetchEvents {
  cudaEvent_t issued = nullptr, done = nullptr;
};

std::mutex& events_mutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::unordered_map<const void*, FetchEvents>& events_table() {
  static auto* table = new std::unordered_map<const void*, FetchEvents>();  // never destroyed: see the header
  return *table;
}

// The events of staging buffer `dst`; `create`: make them on first use (a fetch), else an error
// (a wait with no fetch before it).
Status events_for(const void* dst, int device, bool create, FetchEvents* out) {
  std::lock_guard<std::mutex> lock(events_mutex());
  auto& table = events_table();
  auto it = table.find(dst);
  if (it == table.end()) {
    SG_CHECK(create, StatusCode::kInternal, "weight_wait: no weight_fetch into this buffer ran before it",
             "the compiler emits each wait after its fetch (surogate/compile/offload.py)");
    FetchEvents ev;
    SG_CUDA_CHECK(on_device(device, [&] {
      cudaError_t err = cudaEventCreateWithFlags(&ev.issued, cudaEventDisableTiming);
      return err == cudaSuccess ? cudaEventCreateWithFlags(&ev.done, cudaEventDisableTiming) : err;
    }));
    it = table.emplace(dst, ev).first;
  }
  *out = it->second;
  return Status::OK();
}

Status weight_fetch(const OpArgs& a) {
  WeightFetchArgs r;
  SG_RETURN_IF_ERROR(check_weight_fetch(a, &r));
  const Tensor& src = a.in(0);
  const Tensor& dst = a.out(0);
  // Pageable memory would make the copy synchronous, and a graph cannot capture it.
  cudaPointerAttributes attr{};
  SG_CUDA_CHECK(cudaPointerGetAttributes(&attr, src.data));
  SG_CHECK(attr.type == cudaMemoryTypeHost, StatusCode::kInvalidArgument,
           "weight_fetch: src is not pinned host memory",
           "allocate the packed weights with _native.host_empty(..., pinned=True)");
  if (r.bytes == 0) return Status::OK();
  cudaStream_t copy = nullptr;
  FetchEvents ev;
  SG_RETURN_IF_ERROR(copy_stream(dst.device.index, &copy));
  SG_RETURN_IF_ERROR(events_for(dst.data, dst.device.index, true, &ev));
  SG_CUDA_CHECK(cudaEventRecord(ev.issued, current_stream()));
  SG_CUDA_CHECK(cudaStreamWaitEvent(copy, ev.issued, 0));
  SG_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, r.bytes, cudaMemcpyHostToDevice, copy));
  SG_CUDA_CHECK(cudaEventRecord(ev.done, copy));
  return Status::OK();
}

Status weight_wait(const OpArgs& a) {
  SG_RETURN_IF_ERROR(check_weight_wait(a));
  if (a.in(0).nbytes() == 0) return Status::OK();
  FetchEvents ev;
  SG_RETURN_IF_ERROR(events_for(a.in(0).data, a.in(0).device.index, false, &ev));
  SG_CUDA_CHECK(cudaStreamWaitEvent(current_stream(), ev.done, 0));
  return Status::OK();
}

}  // namespace

void register_cuda_weight_stream(OpRegistry& reg) {
  add_op(reg, "weight_fetch", weight_fetch);
  add_op(reg, "weight_wait", weight_wait);
}

}  // namespace surogate::cuda

#include "cuda/backend.h"

#include <cuda_runtime.h>

#include "core/allocator.h"

namespace surogate::cuda {

namespace {

thread_local cudaStream_t tl_stream = nullptr;  // nullptr: the legacy default stream

Status cuda_raw_alloc(int device, size_t bytes, void** out) {
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaMalloc(out, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error state
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return Status(StatusCode::kOutOfMemory,
                  str_cat("CUDA out of memory on cuda:", device, ": asked for ", bytes >> 20, " MiB, ", free_b >> 20,
                          " MiB free of ", total_b >> 20, " MiB"),
                  __FILE__, __LINE__, "lower the batch size or sequence length, or turn on recompute");
  }
  if (err != cudaSuccess) {
    return Status(StatusCode::kDeviceError, str_cat("cudaMalloc: ", cudaGetErrorString(err)), __FILE__, __LINE__,
                  "run `surogate doctor` to check the driver");
  }
  return Status::OK();
}

void cuda_raw_free(int device, void* p) {
  cudaSetDevice(device);
  cudaFree(p);
}

Status cuda_memset(int device, void* p, size_t bytes) {
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaMemsetAsync(p, 0, bytes, tl_stream);
  if (err != cudaSuccess) {
    return Status(StatusCode::kDeviceError, str_cat("cudaMemset: ", cudaGetErrorString(err)), __FILE__, __LINE__, "");
  }
  return Status::OK();
}

Status cuda_copy(const Device& dd, void* dst, const Device& sd, const void* src, size_t bytes) {
  cudaMemcpyKind kind = dd.is_cpu() ? (sd.is_cpu() ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
                                    : (sd.is_cpu() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
  cudaError_t err = cudaSetDevice(dd.is_cpu() ? sd.index : dd.index);
  if (err == cudaSuccess) {
    // Device to device is ordered on the current stream (capturable); host transfers complete
    // before returning (the host memory may go away).
    err = kind == cudaMemcpyDeviceToDevice ? cudaMemcpyAsync(dst, src, bytes, kind, tl_stream)
                                           : cudaMemcpy(dst, src, bytes, kind);
  }
  if (err != cudaSuccess) {
    return Status(StatusCode::kDeviceError, str_cat("cudaMemcpy: ", cudaGetErrorString(err)), __FILE__, __LINE__, "");
  }
  return Status::OK();
}

Status cuda_synchronize(int device) {
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    return Status(StatusCode::kDeviceError, str_cat("CUDA error: ", cudaGetErrorString(err)), __FILE__, __LINE__,
                  "an earlier kernel failed; rerun with CUDA_LAUNCH_BLOCKING=1 to find it");
  }
  return Status::OK();
}

Status graph_error(const char* what, cudaError_t err) {
  cudaGetLastError();  // capture errors are not sticky; clear the last one
  return Status(StatusCode::kDeviceError, str_cat(what, ": ", cudaGetErrorString(err)), __FILE__, __LINE__,
                "an op did something a CUDA graph cannot hold; the program runs without graphs");
}

// Capture on a private non-blocking stream (the legacy stream cannot be captured); the caller
// synchronized the device first, so the graph needs no dependency on earlier work.
Status cuda_graph_begin(int device) {
  cudaError_t err = cudaSetDevice(device);
  cudaStream_t s = nullptr;
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err == cudaSuccess) err = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  if (err != cudaSuccess) {
    if (s != nullptr) cudaStreamDestroy(s);
    return graph_error("cudaStreamBeginCapture", err);
  }
  tl_stream = s;
  return Status::OK();
}

Status cuda_graph_end(int device, void** out) {
  (void)device;
  cudaStream_t s = tl_stream;
  tl_stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamEndCapture(s, &graph);
  cudaStreamDestroy(s);
  if (err != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return graph_error("cudaStreamEndCapture", err);
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) return graph_error("cudaGraphInstantiate", err);
  *out = exec;
  return Status::OK();
}

Status cuda_graph_launch(int device, void* graph) {
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), nullptr);
  if (err != cudaSuccess) return graph_error("cudaGraphLaunch", err);
  return Status::OK();
}

void cuda_graph_destroy(int device, void* graph) {
  cudaSetDevice(device);
  cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

// Page-locked and portable (every device's context may copy from it). Not write-combined: the host
// reads these arrays too (a served model's weights kept on the host are its parameters' storage).
Status cuda_host_alloc(size_t bytes, void** out) {
  cudaError_t err = cudaHostAlloc(out, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status(StatusCode::kOutOfMemory,
                  str_cat("cudaHostAlloc of ", bytes >> 20, " MiB of pinned host memory: ", cudaGetErrorString(err)),
                  __FILE__, __LINE__,
                  "free host memory, raise the locked-memory limit (ulimit -l), or keep fewer weights on the host");
  }
  return Status::OK();
}

void cuda_host_free(void* p) { cudaFreeHost(p); }

}  // namespace

cudaStream_t current_stream() { return tl_stream; }

std::vector<DeviceInfo> devices() {
  std::vector<DeviceInfo> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return out;
  }
  int driver = 0;
  cudaDriverGetVersion(&driver);
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.cc_major = prop.major;
    d.cc_minor = prop.minor;
    d.total_memory = prop.totalGlobalMem;
    d.multiprocessors = prop.multiProcessorCount;
    d.driver_version = str_cat(driver / 1000, ".", (driver % 1000) / 10);
    out.push_back(d);
  }
  return out;
}

std::string runtime_version() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return str_cat(v / 1000, ".", (v % 1000) / 10);
}

void register_backend() {
  register_device_hooks(DeviceType::kCUDA, DeviceHooks{cuda_raw_alloc, cuda_raw_free, cuda_memset, cuda_copy, cuda_synchronize,
                                                          cuda_graph_begin, cuda_graph_end, cuda_graph_launch,
                                                          cuda_graph_destroy, cuda_host_alloc, cuda_host_free});
  OpRegistry& reg = OpRegistry::global();
  register_cuda_elementwise(reg);
  register_cuda_matmul(reg);
  register_cuda_attention(reg);
  register_cuda_norm_rope_act(reg);
  register_cuda_embed_optim(reg);
  register_cuda_paged_attention(reg);
  register_cuda_qkv_rope_cache(reg);
  register_cuda_gguf(reg);
  register_cuda_nf4(reg);
  register_cuda_fp8(reg);
  register_cuda_muon(reg);
  register_cuda_fused_matmul(reg);
  register_cuda_short_conv(reg);
  register_cuda_pool(reg);
  register_cuda_moe(reg);
  register_cuda_moe_gemm(reg);
  register_cuda_moe_oai(reg);
  register_cuda_rope_table(reg);
  register_cuda_embedding_bag(reg);
  register_cuda_sample(reg);
  register_cuda_weight_stream(reg);
  register_cuda_weight_gather(reg);
}

}  // namespace surogate::cuda

// The caching allocator: one per device. Freed blocks go back to a per-device pool, keyed by
// rounded size, and are handed out again before the backend is asked for more. Backends
// register their raw allocate / free / memset / copy functions at start-up; the CPU backend is
// always there, CUDA registers itself when the CUDA backend was built and a GPU is present.
#pragma once

#include <functional>
#include <vector>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/status.h"
#include "core/tensor.h"

namespace surogate {

struct DeviceHooks {
  Status (*raw_alloc)(int device_index, size_t bytes, void** out) = nullptr;
  void (*raw_free)(int device_index, void* p) = nullptr;
  Status (*memset_zero)(int device_index, void* p, size_t bytes) = nullptr;
  // Copy `bytes` between two devices of which at least one is this backend's.
  Status (*copy)(const Device& dst_dev, void* dst, const Device& src_dev, const void* src, size_t bytes) = nullptr;
  // Wait for the device's queued work (profiling, timing). Null: the device runs synchronously.
  Status (*synchronize)(int device_index) = nullptr;
  // Graphs (null: the backend has none): capture this thread's launches into a graph, end the
  // capture and instantiate it (an opaque handle), replay it, destroy it.
  Status (*graph_begin)(int device_index) = nullptr;
  Status (*graph_end)(int device_index, void** graph) = nullptr;
  Status (*graph_launch)(int device_index, void* graph) = nullptr;
  void (*graph_destroy)(int device_index, void* graph) = nullptr;
  // Page-locked host memory (null: the backend has none): what allocate_host hands out when asked
  // for memory this backend copies from at the link's full speed, and in a captured graph.
  Status (*host_alloc)(size_t bytes, void** out) = nullptr;
  void (*host_free)(void* p) = nullptr;
};

// Blocks freed while a graph is captured on this thread: the graph's replays still use them, so
// they return to the cache only when this object dies (after the graph is destroyed).
struct HeldBlocks {
  std::vector<std::function<void()>> releases;
  HeldBlocks() = default;
  HeldBlocks(const HeldBlocks&) = delete;
  HeldBlocks& operator=(const HeldBlocks&) = delete;
  ~HeldBlocks() {
    for (auto& r : releases) r();
  }
};
// Route this thread's frees into `hold` (nullptr: back to the cache).
void hold_frees(HeldBlocks* hold);

// Wait until `dev` has finished the work queued on it (a no-op on the CPU).
Status synchronize(const Device& dev);

void register_device_hooks(DeviceType type, const DeviceHooks& hooks);
const DeviceHooks* device_hooks(DeviceType type);

struct AllocatorStats {
  size_t allocated_bytes = 0;   // handed out to callers now
  size_t reserved_bytes = 0;    // held from the backend (allocated + cached)
  size_t peak_allocated_bytes = 0;
  uint64_t num_allocs = 0;      // calls to allocate()
  uint64_t num_backend_allocs = 0;  // of which went to the backend
};

// Allocate `bytes` on `dev`. The returned pointer's deleter gives the block back to the cache.
Status allocate(const Device& dev, size_t bytes, std::shared_ptr<void>* out);
// The bytes a request of `bytes` holds (its rounded size; what reserved_bytes counts).
size_t allocation_size(size_t bytes);
AllocatorStats allocator_stats(const Device& dev);
void reset_peak_stats(const Device& dev);
// Return every cached (unused) block of `dev` to its backend.
void empty_cache(const Device& dev);

// Host memory of its own (not the cache: long-lived, e.g. weights kept on the host for serving).
// `pinned`: page-locked through the CUDA backend (cudaHostAlloc), so that copies to a GPU run at
// the host link's speed and can be captured in a CUDA graph; an error when no backend pins host
// memory (a build without CUDA, or no GPU). Otherwise plain 64-byte aligned memory.
Status allocate_host(size_t bytes, bool pinned, std::shared_ptr<void>* out);

Status fill_zero(const Tensor& t);
// Copy between two tensors of the same dtype and numel, both contiguous, any devices.
Status copy_tensor(const Tensor& src, const Tensor& dst);

}  // namespace surogate

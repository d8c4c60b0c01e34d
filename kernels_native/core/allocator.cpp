#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace surogate {

namespace {

constexpr size_t kCpuAlignment = 64;

Status cpu_raw_alloc(int, size_t bytes, void** out) {
  size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  *out = std::aligned_alloc(kCpuAlignment, rounded ? rounded : kCpuAlignment);
  SG_CHECK(*out != nullptr, StatusCode::kOutOfMemory, str_cat("host allocation of ", bytes, " bytes failed"),
           "free host memory or use a smaller batch / sequence length");
  return Status::OK();
}
void cpu_raw_free(int, void* p) { std::free(p); }
Status cpu_memset(int, void* p, size_t bytes) {
  std::memset(p, 0, bytes);
  return Status::OK();
}
Status cpu_copy(const Device& dd, void* dst, const Device& sd, const void* src, size_t bytes) {
  SG_CHECK(dd.is_cpu() && sd.is_cpu(), StatusCode::kUnsupported, "cpu copy between non-cpu devices", "");
  std::memcpy(dst, src, bytes);
  return Status::OK();
}

struct HookTable {
  DeviceHooks hooks[2];
  HookTable() { hooks[0] = DeviceHooks{cpu_raw_alloc, cpu_raw_free, cpu_memset, cpu_copy}; }
};
HookTable& hook_table() {
  static HookTable* t = new HookTable();  // never destroyed: blocks may be freed at exit
  return *t;
}

}  // namespace

// Sizes are rounded so that blocks are reusable across nearby requests: 512-byte steps below
// 1 MiB, then steps of 1/8 of the next power of two (at most 12.5% waste). Blocks of 256 MiB and
// more are long-lived and keep their size (a KV cache layer, an embedding table): they round to
// 2 MiB, the driver's own granule, since 12.5% of each of a KV cache's 2 x layers arrays is more
// than a GPU has left once the cache was sized to fill it.
size_t allocation_size(size_t bytes) {
  constexpr size_t kLarge = size_t{256} << 20, kLargeStep = size_t{2} << 20;
  if (bytes < 512) return 512;
  if (bytes < (1u << 20)) return (bytes + 511) / 512 * 512;
  if (bytes >= kLarge) return (bytes + kLargeStep - 1) / kLargeStep * kLargeStep;
  size_t p = 1;
  while (p < bytes) p <<= 1;
  size_t step = p / 8;
  return (bytes + step - 1) / step * step;
}

namespace {

class DeviceCache {
 public:
  explicit DeviceCache(Device dev) : dev_(dev) {}

  Status allocate(size_t bytes, void** out, size_t* rounded_out) {
    const size_t rounded = allocation_size(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.num_allocs++;
    auto it = free_.find(rounded);
    if (it != free_.end() && !it->second.empty()) {
      *out = it->second.back();
      it->second.pop_back();
    } else {
      const DeviceHooks* h = device_hooks(dev_.type);
      SG_CHECK(h && h->raw_alloc, StatusCode::kUnsupported,
               str_cat("no allocator for device ", dev_.to_string()),
               "this build or machine has no such device; run `surogate doctor`");
      Status st = h->raw_alloc(dev_.index, rounded, out);
      if (!st.ok()) {
        // Out of memory: give the cache back and try once more before failing.
        release_cached_locked();
        st = h->raw_alloc(dev_.index, rounded, out);
        if (!st.ok()) return st;
      }
      stats_.num_backend_allocs++;
      stats_.reserved_bytes += rounded;
    }
    stats_.allocated_bytes += rounded;
    if (stats_.allocated_bytes > stats_.peak_allocated_bytes) stats_.peak_allocated_bytes = stats_.allocated_bytes;
    *rounded_out = rounded;
    return Status::OK();
  }

  void release(void* p, size_t rounded) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.allocated_bytes -= rounded;
    free_[rounded].push_back(p);
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached_locked();
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }

 private:
  void release_cached_locked() {
    const DeviceHooks* h = device_hooks(dev_.type);
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) {
        h->raw_free(dev_.index, p);
        stats_.reserved_bytes -= size;
      }
      blocks.clear();
    }
    free_.clear();
  }

  Device dev_;
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
};

DeviceCache& cache_for(const Device& dev) {
  static std::mutex mu;
  static auto* caches = new std::unordered_map<int, DeviceCache*>();  // never destroyed
  const int key = static_cast<int>(dev.type) * 1024 + dev.index;
  std::lock_guard<std::mutex> lock(mu);
  auto it = caches->find(key);
  if (it == caches->end()) it = caches->emplace(key, new DeviceCache(dev)).first;
  return *it->second;
}

}  // namespace

void register_device_hooks(DeviceType type, const DeviceHooks& hooks) {
  hook_table().hooks[static_cast<int>(type)] = hooks;
}

const DeviceHooks* device_hooks(DeviceType type) {
  const DeviceHooks* h = &hook_table().hooks[static_cast<int>(type)];
  return h->raw_alloc ? h : nullptr;
}

namespace {
thread_local HeldBlocks* tl_hold = nullptr;
}  // namespace

void hold_frees(HeldBlocks* hold) { tl_hold = hold; }

Status allocate(const Device& dev, size_t bytes, std::shared_ptr<void>* out) {
  DeviceCache& cache = cache_for(dev);
  void* p = nullptr;
  size_t rounded = 0;
  SG_RETURN_IF_ERROR(cache.allocate(bytes, &p, &rounded));
  *out = std::shared_ptr<void>(p, [&cache, rounded](void* q) {
    if (tl_hold != nullptr) {
      tl_hold->releases.push_back([&cache, q, rounded] { cache.release(q, rounded); });
    } else {
      cache.release(q, rounded);
    }
  });
  return Status::OK();
}

Status allocate_host(size_t bytes, bool pinned, std::shared_ptr<void>* out) {
  if (!pinned) {
    void* p = nullptr;
    SG_RETURN_IF_ERROR(cpu_raw_alloc(0, bytes, &p));
    *out = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    return Status::OK();
  }
  const DeviceHooks* h = device_hooks(DeviceType::kCUDA);
  SG_CHECK(h != nullptr && h->host_alloc != nullptr, StatusCode::kUnsupported,
           "pinned host memory needs the CUDA backend and a GPU",
           "pinned memory is for copies to a GPU; on the CPU ask for plain host memory");
  void* p = nullptr;
  SG_RETURN_IF_ERROR(h->host_alloc(bytes ? bytes : 1, &p));
  void (*release)(void*) = h->host_free;
  *out = std::shared_ptr<void>(p, [release](void* q) { release(q); });
  return Status::OK();
}

AllocatorStats allocator_stats(const Device& dev) { return cache_for(dev).stats(); }
void reset_peak_stats(const Device& dev) { cache_for(dev).reset_peak(); }
void empty_cache(const Device& dev) { cache_for(dev).empty_cache(); }

Status fill_zero(const Tensor& t) {
  SG_RETURN_IF_ERROR(check_contiguous("fill_zero", "tensor", t));
  const DeviceHooks* h = device_hooks(t.device.type);
  SG_CHECK(h, StatusCode::kUnsupported, str_cat("no backend for ", t.device.to_string()), "");
  return h->memset_zero(t.device.index, t.data, t.nbytes());
}

Status copy_tensor(const Tensor& src, const Tensor& dst) {
  SG_CHECK(src.dtype == dst.dtype, StatusCode::kDTypeUnsupported,
           str_cat("copy: dtype ", dtype_name(src.dtype), " -> ", dtype_name(dst.dtype), " needs a cast"), "");
  SG_CHECK_SHAPE(src.numel() == dst.numel(), str_cat("copy: ", src.describe(), " -> ", dst.describe()));
  SG_RETURN_IF_ERROR(check_contiguous("copy", "src", src));
  SG_RETURN_IF_ERROR(check_contiguous("copy", "dst", dst));
  const DeviceType owner = dst.device.is_cpu() ? src.device.type : dst.device.type;
  const DeviceHooks* h = device_hooks(owner);
  SG_CHECK(h && h->copy, StatusCode::kUnsupported, str_cat("no copy path ", src.device.to_string(), " -> ",
                                                           dst.device.to_string()), "");
  return h->copy(dst.device, dst.data, src.device, src.data, src.nbytes());
}

Status synchronize(const Device& dev) {
  const DeviceHooks* h = device_hooks(dev.type);
  return h && h->synchronize ? h->synchronize(dev.index) : Status::OK();
}

}  // namespace surogate

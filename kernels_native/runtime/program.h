// Program: the flat list of op instructions over typed buffers that the Python compiler emits
// and the native runtime executes with no Python in between.
//
// Buffers are of three kinds. Internal buffers are allocated by prepare(): either on their own
// or, when the compiler planned them (liveness-based reuse), at a byte offset inside one arena.
// External buffers (weights, inputs, gradients the caller keeps) are bound to caller memory
// with bind(). Views alias a range of another buffer under a new shape. Each instruction names
// its op, input and output buffer ids (-1 for an absent optional input) and its attributes; the
// op's kernel is resolved when the instruction is added, so running is a loop of calls. An
// external buffer may be declared host-resident: a device program then binds it to host memory
// (what weight_fetch copies up from; its kernels never read it otherwise). A Program of a
// data-parallel rank holds that rank's Communicator, which its collective ops (weight_gather,
// ZeRO-3) call, and its GradReducer (grad_reduce / grad_wait: the gradients reduced during the backward).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "runtime/attrs.h"
#include "runtime/op_registry.h"

namespace surogate {

namespace dist {
class Communicator;  // dist/collective.h
class GradReducer;   // dist/grad_reducer.h
}

class Program {
 public:
  explicit Program(Device device) : device_(device) {}
  ~Program();
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  const Device& device() const { return device_; }

  // arena_offset < 0: a buffer of its own. Otherwise a byte offset inside the shared arena.
  Status add_buffer(const std::string& name, const std::vector<int64_t>& shape, DType dtype, int64_t arena_offset,
                    int* id);
  // host: bound to host memory though the program runs on a device (the packed weights a
  // weight_fetch instruction copies up, serving with weights in host memory); on the CPU the same.
  Status add_external(const std::string& name, const std::vector<int64_t>& shape, DType dtype, int* id,
                      bool host = false);
  // A view of `base` starting `offset` elements in, with its own shape (and the base's dtype).
  // `strides` (in elements) default to contiguous; a 2-D view with a row stride wider than its
  // rows is how a column slice of a matrix is addressed (LoRA on a fused projection).
  Status add_view(const std::string& name, int base, const std::vector<int64_t>& shape, int64_t offset, int* id,
                  const std::vector<int64_t>& strides = {});
  Status add_instr(const std::string& op, const std::vector<int>& inputs, const std::vector<int>& outputs,
                   const Attrs& attrs);

  Status bind(int id, const Tensor& t);
  // The rank's collectives, for the instructions that move data among the ranks (weight_gather);
  // every rank's Program makes the same calls in the same order.
  void set_communicator(std::shared_ptr<dist::Communicator> comm) { comm_ = std::move(comm); }
  const std::shared_ptr<dist::Communicator>& communicator() const { return comm_; }
  // The rank's gradient reducer, which its grad_reduce / grad_wait instructions start and wait on.
  void set_grad_reducer(std::shared_ptr<dist::GradReducer> r) { reducer_ = std::move(r); }
  const std::shared_ptr<dist::GradReducer>& grad_reducer() const { return reducer_; }
  Status prepare();
  // Run instructions [begin, end); end < 0 means to the last one.
  Status run(int begin = 0, int end = -1);

  Status buffer(int id, Tensor* out) const;
  int find_buffer(const std::string& name) const;
  int num_buffers() const { return static_cast<int>(buffers_.size()); }
  int num_instrs() const { return static_cast<int>(instrs_.size()); }
  size_t arena_bytes() const { return arena_bytes_; }
  std::string instr_to_string(int i) const;

  // CUDA graphs: each run range [begin, end) runs eagerly once, is captured on its second run
  // and replayed after (one launch instead of one per kernel). A binding change drops the
  // graphs; a capture that fails (an op the graph cannot hold) turns graphs off for this program
  // and runs eagerly. Off by default; a no-op on backends without graphs.
  void set_graphs(bool on);
  bool graphs_active() const { return graphs_on_ && !graphs_failed_; }
  int num_graphs() const { return static_cast<int>(graphs_.size()); }

  // Per-op timing, accumulated over run() calls when enabled.
  void set_profiling(bool on) { profiling_ = on; }
  std::vector<std::pair<std::string, double>> profile_seconds() const;  // by op name
  const std::vector<double>& instr_seconds() const { return op_seconds_; }  // by instruction
  void reset_profile() { op_seconds_.assign(instrs_.size(), 0.0); }

 private:
  enum class Kind { kInternal, kExternal, kView };
  struct Buffer {
    std::string name;
    std::vector<int64_t> shape;
    DType dtype = DType::kF32;
    Kind kind = Kind::kInternal;
    int64_t arena_offset = -1;
    int base = -1;
    int64_t view_offset = 0;
    std::vector<int64_t> view_strides;  // empty: contiguous
    bool host = false;  // external: bound to host memory (add_external)
    Tensor tensor;  // resolved memory (after prepare / bind)
    bool bound = false;
  };
  struct Instr {
    const OpDef* def;
    std::vector<int> inputs, outputs;
    Attrs attrs;
    std::vector<Tensor> in_t, out_t;  // resolved views, refreshed when bindings change
  };

  Status check_id(int id, const char* what) const;
  Status resolve_views();
  Status resolve_instrs();
  size_t buffer_bytes(const Buffer& b) const;
  Status run_eager(int begin, int end);
  Status run_graph(int begin, int end, bool* ran);
  void drop_graphs();

  struct GraphEntry {
    int eager_runs = 0;
    void* exec = nullptr;
    std::shared_ptr<HeldBlocks> held;  // scratch the graph's replays use
  };

  Device device_;
  std::vector<Buffer> buffers_;
  std::vector<Instr> instrs_;
  std::shared_ptr<void> arena_;
  size_t arena_bytes_ = 0;
  bool prepared_ = false;
  bool dirty_ = true;
  bool profiling_ = false;
  std::vector<double> op_seconds_;
  bool graphs_on_ = false, graphs_failed_ = false;
  std::map<std::pair<int, int>, GraphEntry> graphs_;
  std::shared_ptr<dist::Communicator> comm_;
  std::shared_ptr<dist::GradReducer> reducer_;
};

}  // namespace surogate

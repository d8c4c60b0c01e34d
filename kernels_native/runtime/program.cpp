#include "runtime/program.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "core/allocator.h"

namespace surogate {

namespace {
int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
Status check_shape(const std::string& name, const std::vector<int64_t>& shape) {
  SG_CHECK_ARG(shape.size() <= kMaxDims, str_cat("buffer '", name, "': at most ", kMaxDims, " dimensions"));
  for (int64_t d : shape) SG_CHECK_ARG(d >= 0, str_cat("buffer '", name, "': negative dimension ", d));
  return Status::OK();
}
}  // namespace

size_t Program::buffer_bytes(const Buffer& b) const {
  return static_cast<size_t>(numel_of(b.shape)) * dtype_size(b.dtype);
}

Status Program::check_id(int id, const char* what) const {
  SG_CHECK_ARG(id >= 0 && id < static_cast<int>(buffers_.size()),
               str_cat(what, ": no buffer with id ", id, " (program has ", buffers_.size(), ")"));
  return Status::OK();
}

Status Program::add_buffer(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                           int64_t arena_offset, int* id) {
  SG_RETURN_IF_ERROR(check_shape(name, shape));
  SG_CHECK_ARG(!prepared_, "add_buffer after prepare()");
  Buffer b{name, shape, dtype, Kind::kInternal};
  b.arena_offset = arena_offset;
  if (arena_offset >= 0) {
    SG_CHECK_ARG(arena_offset % 64 == 0, str_cat("buffer '", name, "': arena offset ", arena_offset,
                                                 " must be a multiple of 64 bytes"));
  }
  buffers_.push_back(std::move(b));
  *id = static_cast<int>(buffers_.size()) - 1;
  return Status::OK();
}

Status Program::add_external(const std::string& name, const std::vector<int64_t>& shape, DType dtype, int* id,
                             bool host) {
  SG_RETURN_IF_ERROR(check_shape(name, shape));
  Buffer b{name, shape, dtype, Kind::kExternal};
  b.host = host;
  buffers_.push_back(std::move(b));
  *id = static_cast<int>(buffers_.size()) - 1;
  return Status::OK();
}

Status Program::add_view(const std::string& name, int base, const std::vector<int64_t>& shape, int64_t offset,
                         int* id, const std::vector<int64_t>& strides) {
  SG_RETURN_IF_ERROR(check_id(base, "add_view"));
  SG_RETURN_IF_ERROR(check_shape(name, shape));
  const Buffer& bb = buffers_[base];
  SG_CHECK_ARG(strides.empty() || strides.size() == shape.size(),
               str_cat("view '", name, "': ", strides.size(), " strides for ", shape.size(), " dims"));
  // The furthest element the view reaches must lie inside the base.
  int64_t last = offset;
  bool empty_view = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) empty_view = true;
    int64_t stride = 1;
    if (strides.empty()) {
      for (size_t j = i + 1; j < shape.size(); ++j) stride *= shape[j];
    } else {
      stride = strides[i];
      SG_CHECK_ARG(stride >= 0, str_cat("view '", name, "': negative stride"));
    }
    last += (shape[i] - 1) * stride;
  }
  SG_CHECK_SHAPE(offset >= 0 && (empty_view || last < numel_of(bb.shape)),
                 str_cat("view '", name, "' of '", bb.name, "': reaches element ", last, " of a buffer of ",
                         numel_of(bb.shape), " elements"));
  Buffer b{name, shape, bb.dtype, Kind::kView};
  b.base = base;
  b.view_offset = offset;
  b.view_strides = strides;
  buffers_.push_back(std::move(b));
  *id = static_cast<int>(buffers_.size()) - 1;
  dirty_ = true;
  return Status::OK();
}

Status Program::add_instr(const std::string& op, const std::vector<int>& inputs, const std::vector<int>& outputs,
                          const Attrs& attrs) {
  const OpDef* def = OpRegistry::global().find(op, device_.type);
  SG_CHECK(def, StatusCode::kNotFound, str_cat("no op '", op, "' for ", device_.to_string()),
           "surogate._native.list_ops() lists the registered ops");
  const int n_in = static_cast<int>(inputs.size());
  const int n_out = static_cast<int>(outputs.size());
  const int max_in = def->max_inputs == kVariadic ? n_in : def->max_inputs;
  SG_CHECK_ARG(n_in >= def->min_inputs && n_in <= max_in,
               str_cat(op, ": takes ", def->min_inputs, "..", max_in, " inputs, got ", n_in, " (", def->doc, ")"));
  SG_CHECK_ARG(def->num_outputs == kVariadic || n_out == def->num_outputs,
               str_cat(op, ": produces ", def->num_outputs, " outputs, got ", n_out, " (", def->doc, ")"));
  for (int i = 0; i < n_in; ++i) {
    if (inputs[i] < 0) {
      SG_CHECK_ARG(i >= def->min_inputs, str_cat(op, ": input ", i, " is required"));
      continue;
    }
    SG_RETURN_IF_ERROR(check_id(inputs[i], op.c_str()));
  }
  for (int i = 0; i < n_out; ++i) {
    if (outputs[i] < 0) {
      SG_CHECK_ARG(def->min_outputs >= 0 && i >= def->min_outputs, str_cat(op, ": output ", i, " is required"));
      continue;
    }
    SG_RETURN_IF_ERROR(check_id(outputs[i], op.c_str()));
  }
  instrs_.push_back(Instr{def, inputs, outputs, attrs, {}, {}});
  op_seconds_.push_back(0.0);
  dirty_ = true;
  return Status::OK();
}

Status Program::bind(int id, const Tensor& t) {
  SG_RETURN_IF_ERROR(check_id(id, "bind"));
  Buffer& b = buffers_[id];
  SG_CHECK_ARG(b.kind == Kind::kExternal, str_cat("buffer '", b.name, "' is not external and cannot be bound"));
  SG_CHECK(t.dtype == b.dtype, StatusCode::kDTypeUnsupported,
           str_cat("bind '", b.name, "': expected ", dtype_name(b.dtype), ", got ", dtype_name(t.dtype)), "");
  bool same = t.ndim == static_cast<int>(b.shape.size());
  for (int i = 0; same && i < t.ndim; ++i) same = t.shape[i] == b.shape[i];
  SG_CHECK_SHAPE(same, str_cat("bind '", b.name, "': expected shape ", Tensor::view_of(nullptr, b.dtype, b.shape).shape_str(),
                               ", got ", t.shape_str()));
  SG_CHECK_ARG(t.is_contiguous(), str_cat("bind '", b.name, "': tensor must be contiguous"));
  if (b.host) {
    SG_CHECK_ARG(t.device.is_cpu(), str_cat("bind '", b.name, "': the buffer lives in host memory, the tensor is on ",
                                            t.device.to_string()));
  } else {
    SG_CHECK_ARG(t.device == device_, str_cat("bind '", b.name, "': tensor is on ", t.device.to_string(),
                                              ", program runs on ", device_.to_string()));
  }
  b.tensor = t;
  b.bound = true;
  dirty_ = true;
  return Status::OK();
}

Status Program::prepare() {
  if (prepared_) return Status::OK();
  // Planned buffers share one arena; the arena is as large as the furthest end.
  size_t arena = 0;
  for (const auto& b : buffers_) {
    if (b.kind == Kind::kInternal && b.arena_offset >= 0) {
      arena = std::max(arena, static_cast<size_t>(b.arena_offset) + buffer_bytes(b));
    }
  }
  if (arena > 0) SG_RETURN_IF_ERROR(allocate(device_, arena, &arena_));
  arena_bytes_ = arena;
  for (auto& b : buffers_) {
    if (b.kind != Kind::kInternal) continue;
    if (b.arena_offset >= 0) {
      b.tensor = Tensor::view_of(static_cast<char*>(arena_.get()) + b.arena_offset, b.dtype, b.shape, device_, arena_);
    } else {
      SG_RETURN_IF_ERROR(empty(b.shape, b.dtype, device_, &b.tensor));
    }
    b.bound = true;
  }
  prepared_ = true;
  dirty_ = true;
  return Status::OK();
}

Status Program::resolve_views() {
  // Views may stack (a view of a view); bases always come earlier, so one forward pass works.
  for (auto& b : buffers_) {
    if (b.kind != Kind::kView) continue;
    const Buffer& base = buffers_[b.base];
    if (!base.bound) {
      b.bound = false;
      continue;
    }
    char* p = static_cast<char*>(base.tensor.data) + b.view_offset * static_cast<int64_t>(dtype_size(b.dtype));
    b.tensor = Tensor::view_of(p, b.dtype, b.shape, base.tensor.device, base.tensor.owner);  // a host buffer's: host
    for (size_t i = 0; i < b.view_strides.size(); ++i) b.tensor.strides[i] = b.view_strides[i];
    b.tensor.readonly = base.tensor.readonly;
    b.bound = true;
  }
  return Status::OK();
}

Status Program::resolve_instrs() {
  SG_RETURN_IF_ERROR(resolve_views());
  for (size_t k = 0; k < instrs_.size(); ++k) {
    Instr& ins = instrs_[k];
    ins.in_t.assign(ins.inputs.size(), Tensor{});
    ins.out_t.assign(ins.outputs.size(), Tensor{});
    for (size_t i = 0; i < ins.inputs.size(); ++i) {
      if (ins.inputs[i] >= 0) ins.in_t[i] = buffers_[ins.inputs[i]].tensor;
    }
    for (size_t i = 0; i < ins.outputs.size(); ++i) {
      if (ins.outputs[i] < 0) continue;
      const Buffer& b = buffers_[ins.outputs[i]];
      // A read-only binding (a frozen array, an mmapped file) may be read, never written.
      SG_CHECK(!b.tensor.readonly, StatusCode::kInvalidArgument,
               str_cat("instruction ", k, " (", instr_to_string(static_cast<int>(k)), ") writes buffer '", b.name,
                       "', which is bound to read-only memory"),
               "bind a writeable array (np.array(x) makes a writeable copy)");
      ins.out_t[i] = b.tensor;
    }
  }
  dirty_ = false;
  return Status::OK();
}

Program::~Program() { drop_graphs(); }

void Program::set_graphs(bool on) {
  if (!on) drop_graphs();
  graphs_on_ = on;
  graphs_failed_ = false;
}

void Program::drop_graphs() {
  if (graphs_.empty()) return;
  const DeviceHooks* h = device_hooks(device_.type);
  // A replay may still be running; its scratch goes back to the cache next. (A failed wait leaves
  // nothing to do but destroy the graphs: the device's error shows at the next call.)
  (void)synchronize(device_);
  for (auto& [range, g] : graphs_) {
    if (g.exec != nullptr && h != nullptr && h->graph_destroy != nullptr) h->graph_destroy(device_.index, g.exec);
  }
  graphs_.clear();
}

Status Program::run(int begin, int end) {
  if (!prepared_) SG_RETURN_IF_ERROR(prepare());
  if (dirty_) {  // bindings changed since the last run (a buffer, once bound, stays bound)
    for (const auto& b : buffers_) {
      SG_CHECK(b.bound || b.kind != Kind::kExternal, StatusCode::kInvalidArgument,
               str_cat("buffer '", b.name, "' is not bound"), "bind every external buffer before run()");
    }
    drop_graphs();  // the tensors the graphs captured changed
    SG_RETURN_IF_ERROR(resolve_instrs());
  }
  if (end < 0 || end > num_instrs()) end = num_instrs();
  begin = std::max(begin, 0);
  if (graphs_active() && !profiling_ && begin < end) {
    bool ran = false;
    Status st = run_graph(begin, end, &ran);
    if (ran || !st.ok()) return st;
  }
  return run_eager(begin, end);
}

Status Program::run_graph(int begin, int end, bool* ran) {
  const DeviceHooks* h = device_hooks(device_.type);
  if (h == nullptr || h->graph_begin == nullptr) return Status::OK();  // no graphs here: run eagerly
  GraphEntry& g = graphs_[{begin, end}];
  if (g.exec == nullptr && g.eager_runs == 0) {  // first run: eager (plans, caches, scratch warm up)
    g.eager_runs++;
    return Status::OK();
  }
  if (g.exec == nullptr) {
    SG_RETURN_IF_ERROR(synchronize(device_));
    auto held = std::make_shared<HeldBlocks>();
    SG_RETURN_IF_ERROR(h->graph_begin(device_.index));
    hold_frees(held.get());
    Status st = run_eager(begin, end);  // captured, not executed
    hold_frees(nullptr);
    void* exec = nullptr;
    Status end_st = h->graph_end(device_.index, &exec);
    if (!st.ok() || !end_st.ok()) {
      // Nothing ran: turn graphs off for this program and let the caller run eagerly.
      graphs_failed_ = true;
      graphs_.erase({begin, end});
      return Status::OK();
    }
    g.exec = exec;
    g.held = std::move(held);
  }
  SG_RETURN_IF_ERROR(h->graph_launch(device_.index, g.exec));
  *ran = true;
  return Status::OK();
}

Status Program::run_eager(int begin, int end) {
  for (int i = begin; i < end; ++i) {
    Instr& ins = instrs_[i];
    OpArgs args{ins.in_t.data(), static_cast<int>(ins.in_t.size()), ins.out_t.data(),
                static_cast<int>(ins.out_t.size()), &ins.attrs, comm_.get(), reducer_.get()};
    std::chrono::steady_clock::time_point t0;
    if (profiling_) t0 = std::chrono::steady_clock::now();
    Status st = ins.def->fn(args);
    if (profiling_) {  // on a GPU: wait for the op's kernels, so the time is the op's own
      if (st.ok()) st = synchronize(device_);
      op_seconds_[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (!st.ok()) {
      return Status(st.code(), str_cat("instruction ", i, " (", instr_to_string(i), "): ", st.message()), st.file(),
                    st.line(), st.hint());
    }
  }
  return Status::OK();
}

Status Program::buffer(int id, Tensor* out) const {
  SG_RETURN_IF_ERROR(check_id(id, "buffer"));
  const Buffer& b = buffers_[id];
  // A view follows its base: re-resolve when a binding changed since (dirty_), not only once.
  if (b.kind == Kind::kView && (dirty_ || !b.bound)) {
    SG_RETURN_IF_ERROR(const_cast<Program*>(this)->resolve_views());
  }
  SG_CHECK(b.bound, StatusCode::kInvalidArgument, str_cat("buffer '", b.name, "' has no memory yet"),
           "call prepare() or bind() first");
  *out = b.tensor;
  return Status::OK();
}

int Program::find_buffer(const std::string& name) const {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (buffers_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::string Program::instr_to_string(int i) const {
  const Instr& ins = instrs_[i];
  std::string s = ins.def->name + "(";
  for (size_t k = 0; k < ins.inputs.size(); ++k) {
    s += str_cat(k ? ", " : "", ins.inputs[k] >= 0 ? buffers_[ins.inputs[k]].name : std::string("-"));
  }
  s += ") -> (";
  for (size_t k = 0; k < ins.outputs.size(); ++k) {
    s += str_cat(k ? ", " : "", ins.outputs[k] >= 0 ? buffers_[ins.outputs[k]].name : std::string("-"));
  }
  return s + ")";
}

std::vector<std::pair<std::string, double>> Program::profile_seconds() const {
  std::map<std::string, double> by_op;
  for (size_t i = 0; i < instrs_.size(); ++i) by_op[instrs_[i].def->name] += op_seconds_[i];
  return {by_op.begin(), by_op.end()};
}

}  // namespace surogate

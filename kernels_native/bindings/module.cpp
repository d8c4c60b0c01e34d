// surogate._native: the only file that knows pybind11 (with dlpack.cpp). It converts between
// Python objects and native types at the edge and releases the GIL around every kernel, every
// Program run and every copy.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <thread>

#include "bindings/dlpack.h"
#include "bindings/errors.h"
#include "core/allocator.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "dist/collective.h"
#include "dist/grad_reducer.h"
#include "runtime/op_contracts.h"
#include "runtime/op_registry.h"
#include "runtime/program.h"

#ifdef SG_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/backend.h"
#endif

namespace py = pybind11;
using namespace surogate;
using surogate::bindings::check;
using surogate::bindings::parse_device;
using surogate::bindings::throw_status;

namespace surogate::bindings {

void bind_serve(py::module_& m);  // bindings/serve.cpp
void bind_dist(py::module_& m);   // bindings/dist.cpp
Tensor to_tensor(const py::handle& h);  // as_tensor below, for the other binding files

void register_error_translator(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const Status& st = e.status;
      static const char* const kClass[] = {
          "SurogateError",      // ok (never raised)
          "InvalidArgumentError", "ShapeError", "DTypeError", "NotFoundError", "OutOfMemoryError",
          "UnsupportedError",   "FileFormatError", "DeviceError", "InternalError", "NetworkError",
      };
      py::object errors = py::module_::import("surogate.errors");
      py::object cls = errors.attr(kClass[static_cast<int>(st.code())]);
      const char* rel = std::strstr(st.file(), "kernels_native/");
      std::string where = st.file() && *st.file() ? str_cat(rel ? rel : st.file(), ":", st.line()) : "";
      py::object hint = st.hint().empty() ? py::object(py::none()) : py::object(py::str(st.hint()));
      py::object loc = where.empty() ? py::object(py::none()) : py::object(py::str(where));
      py::object exc = cls(st.message(), py::arg("hint") = hint, py::arg("where") = loc);
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device{DeviceType::kCPU, 0};
  if (s == "cuda") return Device{DeviceType::kCUDA, 0};
  if (s.rfind("cuda:", 0) == 0) {
    try {
      return Device{DeviceType::kCUDA, std::stoi(s.substr(5))};
    } catch (...) {
    }
  }
  throw_status(SG_ERROR(StatusCode::kInvalidArgument, str_cat("unknown device '", s, "'"),
                        "use 'cpu', 'cuda' or 'cuda:N'"));
}

}  // namespace surogate::bindings

namespace {


DType parse_dtype(const py::handle& h) {
  std::string name;
  if (py::isinstance<py::str>(h)) {
    name = h.cast<std::string>();
  } else {
    name = py::str(py::dtype::from_args(py::reinterpret_borrow<py::object>(h)).attr("name")).cast<std::string>();
  }
  DType dt;
  if (!dtype_from_name(name, &dt)) {
    throw_status(SG_ERROR(StatusCode::kDTypeUnsupported, str_cat("unknown dtype '", name, "'"),
                          "use float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, float64, int8, uint8, "
                          "int32 or int64"));
  }
  return dt;
}

py::dtype numpy_dtype(DType dt) {
  if (dt == DType::kBF16 || dt == DType::kF8E4M3 || dt == DType::kF8E5M2) {
    py::module_::import("ml_dtypes");  // registers the numpy dtypes
    return py::dtype::from_args(py::module_::import("ml_dtypes").attr(dtype_name(dt)));
  }
  return py::dtype(dtype_name(dt));
}

Tensor tensor_from_array(const py::array& arr) {
  DType dt;
  const std::string name = py::str(arr.dtype().attr("name")).cast<std::string>();
  if (!dtype_from_name(name, &dt)) {
    throw_status(SG_ERROR(StatusCode::kDTypeUnsupported, str_cat("numpy dtype '", name, "' is not supported"),
                          "use float32, float16, bfloat16 (ml_dtypes), float64 or an integer type"));
  }
  if (arr.ndim() > kMaxDims) {
    throw_status(SG_ERROR(StatusCode::kInvalidArgument, str_cat("array has ", arr.ndim(), " dims; at most ",
                                                                kMaxDims), ""));
  }
  Tensor t;
  t.data = const_cast<void*>(arr.data());
  t.dtype = dt;
  t.ndim = static_cast<int>(arr.ndim());
  const auto isz = static_cast<int64_t>(arr.itemsize());
  for (int i = 0; i < t.ndim; ++i) {
    t.shape[i] = arr.shape(i);
    if (arr.strides(i) % isz != 0) {
      throw_status(SG_ERROR(StatusCode::kInvalidArgument, "array strides are not a multiple of its item size",
                            "pass np.ascontiguousarray(x)"));
    }
    t.strides[i] = arr.strides(i) / isz;
  }
  // numpy gives an empty array all-zero strides; an empty tensor is contiguous, so say so.
  if (arr.size() == 0) t = Tensor::view_of(t.data, dt, t.shape_vec());
  t.readonly = !arr.writeable();
  // Hold a reference to the array; dropping it may happen off the Python thread.
  auto* ref = new py::object(arr);
  t.owner = std::shared_ptr<void>(ref, [](void* p) {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
  return t;
}

py::array tensor_to_array(const Tensor& t, py::handle base_hint) {
  if (!t.device.is_cpu()) {
    throw_status(SG_ERROR(StatusCode::kInvalidArgument, str_cat("tensor is on ", t.device.to_string()),
                          "copy it to the host first: t.to('cpu')"));
  }
  std::vector<py::ssize_t> shape(t.ndim), strides(t.ndim);
  const auto isz = static_cast<py::ssize_t>(dtype_size(t.dtype));
  for (int i = 0; i < t.ndim; ++i) {
    shape[i] = t.shape[i];
    strides[i] = t.strides[i] * isz;
  }
  // The capsule keeps a copy of the Tensor (and so its owner) alive as long as the array.
  auto* keep = new Tensor(t);
  py::capsule base(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  py::array out(numpy_dtype(t.dtype), shape, strides, t.data, base);
  if (t.readonly) {
    py::detail::array_proxy(out.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  }
  return out;
}

// Anything a Python caller may pass where a tensor is expected.
Tensor as_tensor(const py::handle& h) {
  if (h.is_none()) return Tensor{};
  if (py::isinstance<Tensor>(h)) return h.cast<Tensor>();
  if (py::isinstance<py::array>(h)) return tensor_from_array(py::reinterpret_borrow<py::array>(h));
  if (py::hasattr(h, "__dlpack__")) return bindings::from_dlpack(py::reinterpret_borrow<py::object>(h));
  throw_status(SG_ERROR(StatusCode::kInvalidArgument,
                        str_cat("expected a tensor, numpy array or DLPack object, got ",
                                std::string(py::str(py::type::handle_of(h).attr("__name__")))), ""));
}

Attrs attrs_from_dict(const py::dict& d) {
  Attrs a;
  for (auto item : d) {
    std::string key = py::str(item.first);
    py::handle v = item.second;
    if (py::isinstance<py::bool_>(v)) {
      a.set(key, static_cast<int64_t>(v.cast<bool>()));
    } else if (py::isinstance<py::int_>(v)) {
      a.set(key, v.cast<int64_t>());
    } else if (py::isinstance<py::float_>(v)) {
      a.set(key, v.cast<double>());
    } else if (py::isinstance<py::str>(v)) {
      a.set(key, v.cast<std::string>());
    } else if (py::isinstance<py::sequence>(v)) {
      a.set(key, v.cast<std::vector<int64_t>>());
    } else {
      throw_status(SG_ERROR(StatusCode::kInvalidArgument,
                            str_cat("attribute '", key, "' has unsupported type ",
                                    std::string(py::str(py::type::handle_of(v).attr("__name__")))),
                            "attributes are int, float, bool, str or a list of ints"));
    }
  }
  return a;
}

}  // namespace

Tensor surogate::bindings::to_tensor(const py::handle& h) { return as_tensor(h); }

namespace {

std::string tensor_repr(const Tensor& t) { return str_cat("Tensor(", t.describe(), ")"); }

py::dict build_info() {
  py::dict d;
#ifdef SG_VERSION
  d["version"] = SG_VERSION;
#endif
  d["compiler"] = str_cat("GCC ", __GNUC__, ".", __GNUC_MINOR__, ".", __GNUC_PATCHLEVEL__);
#ifdef SG_CXX_FLAGS
  d["cxx_flags"] = SG_CXX_FLAGS;
#endif
  d["blas"] = SG_BLAS_NAME;
#ifdef SG_WITH_CUDA
  d["cuda"] = true;
  d["cuda_archs"] = SG_CUDA_ARCHS;
  d["cuda_runtime_version"] = cuda::runtime_version();
#else
  d["cuda"] = false;
#endif
  d["threads"] = num_threads();
  return d;
}

py::list cuda_devices() {
  py::list out;
#ifdef SG_WITH_CUDA
  for (const auto& info : cuda::devices()) {
    py::dict d;
    d["index"] = info.index;
    d["name"] = info.name;
    d["compute_capability"] = py::make_tuple(info.cc_major, info.cc_minor);
    d["total_memory"] = info.total_memory;
    d["multiprocessors"] = info.multiprocessors;
    d["driver_version"] = info.driver_version;
    out.append(d);
  }
#endif
  return out;
}

py::dict device_memory(const std::string& device) {
  const Device dev = parse_device(device);
  if (dev.is_cpu()) {
    throw_status(SG_ERROR(StatusCode::kInvalidArgument, "device_memory is for a GPU, not the cpu",
                          "pass \"cuda\" or \"cuda:N\""));
  }
#ifdef SG_WITH_CUDA
  size_t free_b = 0, total_b = 0;
  int before = 0;
  cudaGetDevice(&before);  // restored: the caller's thread keeps its current device
  cudaError_t err = cudaSetDevice(dev.index);
  if (err == cudaSuccess) err = cudaMemGetInfo(&free_b, &total_b);
  cudaSetDevice(before);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw_status(SG_ERROR(StatusCode::kDeviceError,
                          str_cat("cudaMemGetInfo on ", device, ": ", cudaGetErrorString(err)),
                          "run `surogate doctor` to list the GPUs"));
  }
  py::dict d;
  d["free_bytes"] = free_b;
  d["total_bytes"] = total_b;
  return d;
#else
  throw_status(SG_ERROR(StatusCode::kUnsupported, str_cat("this build has no CUDA backend (", device, ")"),
                        "install a build with CUDA; `surogate doctor` shows this one's"));
#endif
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "Surogate's native engine: tensors, ops, programs";
  bindings::register_error_translator(m);
#ifdef SG_WITH_CUDA
  cuda::register_backend();
#endif

  py::class_<Tensor>(m, "Tensor", py::buffer_protocol())
      .def_property_readonly("shape", [](const Tensor& t) { return py::tuple(py::cast(t.shape_vec())); })
      .def_property_readonly("strides", [](const Tensor& t) {
        return py::tuple(py::cast(std::vector<int64_t>(t.strides.begin(), t.strides.begin() + t.ndim)));
      })
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype)); })
      .def_property_readonly("device", [](const Tensor& t) { return t.device.to_string(); })
      .def_property_readonly("ndim", [](const Tensor& t) { return t.ndim; })
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("is_contiguous", &Tensor::is_contiguous)
      .def_property_readonly("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data); })
      .def("numel", &Tensor::numel)
      .def("numpy", [](const Tensor& t) { return tensor_to_array(t, py::none()); },
           "A zero-copy numpy view (bfloat16 / float8 as ml_dtypes types). CPU tensors only.")
      .def("__array__", [](const Tensor& t, py::object dtype, py::object copy) {
             py::array a = tensor_to_array(t, py::none());
             if (!dtype.is_none()) return py::array(a.attr("astype")(dtype));
             return a;
           }, py::arg("dtype") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack__", [](const Tensor& t, py::object stream, py::object max_version, py::object dl_device,
                            py::object copy) { return bindings::to_dlpack(t); },
           py::arg("stream") = py::none(), py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none())
      .def("__dlpack_device__", [](const Tensor& t) { return bindings::dlpack_device(t); })
      .def("to", [](const Tensor& t, const std::string& device) {
             Device dev = parse_device(device);
             if (dev == t.device) return t;
             Tensor out;
             {
               py::gil_scoped_release nogil;
               Tensor src = t;
               check(empty(t.shape_vec(), t.dtype, dev, &out));
               check(copy_tensor(src, out));
             }
             return out;
           }, py::arg("device"))
      .def("copy_from", [](const Tensor& t, py::handle src) {
             Tensor s = as_tensor(src);
             if (s.shape_vec() != t.shape_vec() || s.dtype != t.dtype) {
               throw_status(SG_ERROR(StatusCode::kInvalidArgument,
                                     str_cat("copy_from: source ", dtype_name(s.dtype), s.shape_str(),
                                             " does not match ", dtype_name(t.dtype), t.shape_str()),
                                     "convert the source to the tensor's shape and dtype first"));
             }
             py::gil_scoped_release nogil;
             check(copy_tensor(s, t));
           }, py::arg("src"), "Copy src (a numpy array or Tensor of the same shape and dtype, any device) into this tensor.")
      .def("rows", [](const Tensor& t, int64_t start, int64_t len) {
             if (t.ndim < 1 || !t.is_contiguous() || start < 0 || len < 0 || start + len > t.shape[0]) {
               throw_status(SG_ERROR(StatusCode::kInvalidArgument,
                                     str_cat("rows(", start, ", ", len, ") of ", t.describe()),
                                     "rows of a contiguous tensor, within its first dimension"));
             }
             return t.slice0(start, len);
           }, py::arg("start"), py::arg("len"),
           "Rows [start, start + len) of the first dimension: a view sharing this tensor's memory (and owner).")
      .def("view", [](const Tensor& t, py::handle dtype, const std::vector<int64_t>& shape, int64_t offset) {
             const DType dt = parse_dtype(dtype);
             int64_t n = shape.size() <= kMaxDims ? 1 : -1;
             for (int64_t d : shape) n = d < 0 || n < 0 ? -1 : n * d;
             const int64_t bytes = n * static_cast<int64_t>(dtype_size(dt));
             if (!t.is_contiguous() || offset < 0 || offset % static_cast<int64_t>(dtype_size(dt)) != 0 || n < 0 ||
                 offset + bytes > static_cast<int64_t>(t.nbytes())) {
               throw_status(SG_ERROR(StatusCode::kInvalidArgument,
                                     str_cat("view(", dtype_name(dt), ", ", shape.size(), " dims, ", n,
                                             " elements, offset ", offset, ") of ", t.describe(), " (", t.nbytes(),
                                             " bytes)"),
                                     "bytes [offset, offset + size) of a contiguous tensor, offset a multiple of "
                                     "the new dtype's size"));
             }
             Tensor out = Tensor::view_of(static_cast<char*>(t.data) + offset, dt, shape, t.device, t.owner);
             out.readonly = t.readonly;
             return out;
           }, py::arg("dtype"), py::arg("shape"), py::arg("offset") = 0,
           "Bytes [offset, offset + size) of this contiguous tensor as another dtype and shape: a view sharing its "
           "memory (and owner).")
      .def("reshape", [](const Tensor& t, const std::vector<int64_t>& shape) {
        Tensor out;
        check(t.reshape(shape, &out));
        return out;
      })
      .def("__repr__", &tensor_repr);

  m.def("tensor", [](py::handle obj) { return as_tensor(obj); }, py::arg("obj"),
        "Wrap a numpy array, a Tensor or any DLPack producer without copying.");
  m.def("from_dlpack", [](py::object obj) { return bindings::from_dlpack(obj); }, py::arg("obj"));
  m.def("empty", [](const std::vector<int64_t>& shape, py::handle dtype, const std::string& device) {
          Tensor t;
          check(empty(shape, parse_dtype(dtype), parse_device(device), &t));
          return t;
        }, py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu");
  m.def("host_empty", [](const std::vector<int64_t>& shape, py::handle dtype, bool pinned) {
          const DType dt = parse_dtype(dtype);
          bool ok = shape.size() <= kMaxDims;
          for (int64_t d : shape) ok = ok && d >= 0;
          if (!ok) {
            throw_status(SG_ERROR(StatusCode::kInvalidArgument, "host_empty: a negative dimension or too many",
                                  str_cat("at most ", kMaxDims, " dimensions, each >= 0")));
          }
          Tensor probe = Tensor::view_of(nullptr, dt, shape);
          std::shared_ptr<void> mem;
          {
            py::gil_scoped_release nogil;
            check(allocate_host(probe.nbytes(), pinned, &mem));
          }
          return Tensor::view_of(mem.get(), dt, shape, Device{}, mem);
        }, py::arg("shape"), py::arg("dtype") = "uint8", py::arg("pinned") = false,
        "Host memory of its own (not the allocator's cache), uninitialised; pinned: page-locked for copies to a GPU "
        "(cudaHostAlloc; an error without the CUDA backend and a GPU).");
  m.def("zeros", [](const std::vector<int64_t>& shape, py::handle dtype, const std::string& device) {
          Tensor t;
          check(zeros(shape, parse_dtype(dtype), parse_device(device), &t));
          return t;
        }, py::arg("shape"), py::arg("dtype") = "float32", py::arg("device") = "cpu");

  m.def("call_op", [](const std::string& name, py::sequence inputs, py::sequence outputs, py::dict attrs) {
          std::vector<Tensor> in, out;
          for (auto h : inputs) in.push_back(as_tensor(h));
          for (auto h : outputs) {
            Tensor t = as_tensor(h);
            if (t.readonly) {
              throw_status(SG_ERROR(StatusCode::kInvalidArgument,
                                    str_cat(name, ": output ", out.size(), " is read-only"),
                                    "pass a writeable array as the output"));
            }
            out.push_back(t);
          }
          Attrs a = attrs_from_dict(attrs);
          Status st;
          {
            py::gil_scoped_release nogil;
            st = OpRegistry::global().call(name, in, out, a);
          }
          check(st);
        }, py::arg("name"), py::arg("inputs"), py::arg("outputs"), py::arg("attrs") = py::dict(),
        "Run one op: outputs are written in place.");

  m.def("list_ops", [](const std::string& device) {
          py::list out;
          for (const OpDef* d : OpRegistry::global().list(parse_device(device).type)) {
            py::dict e;
            e["name"] = d->name;
            e["min_inputs"] = d->min_inputs;
            e["max_inputs"] = d->max_inputs;
            e["num_outputs"] = d->num_outputs;
            e["min_outputs"] = d->min_outputs;
            e["doc"] = d->doc;
            e["contracted"] = d->contracted;
            py::list dts;
            for (DType dt : d->dtypes) dts.append(dtype_name(dt));
            e["dtypes"] = dts;
            out.append(e);
          }
          return out;
        }, py::arg("device") = "cpu");

  m.def("op_contracts", [] {
          py::list out;
          for (const OpContract& c : op_contracts()) {
            py::dict e;
            e["name"] = c.name;
            e["min_inputs"] = c.min_inputs;
            e["max_inputs"] = c.max_inputs;
            e["num_outputs"] = c.num_outputs;
            e["min_outputs"] = c.min_outputs;
            e["doc"] = c.doc;
            out.append(e);
          }
          return out;
        }, "The op contract table (runtime/op_contracts.cpp): every op's arity and doc, for all backends.");
  m.def("supports_op", [](const std::string& name, const std::string& device, py::handle dtype) {
          return OpRegistry::global().supports(name, parse_device(device).type, parse_dtype(dtype));
        }, py::arg("name"), py::arg("device") = "cpu", py::arg("dtype") = "float32",
        "True when the device's backend has a kernel for op `name` on activations of `dtype`.");

  py::class_<Program>(m, "Program")
      .def(py::init([](const std::string& device) { return new Program(parse_device(device)); }),
           py::arg("device") = "cpu")
      .def_property_readonly("device", [](const Program& p) { return p.device().to_string(); })
      .def("buffer", [](Program& p, const std::string& name, const std::vector<int64_t>& shape, py::handle dtype,
                        int64_t arena_offset) {
             int id;
             check(p.add_buffer(name, shape, parse_dtype(dtype), arena_offset, &id));
             return id;
           }, py::arg("name"), py::arg("shape"), py::arg("dtype"), py::arg("arena_offset") = -1)
      .def("external", [](Program& p, const std::string& name, const std::vector<int64_t>& shape, py::handle dtype,
                          bool host) {
             int id;
             check(p.add_external(name, shape, parse_dtype(dtype), &id, host));
             return id;
           }, py::arg("name"), py::arg("shape"), py::arg("dtype"), py::arg("host") = false,
           "host: bound to host memory on any device (what weight_fetch copies up from).")
      .def("view", [](Program& p, const std::string& name, int base, const std::vector<int64_t>& shape,
                      int64_t offset, const std::vector<int64_t>& strides) {
             int id;
             check(p.add_view(name, base, shape, offset, &id, strides));
             return id;
           }, py::arg("name"), py::arg("base"), py::arg("shape"), py::arg("offset") = 0,
           py::arg("strides") = std::vector<int64_t>{})
      .def("op", [](Program& p, const std::string& name, const std::vector<int>& inputs, const std::vector<int>& outputs,
                    py::dict attrs) { check(p.add_instr(name, inputs, outputs, attrs_from_dict(attrs))); },
           py::arg("name"), py::arg("inputs"), py::arg("outputs"), py::arg("attrs") = py::dict())
      .def("bind", [](Program& p, int id, py::handle obj) { check(p.bind(id, as_tensor(obj))); })
      .def("prepare", [](Program& p) {
        Status st;
        {
          py::gil_scoped_release nogil;
          st = p.prepare();
        }
        check(st);
      })
      .def("run", [](Program& p, int begin, int end) {
             Status st;
             {
               py::gil_scoped_release nogil;
               st = p.run(begin, end);
             }
             check(st);
           }, py::arg("begin") = 0, py::arg("end") = -1)
      .def("get", [](const Program& p, int id) {
        Tensor t;
        check(p.buffer(id, &t));
        return t;
      })
      .def("find", &Program::find_buffer)
      .def_property_readonly("num_buffers", &Program::num_buffers)
      .def_property_readonly("num_instrs", &Program::num_instrs)
      .def_property_readonly("arena_bytes", &Program::arena_bytes)
      .def("instr", [](const Program& p, int i) {
        if (i < 0 || i >= p.num_instrs()) {
          throw_status(SG_ERROR(StatusCode::kInvalidArgument,
                                str_cat("no instruction ", i, " (program has ", p.num_instrs(), ")"), ""));
        }
        return p.instr_to_string(i);
      })
      .def("set_communicator", &Program::set_communicator, py::arg("comm"),
           "The data-parallel rank's Communicator, which the Program's weight_gather instructions call "
           "(ZeRO-3); None clears it.")
      .def("set_grad_reducer", &Program::set_grad_reducer, py::arg("reducer"),
           "The data-parallel rank's GradReducer, which the Program's grad_reduce / grad_wait instructions "
           "start and wait on; None clears it.")
      .def("set_profiling", &Program::set_profiling)
      .def("profile", &Program::profile_seconds)
      .def("instr_profile", &Program::instr_seconds)
      .def("set_graphs", &Program::set_graphs, py::arg("on"),
           "CUDA graphs: capture each run range on its second run and replay it after.")
      .def_property_readonly("graphs_active", &Program::graphs_active)
      .def_property_readonly("num_graphs", &Program::num_graphs)
      .def("reset_profile", &Program::reset_profile);

  m.def("build_info", &build_info);
  m.def("cpu_features", [] {
    py::dict d;
    for (const auto& [k, v] : cpu_feature_list()) d[py::str(k)] = v;
    d["brand"] = cpu_features().brand;
    d["logical_cpus"] = std::thread::hardware_concurrency();
    return d;
  });
  m.def("cuda_devices", &cuda_devices);
  m.def("num_threads", &num_threads);
  m.def("set_num_threads", &set_num_threads, py::arg("n"));
  m.def("allocator_stats", [](const std::string& device) {
    AllocatorStats s = allocator_stats(parse_device(device));
    py::dict d;
    d["allocated_bytes"] = s.allocated_bytes;
    d["reserved_bytes"] = s.reserved_bytes;
    d["peak_allocated_bytes"] = s.peak_allocated_bytes;
    d["num_allocs"] = s.num_allocs;
    d["num_backend_allocs"] = s.num_backend_allocs;
    return d;
  }, py::arg("device") = "cpu");
  m.def("allocation_size", [](size_t bytes) { return allocation_size(bytes); }, py::arg("bytes"),
        "The bytes the caching allocator holds for a request of `bytes` (it rounds sizes up).");
  m.def("device_memory", &device_memory, py::arg("device"),
        "{free_bytes, total_bytes} of a GPU as its driver counts them: every process's memory, this one's "
        "CUDA context included (allocator_stats counts only this process's caching allocator).");
  m.def("empty_cache", [](const std::string& device) { empty_cache(parse_device(device)); },
        py::arg("device") = "cpu");
  m.def("reset_peak_stats", [](const std::string& device) { reset_peak_stats(parse_device(device)); },
        py::arg("device") = "cpu");
  bindings::bind_serve(m);
  bindings::bind_dist(m);
}

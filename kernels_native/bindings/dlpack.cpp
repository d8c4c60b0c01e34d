#include "bindings/dlpack.h"

#include <cstring>
#include <stdexcept>

#include "bindings/errors.h"

namespace py = pybind11;

namespace surogate::bindings {

namespace {

// ---- DLPack ABI (v0.8) ------------------------------------------------------------------
enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 };
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };
struct DLDevice { int32_t device_type; int32_t device_id; };
struct DLDataType { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct ExportCtx {
  Tensor tensor;  // keeps the memory alive
  int64_t shape[kMaxDims];
  int64_t strides[kMaxDims];
  DLManagedTensor managed;
};

bool to_dl_dtype(DType dt, DLDataType* out) {
  switch (dt) {
    case DType::kF32: *out = {kDLFloat, 32, 1}; return true;
    case DType::kF16: *out = {kDLFloat, 16, 1}; return true;
    case DType::kF64: *out = {kDLFloat, 64, 1}; return true;
    case DType::kBF16: *out = {kDLBfloat, 16, 1}; return true;
    case DType::kI8: *out = {kDLInt, 8, 1}; return true;
    case DType::kU8: *out = {kDLUInt, 8, 1}; return true;
    case DType::kI32: *out = {kDLInt, 32, 1}; return true;
    case DType::kI64: *out = {kDLInt, 64, 1}; return true;
    default: return false;  // fp8 codes are not in DLPack 0.8
  }
}

bool from_dl_dtype(DLDataType d, DType* out) {
  if (d.lanes != 1) return false;
  if (d.code == kDLFloat && d.bits == 32) { *out = DType::kF32; return true; }
  if (d.code == kDLFloat && d.bits == 16) { *out = DType::kF16; return true; }
  if (d.code == kDLFloat && d.bits == 64) { *out = DType::kF64; return true; }
  if (d.code == kDLBfloat && d.bits == 16) { *out = DType::kBF16; return true; }
  if (d.code == kDLInt && d.bits == 8) { *out = DType::kI8; return true; }
  if (d.code == kDLUInt && d.bits == 8) { *out = DType::kU8; return true; }
  if (d.code == kDLInt && d.bits == 32) { *out = DType::kI32; return true; }
  if (d.code == kDLInt && d.bits == 64) { *out = DType::kI64; return true; }
  return false;
}

void export_deleter(DLManagedTensor* m) { delete static_cast<ExportCtx*>(m->manager_ctx); }

void capsule_destructor(PyObject* cap) {
  // Called when the capsule dies. If nobody consumed it, we still own the tensor.
  if (PyCapsule_IsValid(cap, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    if (m && m->deleter) m->deleter(m);
  }
}

}  // namespace

pybind11::capsule to_dlpack(const Tensor& t) {
  DLDataType dt;
  if (!to_dl_dtype(t.dtype, &dt)) {
    throw_status(SG_ERROR(StatusCode::kDTypeUnsupported,
                          str_cat("DLPack has no code for ", dtype_name(t.dtype)),
                          "cast to bfloat16 or float32 first, or use .numpy() (ml_dtypes)"));
  }
  auto* ctx = new ExportCtx();
  ctx->tensor = t;
  for (int i = 0; i < t.ndim; ++i) {
    ctx->shape[i] = t.shape[i];
    ctx->strides[i] = t.strides[i];
  }
  DLTensor& d = ctx->managed.dl_tensor;
  d.data = t.data;
  d.device = {t.device.is_cpu() ? kDLCPU : kDLCUDA, t.device.is_cpu() ? 0 : t.device.index};
  d.ndim = t.ndim;
  d.dtype = dt;
  d.shape = ctx->shape;
  d.strides = ctx->strides;
  d.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = export_deleter;
  PyObject* cap = PyCapsule_New(&ctx->managed, "dltensor", capsule_destructor);
  if (!cap) {
    delete ctx;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

std::pair<int, int> dlpack_device(const Tensor& t) {
  return {t.device.is_cpu() ? kDLCPU : kDLCUDA, t.device.is_cpu() ? 0 : t.device.index};
}

Tensor from_dlpack(const py::object& obj) {
  py::object cap_obj = obj;
  if (!PyCapsule_CheckExact(obj.ptr())) {
    if (!py::hasattr(obj, "__dlpack__")) {
      throw_status(SG_ERROR(StatusCode::kInvalidArgument,
                            str_cat("object of type ", std::string(py::str(py::type::handle_of(obj).attr("__name__"))),
                                    " has no __dlpack__"),
                            "pass a numpy array, a torch tensor or another DLPack producer"));
    }
    cap_obj = obj.attr("__dlpack__")();
  }
  PyObject* cap = cap_obj.ptr();
  if (!PyCapsule_IsValid(cap, "dltensor")) {
    throw_status(SG_ERROR(StatusCode::kInvalidArgument, "DLPack capsule is not an unconsumed 'dltensor'",
                          "each capsule can be consumed once"));
  }
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
  const DLTensor& d = m->dl_tensor;
  DType dt;
  if (!from_dl_dtype(d.dtype, &dt)) {
    throw_status(SG_ERROR(StatusCode::kDTypeUnsupported,
                          str_cat("unsupported DLPack dtype (code ", int(d.dtype.code), ", bits ", int(d.dtype.bits),
                                  ", lanes ", d.dtype.lanes, ")"), ""));
  }
  if (d.ndim > kMaxDims) {
    throw_status(SG_ERROR(StatusCode::kInvalidArgument, str_cat("DLPack tensor has ", d.ndim, " dims; at most ",
                                                                kMaxDims), ""));
  }
  Device dev;
  if (d.device.device_type == kDLCPU || d.device.device_type == kDLCUDAHost) {
    dev = Device{DeviceType::kCPU, 0};
  } else if (d.device.device_type == kDLCUDA) {
    dev = Device{DeviceType::kCUDA, d.device.device_id};
  } else {
    throw_status(SG_ERROR(StatusCode::kUnsupported, str_cat("DLPack device type ", d.device.device_type,
                                                            " is not supported"), ""));
  }
  Tensor t;
  t.data = static_cast<char*>(d.data) + d.byte_offset;
  t.dtype = dt;
  t.device = dev;
  t.ndim = d.ndim;
  int64_t stride = 1;
  for (int i = d.ndim - 1; i >= 0; --i) {
    t.shape[i] = d.shape[i];
    t.strides[i] = d.strides ? d.strides[i] : stride;
    stride *= d.shape[i];
  }
  // We own the managed tensor now; its deleter may touch Python objects, so take the GIL.
  PyCapsule_SetName(cap, "used_dltensor");
  t.owner = std::shared_ptr<void>(m, [](void* p) {
    auto* mt = static_cast<DLManagedTensor*>(p);
    if (!mt->deleter) return;
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      mt->deleter(mt);
    }
  });
  return t;
}

}  // namespace surogate::bindings

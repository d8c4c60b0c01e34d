#include "core/status.h"

#include <cstring>

namespace surogate {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid_argument";
    case StatusCode::kShapeMismatch: return "shape_mismatch";
    case StatusCode::kDTypeUnsupported: return "dtype_unsupported";
    case StatusCode::kNotFound: return "not_found";
    case StatusCode::kOutOfMemory: return "out_of_memory";
    case StatusCode::kUnsupported: return "unsupported";
    case StatusCode::kIOError: return "io_error";
    case StatusCode::kDeviceError: return "device_error";
    case StatusCode::kInternal: return "internal";
    case StatusCode::kNetworkError: return "network_error";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string out = message_;
  if (file_ && *file_) {
    // Show the path from kernels_native/ on, not the build machine's absolute path.
    const char* rel = std::strstr(file_, "kernels_native/");
    out += str_cat(" (at ", rel ? rel : file_, ":", line_, ")");
  }
  if (!hint_.empty()) out += "\nHINT: " + hint_;
  return out;
}

}  // namespace surogate

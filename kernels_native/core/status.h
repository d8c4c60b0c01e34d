// Status: how native code reports failure. Every fallible function returns a Status carrying a
// code, a message, the file:line where it was raised and a hint that says what to do. The
// bindings turn a non-OK Status into a Python SurogateError subclass; nothing here aborts.
#pragma once

#include <sstream>
#include <string>
#include <utility>

namespace surogate {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,  // bad value from the caller (shape, attribute, index)
  kShapeMismatch,    // tensors whose shapes do not fit together
  kDTypeUnsupported, // op has no kernel for this dtype
  kNotFound,         // unknown op, buffer, file
  kOutOfMemory,      // allocator could not satisfy a request
  kUnsupported,      // feature not built or not available on this device
  kIOError,          // file system or format problem
  kDeviceError,      // CUDA / driver failure
  kInternal,         // a bug in surogate: please report
  kNetworkError,     // a peer process's connection failed, timed out or sent garbage (collectives)
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message, const char* file = "", int line = 0, std::string hint = "")
      : code_(code), message_(std::move(message)), file_(file), line_(line), hint_(std::move(hint)) {}

  static Status OK() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }
  const char* file() const { return file_; }
  int line() const { return line_; }
  // "message (at file:line)" plus "\nHINT: hint" when there is one.
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  const char* file_ = "";
  int line_ = 0;
  std::string hint_;
};

// Concatenate anything streamable into a string: str_cat("shape ", n, " != ", m).
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// Return the Status from the enclosing function when `cond` is false. `msg` and `hint` are
// expressions evaluated only on failure.
#define SG_CHECK(cond, code, msg, hint)                                                        \
  do {                                                                                         \
    if (!(cond)) return ::surogate::Status((code), (msg), __FILE__, __LINE__, (hint));         \
  } while (0)

#define SG_CHECK_ARG(cond, msg) SG_CHECK(cond, ::surogate::StatusCode::kInvalidArgument, msg, "")
#define SG_CHECK_SHAPE(cond, msg) SG_CHECK(cond, ::surogate::StatusCode::kShapeMismatch, msg, "")

#define SG_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::surogate::Status _sg_st = (expr);          \
    if (!_sg_st.ok()) return _sg_st;             \
  } while (0)

#define SG_ERROR(code, msg, hint) ::surogate::Status((code), (msg), __FILE__, __LINE__, (hint))

}  // namespace surogate

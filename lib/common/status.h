// Errors as values. Every fallible function in pmirror returns a Status or a
// Result<T>; the message says what failed and, where it helps, what to do.
// No exception crosses a component boundary or the C API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace pmirror {

// Error classes. Stable: the numeric values appear on the wire (ErrorReply)
// and in the C API (negated), so only append.
enum class Errc : uint16_t {
  kOk = 0,
  kInvalidArgument = 1,   // caller passed something out of range or malformed
  kNotFound = 2,          // path, volume, peer does not exist
  kPermissionDenied = 3,  // file mode, unknown peer, authentication failed
  kAlreadyExists = 4,     // create over an existing file, second writer
  kIoError = 5,           // a system call on a file or device failed
  kProtocolError = 6,     // a peer sent something malformed or unexpected
  kConnectionError = 7,   // connect/accept failed, peer vanished
  kTimeout = 8,           // no answer in time
  kUnsupported = 9,       // the device/target cannot do what was asked
  kBusy = 10,             // resource in use (volume has a writer)
  kConfigError = 11,      // configuration file or flag is wrong
  kInternal = 12,         // a bug: an invariant did not hold
  kClosed = 13,           // the object was shut down
  kResourceExhausted = 14,
  kSplitBrain = 15,          // two copies both moved on from a common generation
  kFailedPrecondition = 16,  // the object is not in a state that allows this
};

std::string_view errc_name(Errc code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Errc code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Errc::kOk; }
  explicit operator bool() const { return ok(); }
  Errc code() const { return code_; }
  const std::string& message() const { return message_; }

  // "what failed: why" -- prefixes context to an error from below.
  Status with_context(std::string_view context) const;
  // "<code name>: <message>", for logs.
  std::string to_string() const;

 private:
  Errc code_ = Errc::kOk;
  std::string message_;
};

// Builds "<what>: <strerror(err)>" as an I/O-class error.
Status errno_status(Errc code, std::string_view what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {
    if (status_.ok()) status_ = Status(Errc::kInternal, "Result built from an ok Status");
  }
  Result(Errc code, std::string message) : status_(code, std::move(message)) {}

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace pmirror

// Propagates a failed Status from an expression that yields one.
#define PMIRROR_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::pmirror::Status pmirror_status_ = (expr);        \
    if (!pmirror_status_.ok()) return pmirror_status_; \
  } while (0)

#define PMIRROR_CONCAT_INNER(a, b) a##b
#define PMIRROR_CONCAT(a, b) PMIRROR_CONCAT_INNER(a, b)
// auto x = PMIRROR_TRY(result_expr) is not portable C++; use:
//   PMIRROR_ASSIGN_OR_RETURN(auto x, expr);
#define PMIRROR_ASSIGN_OR_RETURN(lhs, expr)                    \
  auto PMIRROR_CONCAT(pmirror_result_, __LINE__) = (expr);     \
  if (!PMIRROR_CONCAT(pmirror_result_, __LINE__).ok())         \
    return PMIRROR_CONCAT(pmirror_result_, __LINE__).status(); \
  lhs = std::move(PMIRROR_CONCAT(pmirror_result_, __LINE__)).value()

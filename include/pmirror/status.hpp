// Errors as values: what every fallible call of libpmirror's C++ API
// returns (and what pmirror uses inside, through lib/common/status.h). A
// Status is ok or carries an error class (Errc) and a message that says
// what failed and, where it helps, what to do. Result<T> is a T or the
// Status saying why there is none. No exception leaves libpmirror.
#pragma once

#include <pmirror/export.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace pmirror {

// Error classes. Stable: the numeric values appear on the wire (ErrorReply)
// and in the C API (negated, PMIRROR_E_* in pmirror.h), so only append.
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
  kFenced = 17,              // another copy was promoted: this primary may no longer write
  kLeaseLost = 18,  // the promoter's lease of the volume ran out: this primary must stop writing
};

// "invalid argument", "split brain", ...; "unknown error" for a value not above.
PMIRROR_EXPORT std::string_view errc_name(Errc code);

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
  PMIRROR_EXPORT Status with_context(std::string_view context) const;
  // "<code name>: <message>", for logs.
  PMIRROR_EXPORT std::string to_string() const;

 private:
  Errc code_ = Errc::kOk;
  std::string message_;
};

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

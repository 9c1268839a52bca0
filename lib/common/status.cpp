#include "common/status.h"

#include <cstring>

namespace pmirror {

std::string_view errc_name(Errc code) {
  switch (code) {
    case Errc::kOk: return "ok";
    case Errc::kInvalidArgument: return "invalid argument";
    case Errc::kNotFound: return "not found";
    case Errc::kPermissionDenied: return "permission denied";
    case Errc::kAlreadyExists: return "already exists";
    case Errc::kIoError: return "I/O error";
    case Errc::kProtocolError: return "protocol error";
    case Errc::kConnectionError: return "connection error";
    case Errc::kTimeout: return "timeout";
    case Errc::kUnsupported: return "unsupported";
    case Errc::kBusy: return "busy";
    case Errc::kConfigError: return "config error";
    case Errc::kInternal: return "internal error";
    case Errc::kClosed: return "closed";
    case Errc::kResourceExhausted: return "resource exhausted";
    case Errc::kSplitBrain: return "split brain";
    case Errc::kFailedPrecondition: return "failed precondition";
    case Errc::kFenced: return "fenced";
    case Errc::kLeaseLost:
      return "lease lost";
  }
  return "unknown error";
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  std::string message(context);
  message += ": ";
  message += message_;
  return Status(code_, std::move(message));
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  std::string out(errc_name(code_));
  out += ": ";
  out += message_;
  return out;
}

Status errno_status(Errc code, std::string_view what, int err) {
  std::string message(what);
  message += ": ";
  message += std::strerror(err);
  return Status(code, std::move(message));
}

}  // namespace pmirror

// Errors as values. Every fallible function in pmirror returns a Status or a
// Result<T>; the message says what failed and, where it helps, what to do.
// No exception crosses a component boundary or the C API.
//
// Status, Result<T> and Errc are public (include/pmirror/status.hpp, part of
// libpmirror's C++ API); what only pmirror's own code uses is here.
#pragma once

#include <pmirror/status.hpp>
#include <string_view>
#include <variant>  // kept: code here relied on it through this header

namespace pmirror {

// Builds "<what>: <strerror(err)>" as an I/O-class error.
Status errno_status(Errc code, std::string_view what, int err);

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

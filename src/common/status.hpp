// Building Status values with messages that say what was given, what is supported, and where.
#pragma once

#include <string>
#include <utility>

#include "common/format.hpp"
#include "raggedattn/raggedattn.hpp"

namespace raggedattn {

template <class... Args>
Status invalid_value(const char* where, Args&&... args) {
  return Status(RATTN_ERROR_INVALID_VALUE,
                str_cat("raggedattn: ", where, ": ", std::forward<Args>(args)...));
}
template <class... Args>
Status not_supported(const char* where, Args&&... args) {
  return Status(RATTN_ERROR_NOT_SUPPORTED,
                str_cat("raggedattn: ", where, ": ", std::forward<Args>(args)...));
}
template <class... Args>
Status workspace_error(const char* where, Args&&... args) {
  return Status(RATTN_ERROR_WORKSPACE,
                str_cat("raggedattn: ", where, ": ", std::forward<Args>(args)...));
}

#define RATTN_RETURN_IF_ERROR(expr)   \
  do {                                \
    ::raggedattn::Status _s = (expr); \
    if (!_s.ok()) return _s;          \
  } while (0)

}  // namespace raggedattn

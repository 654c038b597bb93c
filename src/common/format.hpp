// Text for messages, built without iostreams or locales.
//
// The library formats its error messages and plan descriptions inside processes it does not own
// (PyTorch, JAX, a training job's C++). iostreams would tie each message to the C++ runtime's
// locale machinery and to the host's global locale (which may print 1000 as "1,000"); plain
// appends with std::to_chars depend on neither, and cannot fail except by allocation.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace raggedattn {
namespace format_detail {

inline void append(std::string& out, std::string_view text) {
  out.append(text);
}
inline void append(std::string& out, const char* text) {
  out.append(text ? text : "(null)");
}
inline void append(std::string& out, char c) {
  out.push_back(c);
}
inline void append(std::string& out, bool b) {
  out.push_back(b ? '1' : '0');
}

// Addresses print as 0x-prefixed hex, as an ostream prints them.
inline void append(std::string& out, const void* ptr) {
  char buf[2 + 2 * sizeof(uintptr_t)] = {'0', 'x'};
  auto r = std::to_chars(buf + 2, buf + sizeof(buf), reinterpret_cast<uintptr_t>(ptr), 16);
  out.append(buf, r.ptr);
}

template <class T>
void append_number(std::string& out, T value) {
  char buf[64];
  std::to_chars_result r;
  if constexpr (std::is_floating_point_v<T>) {
    // Six significant digits, shortest form: what an ostream prints by default.
    r = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::general, 6);
  } else {
    r = std::to_chars(buf, buf + sizeof(buf), value);
  }
  out.append(buf, r.ptr);
}

template <class T>
void append(std::string& out, const T& value) {
  using U = std::decay_t<T>;
  if constexpr (std::is_enum_v<U>) {
    append_number(out, static_cast<std::underlying_type_t<U>>(value));
  } else if constexpr (std::is_arithmetic_v<U>) {
    append_number(out, value);
  } else if constexpr (std::is_same_v<U, char*> || std::is_same_v<U, const char*>) {
    append(out, static_cast<const char*>(value));  // text, null-safe
  } else if constexpr (std::is_pointer_v<U>) {
    append(out, static_cast<const void*>(value));
  } else {
    static_assert(std::is_convertible_v<const U&, std::string_view>,
                  "str_cat: no text form for this type");
    append(out, std::string_view(value));
  }
}

}  // namespace format_detail

// The concatenation of each argument's text: strings as they are, numbers in the C locale.
template <class... Args>
std::string str_cat(const Args&... args) {
  std::string out;
  (format_detail::append(out, args), ...);
  return out;
}

}  // namespace raggedattn

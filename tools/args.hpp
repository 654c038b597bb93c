// Command-line parsing of the `raggedattn` command: options, values, and the errors (exit code 2)
// that name the bad argument and what is accepted.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace raggedattn {
namespace cli {

// A bad argument; main() prints it and exits with 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The arguments after the command, consumed option by option. "--name value" and "--name=value"
// are both accepted.
class Args {
 public:
  Args(int argc, char** argv, int first);

  bool done() const { return pos_ >= items_.size(); }
  // The next option's name ("--x"); throws on a stray value.
  std::string next_option();
  // The value of the option just read; throws when it is missing.
  std::string value(const std::string& option);
  // Throws if the option just read was given a value with '='.
  void no_value(const std::string& option);

 private:
  std::vector<std::string> items_;
  size_t pos_ = 0;
  std::string pending_;  // value given as --name=value
  bool has_pending_ = false;
};

int32_t parse_int(const std::string& option, const std::string& text, int64_t min, int64_t max);
uint64_t parse_u64(const std::string& option, const std::string& text);
float parse_float(const std::string& option, const std::string& text, double min);
// "100,80,76" (each >= 0, and their sum at most INT32_MAX: cu_seqlens are int32).
std::vector<int32_t> parse_lengths(const std::string& option, const std::string& text);
// "32/8".
void parse_heads(const std::string& option, const std::string& text, int32_t* hq, int32_t* hkv);
// "L,R" (each -1 or >= 0).
void parse_window(const std::string& option, const std::string& text, int32_t* left,
                  int32_t* right);

}  // namespace cli
}  // namespace raggedattn

// Message text (common/format.hpp): numbers in the C locale whatever the host process set, every
// argument type the library's messages use.
#include "common/format.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <locale>
#include <sstream>
#include <string>

namespace raggedattn {
namespace {

// A locale that groups digits by thousands, as a host process may install globally.
struct Thousands : std::numpunct<char> {
  char do_thousands_sep() const override { return ','; }
  std::string do_grouping() const override { return "\3"; }
};

TEST(StrCat, NumbersIgnoreTheHostsGlobalLocale) {
  const std::locale previous =
      std::locale::global(std::locale(std::locale::classic(), new Thousands));
  std::ostringstream stream;  // takes the global locale, as the library's messages once did
  stream << 1234567;
  const std::string streamed = stream.str();
  const std::string ours = str_cat(1234567, " ", int64_t{-9876543210}, " ", size_t{4096});
  std::locale::global(previous);
  ASSERT_EQ(streamed, "1,234,567");  // the locale is in force: the comparison below means something
  EXPECT_EQ(ours, "1234567 -9876543210 4096");
}

TEST(StrCat, EveryArgumentTypeOfTheMessages) {
  enum Small { kThree = 3 };
  const std::string text = "text";
  const char* null_text = nullptr;
  EXPECT_EQ(str_cat("a", text, 'c', std::string_view("sv")), "atextcsv");
  EXPECT_EQ(str_cat(null_text), "(null)");
  EXPECT_EQ(str_cat(kThree, " ", true, false), "3 10");
  EXPECT_EQ(str_cat(0.5f, " ", -1.0, " ", 0.125, " ", 1e-7, " ", 123456789.0),
            "0.5 -1 0.125 1e-07 1.23457e+08");
  EXPECT_EQ(str_cat(static_cast<const void*>(nullptr)), "0x0");
  EXPECT_EQ(str_cat(reinterpret_cast<const int*>(uintptr_t{0x1234abc})), "0x1234abc");
  EXPECT_EQ(str_cat(), "");
}

}  // namespace
}  // namespace raggedattn

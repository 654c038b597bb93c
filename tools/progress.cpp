#include "progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>

namespace raggedattn {
namespace cli {
namespace {

// The terminal's width: a longer line would wrap, and '\r' returns to its last row only.
size_t terminal_columns() {
  winsize w{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  return 80;
}

}  // namespace

Progress::Progress(bool asked) : terminal_(isatty(STDERR_FILENO) == 1) {
  on_ = asked || terminal_;
}

void Progress::set_task(const std::string& task) {
  task_ = task;
  phase_.clear();  // the new task's first phase shows at once
}

void Progress::update(const std::string& phase, int64_t done, int64_t total) {
  if (!on_) return;
  // Rows finish thousands of times a second: a terminal is redrawn 10 times a second, and a
  // plain line is written per phase and then every 5 seconds.
  const auto now = std::chrono::steady_clock::now();
  const auto every = terminal_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000);
  if (phase == phase_ && now - last_ < every) return;
  phase_ = phase;
  last_ = now;
  std::string text = task_.empty() ? phase : task_ + ": " + phase;
  if (total > 0) {
    text += ", rows " + std::to_string(done) + "/" + std::to_string(total) + " (" +
            std::to_string(100 * done / total) + "%)";
  }
  show(text);
}

void Progress::show(const std::string& text) {
  if (!terminal_) {
    std::fprintf(stderr, "progress: %s\n", text.c_str());
    return;
  }
  const std::string line = text.substr(0, terminal_columns() - 1);
  // Spaces over what is left of a longer previous line.
  const int pad = shown_ > line.size() ? int(shown_ - line.size()) : 0;
  std::fprintf(stderr, "\r%s%*s", line.c_str(), pad, "");
  std::fflush(stderr);
  shown_ = line.size();
}

void Progress::clear() {
  if (!terminal_ || shown_ == 0) return;
  std::fprintf(stderr, "\r%*s\r", int(shown_), "");
  std::fflush(stderr);
  shown_ = 0;
}

}  // namespace cli
}  // namespace raggedattn

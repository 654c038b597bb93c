// Progress of the command's long CPU work (the CPU reference, the float64 brute force) on stderr:
// on a terminal one line rewritten in place, elsewhere (with --progress) plain lines. stdout keeps
// the results alone: scripts and tests parse it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace raggedattn {
namespace cli {

class Progress {
 public:
  // Reports when `asked` (--progress) or where stderr is a terminal; otherwise never.
  explicit Progress(bool asked);
  ~Progress() { clear(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool on() const { return on_; }
  // What the reports are about from now on, e.g. "case 3/27 gqa_causal_256" ("": the one problem).
  void set_task(const std::string& task);
  // A phase starting (total 0), or `done` of its `total` rows: RunOptions::progress's calls.
  void update(const std::string& phase, int64_t done, int64_t total);
  // Erases the terminal's progress line, so that results printed next start on a clean line.
  void clear();

 private:
  void show(const std::string& text);

  bool on_ = false;
  bool terminal_ = false;
  std::string task_, phase_;
  size_t shown_ = 0;  // characters of the progress line now on the terminal
  std::chrono::steady_clock::time_point last_;
};

}  // namespace cli
}  // namespace raggedattn

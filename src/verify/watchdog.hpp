// A deadline on work that may never end: a case's calls on the device. A kernel that spins on a
// flag nobody sets (a dQ claim never marked, a deterministic turn never passed) blocks every later
// CUDA call of the process, so without a deadline a run stalls without a word until an outer
// timeout kills it, and the case that hung is lost. Past its deadline the watchdog names the work
// on stderr and ends the process with exit status kExitHang, running no destructor: each would
// wait on the device too.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace raggedattn {
namespace verify {

constexpr int kExitHang = 3;

class Watchdog {
 public:
  // seconds <= 0: no deadline (no thread). `what` names the work in the message.
  Watchdog(double seconds, std::string what);
  ~Watchdog();  // disarms
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void start(double seconds, std::string what);

  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace verify
}  // namespace raggedattn

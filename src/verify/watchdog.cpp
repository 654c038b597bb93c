#include "verify/watchdog.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace raggedattn {
namespace verify {

Watchdog::Watchdog(double seconds, std::string what) {
  if (seconds <= 0) return;
  thread_ = std::thread([this, seconds, what = std::move(what)] {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto deadline = std::chrono::duration<double>(seconds);
    if (done_cv_.wait_for(lock, deadline, [this] { return done_; })) return;
    std::fprintf(stderr,
                 "raggedattn verify: %s: still running after %g s, so a kernel hangs. Exiting "
                 "with status %d: every later call on the device would wait on it.\n",
                 what.c_str(), seconds, kExitHang);
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(kExitHang);
  });
}

Watchdog::~Watchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  done_cv_.notify_one();
  thread_.join();
}

}  // namespace verify
}  // namespace raggedattn

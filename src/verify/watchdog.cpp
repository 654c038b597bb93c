#include "verify/watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <system_error>
#include <utility>

namespace raggedattn {
namespace verify {

Watchdog::Watchdog(double seconds, std::string what) {
  if (seconds <= 0) return;
  // Held under ~4 months: the wait's deadline is a clock reading in 64-bit nanoseconds, which a
  // deadline of centuries would overflow.
  seconds = std::min(seconds, 1e7);
  // A process that cannot start one more thread runs the work without a deadline rather than
  // failing it.
  try {
    start(seconds, std::move(what));
  } catch (const std::system_error&) {
  }
}

void Watchdog::start(double seconds, std::string what) {
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

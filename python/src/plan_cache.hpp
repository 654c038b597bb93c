// Plans of the C API, cached by problem. The PyTorch binding (module.cpp) and the XLA FFI
// handlers of the JAX binding (xla_ffi.cpp) share this one cache, so a plan made at trace time to
// size a workspace is the plan the handler runs.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>

#include "raggedattn/raggedattn.h"

namespace raggedattn_py {

// A C API call that failed: its status and the library's message (rattn_last_error()).
class LibraryError : public std::runtime_error {
 public:
  LibraryError(rattn_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  rattn_status status() const { return status_; }

 private:
  rattn_status status_;
};

// Throws LibraryError carrying rattn_last_error() when `status` is not RATTN_SUCCESS.
void check(rattn_status status);

// One immutable plan; destroyed when the cache and every caller have let go of it.
class Plan {
 public:
  explicit Plan(rattn_plan* plan);
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  const rattn_plan* get() const { return plan_; }
  size_t workspace_bytes(rattn_direction dir) const {
    return dir == RATTN_FORWARD ? fwd_workspace_ : bwd_workspace_;
  }
  rattn_path path() const { return rattn_plan_path(plan_); }
  std::string describe() const;

  // Both throw LibraryError on failure.
  void forward(const rattn_fwd_tensors& t, void* workspace, size_t workspace_bytes,
               void* stream) const;
  void backward(const rattn_bwd_tensors& t, void* workspace, size_t workspace_bytes,
                void* stream) const;

 private:
  rattn_plan* plan_;
  size_t fwd_workspace_ = 0;
  size_t bwd_workspace_ = 0;
};

// The plan of `problem` for CUDA device `device` (its capabilities are queried once per device;
// -1: the current device). The CPU backend ignores the device. Throws LibraryError where the
// library rejects the problem.
std::shared_ptr<const Plan> get_plan(const rattn_problem& problem, int device);

size_t plan_cache_size();
void clear_plan_cache();

}  // namespace raggedattn_py

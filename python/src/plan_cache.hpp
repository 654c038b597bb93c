// Plans of the C API, cached by problem. The PyTorch binding (module.cpp) and the XLA FFI
// handlers of the JAX binding (xla_ffi.cpp) share this one cache, so a plan made at trace time to
// size a workspace is the plan the handler runs.
//
// Failures are values (Status), never C++ exceptions: the extension shares its process with
// frameworks that bring their own C++ runtimes, and its error paths should not depend on them.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "raggedattn/raggedattn.h"

namespace raggedattn_py {

// The outcome of a C API call: success, or its status and the library's message.
struct Status {
  rattn_status code = RATTN_SUCCESS;
  std::string message;

  bool ok() const { return code == RATTN_SUCCESS; }
  // A problem the library rejects (as opposed to a failure while running).
  bool bad_input() const {
    return code == RATTN_ERROR_INVALID_VALUE || code == RATTN_ERROR_NOT_SUPPORTED;
  }
  // `code`, with rattn_last_error() as the message when it is a failure.
  static Status of(rattn_status code);
};

// One immutable plan; destroyed when the cache and every caller have let go of it.
class Plan {
 public:
  ~Plan();
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // Takes ownership of `plan` (destroyed on failure too).
  static Status adopt(rattn_plan* plan, std::shared_ptr<const Plan>* out);

  const rattn_plan* get() const { return plan_; }
  size_t workspace_bytes(rattn_direction dir) const {
    return dir == RATTN_FORWARD ? fwd_workspace_ : bwd_workspace_;
  }
  rattn_path path() const { return rattn_plan_path(plan_); }
  std::string describe() const;

  Status forward(const rattn_fwd_tensors& t, void* workspace, size_t workspace_bytes,
                 void* stream) const;
  Status backward(const rattn_bwd_tensors& t, void* workspace, size_t workspace_bytes,
                  void* stream) const;

 private:
  explicit Plan(rattn_plan* plan) : plan_(plan) {}

  rattn_plan* plan_;
  size_t fwd_workspace_ = 0;
  size_t bwd_workspace_ = 0;
};

// The plan of `problem` for CUDA device `device` (its capabilities are queried once per device;
// -1: the current device); the CPU backend ignores the device. On failure *out is left empty and
// the status carries the library's message.
Status get_plan(const rattn_problem& problem, int device, std::shared_ptr<const Plan>* out);

size_t plan_cache_size();
void clear_plan_cache();

}  // namespace raggedattn_py

// The C API: a thin translation onto the C++ API, with the message of the last failure kept per
// thread for rattn_last_error().
#include <cstring>
#include <exception>
#include <string>

#include "common/status.hpp"
#include "raggedattn/raggedattn.h"
#include "raggedattn/raggedattn.hpp"

struct rattn_plan {
  raggedattn::Plan plan;
};

namespace {

thread_local std::string g_last_error;

rattn_status record(const raggedattn::Status& s) {
  g_last_error = s.ok() ? std::string() : s.message();
  return s.code();
}

template <class F>
rattn_status guarded(F&& f) {
  try {
    return record(f());
  } catch (const std::exception& e) {
    return record(raggedattn::Status(RATTN_ERROR_INTERNAL,
                                     std::string("raggedattn: internal error: ") + e.what()));
  } catch (...) {
    return record(raggedattn::Status(RATTN_ERROR_INTERNAL, "raggedattn: internal error"));
  }
}

}  // namespace

extern "C" {

const char* rattn_version(void) {
  return "0.1.0";
}
int rattn_built_with_cuda(void) {
  return raggedattn::built_with_cuda() ? 1 : 0;
}
const char* rattn_last_error(void) {
  return g_last_error.c_str();
}

const char* rattn_path_name(rattn_path p) {
  return p == RATTN_PATH_NONE ? "none" : raggedattn::path_name(static_cast<raggedattn::Path>(p));
}

const char* rattn_status_name(rattn_status s) {
  switch (s) {
    case RATTN_SUCCESS:
      return "success";
    case RATTN_ERROR_INVALID_VALUE:
      return "invalid value";
    case RATTN_ERROR_NOT_SUPPORTED:
      return "not supported";
    case RATTN_ERROR_WORKSPACE:
      return "workspace error";
    case RATTN_ERROR_CUDA:
      return "CUDA error";
    case RATTN_ERROR_INTERNAL:
      return "internal error";
  }
  return "unknown status";
}

void rattn_problem_init(rattn_problem* problem) {
  if (problem) *problem = raggedattn::default_problem();
}

rattn_status rattn_query_device(int device, rattn_device_caps* caps) {
  return guarded([&] {
    if (!caps) return raggedattn::invalid_value("rattn_query_device", "caps is null");
    *caps = raggedattn::query_device(device);
    return raggedattn::Status::Ok();
  });
}

rattn_status rattn_plan_create(const rattn_problem* problem, const rattn_device_caps* caps,
                               rattn_plan** plan) {
  return guarded([&] {
    if (!problem || !plan) {
      return raggedattn::invalid_value("rattn_plan_create", "problem and plan must not be null");
    }
    *plan = nullptr;
    raggedattn::DeviceCaps c = caps ? *caps : raggedattn::query_device(-1);
    raggedattn::Plan p;
    raggedattn::Status s = raggedattn::make_plan(*problem, c, &p);
    if (s.ok()) *plan = new rattn_plan{std::move(p)};
    return s;
  });
}

void rattn_plan_destroy(rattn_plan* plan) {
  delete plan;
}

rattn_status rattn_plan_workspace_size(const rattn_plan* plan, rattn_direction dir, size_t* bytes) {
  return guarded([&] {
    if (!plan || !bytes) {
      return raggedattn::invalid_value("rattn_plan_workspace_size",
                                       "plan and bytes must not be null");
    }
    if (dir != RATTN_FORWARD && dir != RATTN_BACKWARD) {
      return raggedattn::invalid_value("rattn_plan_workspace_size", "direction=", int(dir),
                                       "; supported: forward (0), backward (1)");
    }
    *bytes = plan->plan.workspace_bytes(static_cast<raggedattn::Direction>(dir));
    return raggedattn::Status::Ok();
  });
}

rattn_path rattn_plan_path(const rattn_plan* plan) {
  return plan ? static_cast<rattn_path>(plan->plan.path()) : RATTN_PATH_NONE;
}

rattn_status rattn_plan_describe(const rattn_plan* plan, char* buffer, size_t size) {
  return guarded([&] {
    if (!plan || !buffer || size == 0) {
      return raggedattn::invalid_value("rattn_plan_describe", "plan and buffer must not be null");
    }
    std::string d = plan->plan.describe();
    size_t n = d.size() < size - 1 ? d.size() : size - 1;
    std::memcpy(buffer, d.data(), n);
    buffer[n] = '\0';
    return raggedattn::Status::Ok();
  });
}

rattn_status rattn_forward(const rattn_plan* plan, const rattn_fwd_tensors* tensors,
                           void* workspace, size_t workspace_bytes, void* stream) {
  return guarded([&] {
    if (!plan || !tensors) {
      return raggedattn::invalid_value("rattn_forward", "plan and tensors must not be null");
    }
    return raggedattn::forward(plan->plan, *tensors, workspace, workspace_bytes, stream);
  });
}

rattn_status rattn_backward(const rattn_plan* plan, const rattn_bwd_tensors* tensors,
                            void* workspace, size_t workspace_bytes, void* stream) {
  return guarded([&] {
    if (!plan || !tensors) {
      return raggedattn::invalid_value("rattn_backward", "plan and tensors must not be null");
    }
    return raggedattn::backward(plan->plan, *tensors, workspace, workspace_bytes, stream);
  });
}

rattn_status rattn_check_segments(const rattn_plan* plan, const int32_t* cu_seqlens_q,
                                  const int32_t* cu_seqlens_kv, const int32_t* seq_offsets_q,
                                  const int32_t* seq_offsets_kv, void* stream) {
  return guarded([&] {
    if (!plan) return raggedattn::invalid_value("rattn_check_segments", "plan is null");
    return raggedattn::check_segments(plan->plan, cu_seqlens_q, cu_seqlens_kv, seq_offsets_q,
                                      seq_offsets_kv, stream);
  });
}

}  // extern "C"

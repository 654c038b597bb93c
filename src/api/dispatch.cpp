// The C++ entry points: check the call, then hand it to the path the Plan chose.
#include <vector>

#include "common/status.hpp"
#include "cuda/backend.hpp"
#include "plan/plan_data.hpp"
#include "plan/validate.hpp"
#include "reference/reference.hpp"

namespace raggedattn {

DeviceCaps query_device(int device) {
#ifdef RATTN_WITH_CUDA
  return cuda::query_device(device);
#else
  (void)device;
  return cpu_caps();
#endif
}

namespace {

#ifndef RATTN_WITH_CUDA
Status no_cuda_build(const char* where) {
  return not_supported(where, "the plan chose a CUDA path but this build has no CUDA backend");
}
#endif

// The problem's zero_padding mode, after the path's kernels (the same call for every path; the
// padding rows are disjoint from every row a path writes).
template <class Tensors>
Status zero_padding(const PlanData& d, const Tensors& t, void* stream) {
  if (!d.problem.zero_padding) return Status::Ok();
  if (d.path == Path::Cpu) {
    reference::zero_padding(d, t);
    return Status::Ok();
  }
#ifdef RATTN_WITH_CUDA
  return cuda::zero_padding(d, t, stream);
#else
  (void)stream;
  return no_cuda_build("zero_padding");
#endif
}

// A CUDA path's calls run in the plan's device's context (cuda::bind_thread_context).
Status bind_context(const PlanData& d, const char* where) {
#ifdef RATTN_WITH_CUDA
  if (d.path != Path::Cpu) return cuda::bind_thread_context(d.caps.device, where);
#else
  (void)d;
  (void)where;
#endif
  return Status::Ok();
}

Status run_forward(const PlanData& d, const FwdTensors& t, void* workspace, void* stream) {
  switch (d.path) {
    case Path::Cpu:
      reference::forward(d, t);
      return Status::Ok();
    case Path::CudaPortable:
#ifdef RATTN_WITH_CUDA
      return cuda::portable_forward(d, t, workspace, stream);
#else
      (void)workspace;
      (void)stream;
      return no_cuda_build("forward");
#endif
    case Path::CudaSm90:
#ifdef RATTN_WITH_SM90
      return d.fwd.family == KernelFamily::Wgmma ? cuda::sm90_forward(d, t, workspace, stream)
                                                 : cuda::portable_forward(d, t, workspace, stream);
#else
      break;
#endif
  }
  return not_supported("forward", "path ", path_name(d.path), " is not available in this build");
}

Status run_backward(const PlanData& d, const BwdTensors& t, void* workspace, void* stream) {
  switch (d.path) {
    case Path::Cpu:
      reference::backward(d, t);
      return Status::Ok();
    case Path::CudaPortable:
#ifdef RATTN_WITH_CUDA
      return cuda::portable_backward(d, t, workspace, stream);
#else
      (void)workspace;
      (void)stream;
      return no_cuda_build("backward");
#endif
    case Path::CudaSm90:
#ifdef RATTN_WITH_SM90
      return d.bwd.family == KernelFamily::Wgmma ? cuda::sm90_backward(d, t, workspace, stream)
                                                 : cuda::portable_backward(d, t, workspace, stream);
#else
      break;
#endif
  }
  return not_supported("backward", "path ", path_name(d.path), " is not available in this build");
}

}  // namespace

Status forward(const Plan& plan, const FwdTensors& t, void* workspace, size_t workspace_bytes,
               void* stream) {
  if (!plan.valid()) return invalid_value("forward", "the plan is empty (make_plan failed?)");
  const PlanData& d = plan.data();
  RATTN_RETURN_IF_ERROR(check_fwd_call(d, t, workspace, workspace_bytes));
  RATTN_RETURN_IF_ERROR(bind_context(d, "forward"));
  RATTN_RETURN_IF_ERROR(run_forward(d, t, workspace, stream));
  return zero_padding(d, t, stream);
}

Status backward(const Plan& plan, const BwdTensors& t, void* workspace, size_t workspace_bytes,
                void* stream) {
  if (!plan.valid()) return invalid_value("backward", "the plan is empty (make_plan failed?)");
  const PlanData& d = plan.data();
  RATTN_RETURN_IF_ERROR(check_bwd_call(d, t, workspace, workspace_bytes));
  RATTN_RETURN_IF_ERROR(bind_context(d, "backward"));
  RATTN_RETURN_IF_ERROR(run_backward(d, t, workspace, stream));
  return zero_padding(d, t, stream);
}

Status check_segments(const Plan& plan, const int32_t* cu_q, const int32_t* cu_kv,
                      const int32_t* off_q, const int32_t* off_kv, void* stream) {
  if (!plan.valid()) return invalid_value("check_segments", "the plan is empty");
  const PlanData& d = plan.data();
  const Problem& p = d.problem;
  if (d.path == Path::Cpu) return check_host_segments(p, cu_q, cu_kv, off_q, off_kv);
#ifdef RATTN_WITH_CUDA
  RATTN_RETURN_IF_ERROR(check_segment_presence("check_segments", p, cu_q, cu_kv, off_q, off_kv));
  RATTN_RETURN_IF_ERROR(bind_context(d, "check_segments"));
  const int n = p.batch + 1;
  std::vector<int32_t> hq(n), hk(n), hoq, hok;
  RATTN_RETURN_IF_ERROR(cuda::copy_to_host(cu_q, n, hq.data(), stream));
  RATTN_RETURN_IF_ERROR(cuda::copy_to_host(cu_kv, n, hk.data(), stream));
  if (off_q) {
    hoq.resize(p.batch);
    RATTN_RETURN_IF_ERROR(cuda::copy_to_host(off_q, p.batch, hoq.data(), stream));
  }
  if (off_kv) {
    hok.resize(p.batch);
    RATTN_RETURN_IF_ERROR(cuda::copy_to_host(off_kv, p.batch, hok.data(), stream));
  }
  return check_host_segment_values(p, hq.data(), hk.data(), off_q ? hoq.data() : nullptr,
                                   off_kv ? hok.data() : nullptr);
#else
  (void)stream;
  return no_cuda_build("check_segments");
#endif
}

}  // namespace raggedattn

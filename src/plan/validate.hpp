// Every check of the library, in one place. The bindings and backends re-check nothing.
#pragma once

#include "plan/plan_data.hpp"
#include "raggedattn/raggedattn.hpp"

namespace raggedattn {

// Checks the problem's static description and resolves its defaults (strides, scale) into *out.
Status resolve_problem(const Problem& in, Problem* out);

// Checks segment arrays that are in host memory against a resolved problem.
Status check_host_segments(const Problem& p, const int32_t* cu_q, const int32_t* cu_kv,
                           const int32_t* offsets_q, const int32_t* offsets_kv);

// Checks the pointers and the workspace a call receives.
Status check_fwd_call(const PlanData& plan, const FwdTensors& t, const void* workspace,
                      size_t workspace_bytes);
Status check_bwd_call(const PlanData& plan, const BwdTensors& t, const void* workspace,
                      size_t workspace_bytes);

}  // namespace raggedattn

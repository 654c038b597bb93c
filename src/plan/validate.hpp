// Every check of the library, in one place. The bindings and backends re-check nothing.
#pragma once

#include "plan/plan_data.hpp"
#include "raggedattn/raggedattn.hpp"

namespace raggedattn {

// Checks the problem's static description and resolves its defaults (strides, scale) into *out.
Status resolve_problem(const Problem& in, Problem* out);

// The segment arrays a call must pass, wherever they live: cu_seqlens always, seq_offsets exactly
// when the problem says so.
Status check_segment_presence(const char* where, const Problem& p, const int32_t* cu_q,
                              const int32_t* cu_kv, const int32_t* offsets_q,
                              const int32_t* offsets_kv);

// Checks the values of segment arrays in host memory (monotone, within the tensors, within
// max_seqlen) against a resolved problem, given present arrays.
Status check_host_segment_values(const Problem& p, const int32_t* cu_q, const int32_t* cu_kv,
                                 const int32_t* offsets_q, const int32_t* offsets_kv);

// Both of the above.
Status check_host_segments(const Problem& p, const int32_t* cu_q, const int32_t* cu_kv,
                           const int32_t* offsets_q, const int32_t* offsets_kv);

// Checks the pointers and the workspace a call receives.
Status check_fwd_call(const PlanData& plan, const FwdTensors& t, const void* workspace,
                      size_t workspace_bytes);
Status check_bwd_call(const PlanData& plan, const BwdTensors& t, const void* workspace,
                      size_t workspace_bytes);

}  // namespace raggedattn

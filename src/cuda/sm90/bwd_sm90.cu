// The Hopper backward's entry point (compiled for sm_90a only): the shared launch sequence
// (cuda/bwd_sequence.hpp) with the wgmma main kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "common/status.hpp"
#include "cuda/backend.hpp"
#include "cuda/bwd_sequence.hpp"
#include "cuda/launch_kernel.cuh"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/tensor_map.hpp"

namespace raggedattn {
namespace cuda {
namespace {

template <class T>
cudaError_t launch_typed(const portable::BwdParams& p, const PlanData& d, cudaStream_t s) {
  constexpr CUtensorMapDataType kType = std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                  : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const Problem& pr = d.problem;
  sm90::BwdTmaParams a{};
  a.p = p;
  cudaError_t e = encode_thd_map(&a.q_map, kType, p.q, p.q_layout, pr.num_heads_q, pr.total_q,
                                 pr.head_dim_qk, d.bwd.block_m);
  if (e == cudaSuccess) {
    e = encode_thd_map(&a.do_map, kType, p.d_o, p.do_layout, pr.num_heads_q, pr.total_q,
                       pr.head_dim_v, d.bwd.block_m);
  }
  if (e != cudaSuccess) return e;
  return launch_kernel(sm90::bwd_kernel<T, 128>, d.bwd, pr.num_heads_kv, a, s);
}

cudaError_t launch(const portable::BwdParams& p, const PlanData& d, cudaStream_t s) {
  return d.problem.dtype == RATTN_DTYPE_BF16 ? launch_typed<__nv_bfloat16>(p, d, s)
                                             : launch_typed<__half>(p, d, s);
}

}  // namespace

Status sm90_backward(const PlanData& d, const BwdTensors& t, void* workspace, void* stream) {
  const Problem& pr = d.problem;
  // The Plan never sends other shapes here; the kernel's tile is the Plan's (config.hpp).
  if (!sm90::bwd_supports(pr.head_dim_qk, pr.head_dim_v) || d.bwd.block_m != sm90::kBwd.block_m ||
      d.bwd.block_n != sm90::kBwd.block_n) {
    return not_supported(
        "backward", "the Hopper backward has no kernel for head_dim_qk=", pr.head_dim_qk,
        ", head_dim_v=", pr.head_dim_v, " with tiles ", d.bwd.block_m, "x", d.bwd.block_n);
  }
  return run_backward(d, t, workspace, stream, &launch);
}

}  // namespace cuda
}  // namespace raggedattn

// The zero_padding mode on the GPU: zeros in every output row outside the segments, for both CUDA
// paths, after their kernels (the rows are disjoint from every row a kernel writes). One launch
// per direction: blockIdx.y picks the side (query rows: O and LSE, or dQ; key rows: dK and dV),
// and a CTA takes kPadRows rows of it, one warp per row. A packed side's CTA whose rows all lie in
// [cu[0], cu[batch]) returns after two loads, so a call without padding costs one small launch.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.hpp"
#include "common/status.hpp"
#include "core/segments.hpp"
#include "cuda/backend.hpp"
#include "cuda/common/cuda_status.hpp"

namespace raggedattn {
namespace cuda {
namespace {

constexpr int kPadRows = 32;
constexpr int kPadThreads = 256;

// One [rows, heads, dim] output of 16-bit elements (the CUDA paths' dtypes).
struct PadTensor {
  uint16_t* base;
  TensorLayout layout;
  int heads;
  int dim;
};

struct PadSide {
  const int32_t* cu;
  const int32_t* offsets;  // nullptr: packed
  int64_t rows;
  PadTensor t[2];
  int count;
  float* lse;  // the forward's [lse_heads, rows] LSE, or nullptr
  int lse_heads;
};

struct PadParams {
  PadSide side[2];
  int32_t batch;
};

__global__ void __launch_bounds__(kPadThreads)
    zero_padding_kernel(const __grid_constant__ PadParams p) {
  const PadSide& s = p.side[blockIdx.y];
  const int64_t r0 = int64_t(blockIdx.x) * kPadRows;
  const int64_t r1 = r0 + kPadRows < s.rows ? r0 + kPadRows : s.rows;
  if (r0 >= r1) return;
  if (s.offsets == nullptr && p.batch > 0 && r0 >= s.cu[0] && r1 <= s.cu[p.batch]) return;
  const int lane = int(threadIdx.x) % 32;
  for (int64_t r = r0 + int(threadIdx.x) / 32; r < r1; r += kPadThreads / 32) {
    if (row_in_segment(s.cu, s.offsets, p.batch, r)) continue;
    for (int k = 0; k < s.count; ++k) {
      const PadTensor& t = s.t[k];
      for (int h = 0; h < t.heads; ++h) {
        uint16_t* row = t.base + t.layout.offset(r, h);
        if (reinterpret_cast<uintptr_t>(row) % 16 == 0 && t.dim % 8 == 0) {
          for (int i = lane; i < t.dim / 8; i += 32) {
            reinterpret_cast<uint4*>(row)[i] = make_uint4(0u, 0u, 0u, 0u);
          }
        } else {
          for (int i = lane; i < t.dim; i += 32) row[i] = 0;
        }
      }
    }
    if (s.lse) {
      const RowStatLayout stats{s.rows};
      for (int h = lane; h < s.lse_heads; h += 32) s.lse[stats.offset(h, r)] = 0.f;
    }
  }
}

PadTensor pad_tensor(void* base, const rattn_strides& st, int heads, int dim) {
  return {static_cast<uint16_t*>(base), TensorLayout{st.token, st.head}, heads, dim};
}

Status launch(const PadParams& p, void* stream) {
  const int64_t rows = p.side[0].rows > p.side[1].rows ? p.side[0].rows : p.side[1].rows;
  const int64_t ctas = ceil_div(rows, kPadRows);
  if (ctas == 0) return Status::Ok();
  if (ctas > int64_t(INT32_MAX)) {
    return not_supported("zero_padding", rows, " rows; at most ", int64_t(INT32_MAX) * kPadRows);
  }
  const int sides = p.side[1].count > 0 ? 2 : 1;
  zero_padding_kernel<<<dim3(unsigned(ctas), unsigned(sides)), kPadThreads, 0,
                        static_cast<cudaStream_t>(stream)>>>(p);
  return cuda_status("zero_padding", cudaGetLastError());
}

Status check_dtype(const Problem& p) {
  if (dtype_bytes(p.dtype) == 2) return Status::Ok();
  return not_supported("zero_padding", "dtype ", dtype_name(p.dtype),
                       "; the CUDA paths' outputs are bf16 or fp16");
}

}  // namespace

Status zero_padding(const PlanData& d, const FwdTensors& t, void* stream) {
  const Problem& p = d.problem;
  RATTN_RETURN_IF_ERROR(check_dtype(p));
  PadParams pp{};
  pp.batch = p.batch;
  PadSide& q = pp.side[0];
  q.cu = t.cu_seqlens_q;
  q.offsets = t.seq_offsets_q;
  q.rows = p.total_q;
  q.t[0] = pad_tensor(t.o, p.o, p.num_heads_q, p.head_dim_v);
  q.count = 1;
  q.lse = t.lse;
  q.lse_heads = p.num_heads_q;
  return launch(pp, stream);
}

Status zero_padding(const PlanData& d, const BwdTensors& t, void* stream) {
  const Problem& p = d.problem;
  RATTN_RETURN_IF_ERROR(check_dtype(p));
  PadParams pp{};
  pp.batch = p.batch;
  PadSide& q = pp.side[0];
  q.cu = t.cu_seqlens_q;
  q.offsets = t.seq_offsets_q;
  q.rows = p.total_q;
  q.t[0] = pad_tensor(t.dq, p.dq, p.num_heads_q, p.head_dim_qk);
  q.count = 1;
  PadSide& kv = pp.side[1];
  kv.cu = t.cu_seqlens_kv;
  kv.offsets = t.seq_offsets_kv;
  kv.rows = p.total_kv;
  kv.t[0] = pad_tensor(t.dk, p.dk, p.num_heads_kv, p.head_dim_qk);
  kv.t[1] = pad_tensor(t.dv, p.dv, p.num_heads_kv, p.head_dim_v);
  kv.count = 2;
  return launch(pp, stream);
}

}  // namespace cuda
}  // namespace raggedattn

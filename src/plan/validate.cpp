#include "plan/validate.hpp"

#include <cmath>
#include <cstdint>

#include "common/dtype.hpp"
#include "common/status.hpp"

namespace raggedattn {
namespace {

constexpr const char* kSupportedDims =
    "supported: head_dim_qk = head_dim_v in {64, 96, 128, 192, 256}, or head_dim_qk = 192 with "
    "head_dim_v = 128";

bool supported_dims(int dqk, int dv) {
  if (dqk == 192 && dv == 128) return true;
  if (dqk != dv) return false;
  return dqk == 64 || dqk == 96 || dqk == 128 || dqk == 192 || dqk == 256;
}

// Resolves a zero (contiguous) stride pair and checks it.
Status resolve_strides(const char* name, int64_t rows, int heads, int dim, int elem_bytes,
                       bool written, rattn_strides* s) {
  if (s->token == 0 && s->head == 0) {
    s->head = dim;
    s->token = int64_t(heads) * dim;
  }
  if (s->token <= 0 || s->head <= 0) {
    return invalid_value("make_plan", name, " strides (token=", s->token, ", head=", s->head,
                         ") must be positive elements, or both 0 for contiguous");
  }
  if ((s->token * elem_bytes) % 16 != 0 || (s->head * elem_bytes) % 16 != 0) {
    return invalid_value("make_plan", name, " strides (token=", s->token, ", head=", s->head,
                         " elements of ", elem_bytes,
                         " bytes) must be multiples of 16 bytes; the last dim must be contiguous");
  }
  if (written) {
    // Outputs must not alias themselves: either token-major (heads apart by >= dim, tokens by
    // all heads) or head-major (tokens apart by >= dim, heads by all rows).
    bool token_major =
        (heads == 1 || s->head >= dim) && s->token >= int64_t(heads - 1) * s->head + dim;
    bool head_major = s->token >= dim && (heads == 1 || s->head >= (rows - 1) * s->token + dim);
    if (rows > 0 && !token_major && !head_major) {
      return invalid_value("make_plan", "output ", name, " strides (token=", s->token,
                           ", head=", s->head, ") make rows overlap for ", rows, " rows, ", heads,
                           " heads of dim ", dim, "; outputs need disjoint rows");
    }
  }
  return Status::Ok();
}

}  // namespace

Status resolve_problem(const Problem& in, Problem* out) {
  Problem p = in;
  const char* w = "make_plan";
  if (p.batch < 1) return invalid_value(w, "batch=", p.batch, "; need at least one segment");
  if (p.total_q < 0 || p.total_kv < 0) {
    return invalid_value(w, "total_q=", p.total_q, ", total_kv=", p.total_kv,
                         "; token counts cannot be negative");
  }
  if (p.max_seqlen_q < 0 || p.max_seqlen_kv < 0) {
    return invalid_value(w, "max_seqlen_q=", p.max_seqlen_q, ", max_seqlen_kv=", p.max_seqlen_kv,
                         "; need >= 0");
  }
  if (p.max_seqlen_q > p.total_q || p.max_seqlen_kv > p.total_kv) {
    return invalid_value(w, "max_seqlen_q=", p.max_seqlen_q, " (total_q=", p.total_q,
                         "), max_seqlen_kv=", p.max_seqlen_kv, " (total_kv=", p.total_kv,
                         "); a segment cannot be longer than its tensor");
  }
  if (p.num_heads_q < 1 || p.num_heads_kv < 1 || p.num_heads_q % p.num_heads_kv != 0) {
    return invalid_value(w, "num_heads_q=", p.num_heads_q, ", num_heads_kv=", p.num_heads_kv,
                         "; need both >= 1 and num_heads_q a multiple of num_heads_kv "
                         "(GQA; num_heads_kv = 1 is MQA)");
  }
  if (!supported_dims(p.head_dim_qk, p.head_dim_v)) {
    return not_supported(w, "head_dim_qk=", p.head_dim_qk, ", head_dim_v=", p.head_dim_v, "; ",
                         kSupportedDims);
  }
  if (p.dtype != RATTN_DTYPE_BF16 && p.dtype != RATTN_DTYPE_FP16 && p.dtype != RATTN_DTYPE_FP32) {
    return invalid_value(w, "dtype=", int(p.dtype), "; supported: bf16, fp16 (and fp32 on cpu)");
  }
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale < 0.f) {
    return invalid_value(w, "softmax_scale=", p.softmax_scale,
                         "; need a finite positive scale, or 0 for 1/sqrt(head_dim_qk)");
  }
  if (p.softmax_scale == 0.f) p.softmax_scale = 1.0f / std::sqrt(float(p.head_dim_qk));
  if (!std::isfinite(p.softcap) || p.softcap < 0.f) {
    return invalid_value(w, "softcap=", p.softcap, "; need 0 (off) or a finite positive cap");
  }
  if (p.mask != RATTN_MASK_NONE && p.mask != RATTN_MASK_CAUSAL) {
    return invalid_value(w, "mask=", int(p.mask), "; supported: none (0), causal (1)");
  }
  if (p.alignment != RATTN_ALIGN_TOP_LEFT && p.alignment != RATTN_ALIGN_BOTTOM_RIGHT) {
    return invalid_value(w, "alignment=", int(p.alignment),
                         "; supported: top_left (0), bottom_right (1)");
  }
  if (p.window_left < -1 || p.window_right < -1) {
    return invalid_value(w, "window=(", p.window_left, ", ", p.window_right,
                         "); each side is -1 (unbounded) or >= 0");
  }
  if (p.mask == RATTN_MASK_CAUSAL && p.window_right > 0) {
    return invalid_value(w, "causal mask with window_right=", p.window_right,
                         "; causal means window_right = 0 (give -1 or 0)");
  }
  if (p.dq_accum != RATTN_DQ_ACCUM_FP32 && p.dq_accum != RATTN_DQ_ACCUM_BF16) {
    return invalid_value(w, "dq_accum=", int(p.dq_accum), "; supported: fp32 (0), bf16 (1)");
  }
  if (p.has_sink != 0 && p.has_sink != 1) {
    return invalid_value(w, "has_sink=", p.has_sink,
                         "; supported: 0 (no sinks), 1 (one per query head)");
  }
  if (p.zero_padding != 0 && p.zero_padding != 1) {
    return invalid_value(w, "zero_padding=", p.zero_padding,
                         "; supported: 0 (padding rows untouched), 1 (padding rows zeroed)");
  }
  if (p.backend < RATTN_BACKEND_AUTO || p.backend > RATTN_BACKEND_CUDA_SM90) {
    return invalid_value(w, "backend=", int(p.backend),
                         "; supported: auto, cpu, cuda, cuda_portable, cuda_sm90");
  }
  const int eb = dtype_bytes(p.dtype);
  const int hq = p.num_heads_q, hk = p.num_heads_kv, dqk = p.head_dim_qk, dv = p.head_dim_v;
  RATTN_RETURN_IF_ERROR(resolve_strides("q", p.total_q, hq, dqk, eb, false, &p.q));
  RATTN_RETURN_IF_ERROR(resolve_strides("k", p.total_kv, hk, dqk, eb, false, &p.k));
  RATTN_RETURN_IF_ERROR(resolve_strides("v", p.total_kv, hk, dv, eb, false, &p.v));
  RATTN_RETURN_IF_ERROR(resolve_strides("o", p.total_q, hq, dv, eb, true, &p.o));
  RATTN_RETURN_IF_ERROR(resolve_strides("d_o", p.total_q, hq, dv, eb, false, &p.d_o));
  RATTN_RETURN_IF_ERROR(resolve_strides("dq", p.total_q, hq, dqk, eb, true, &p.dq));
  RATTN_RETURN_IF_ERROR(resolve_strides("dk", p.total_kv, hk, dqk, eb, true, &p.dk));
  RATTN_RETURN_IF_ERROR(resolve_strides("dv", p.total_kv, hk, dv, eb, true, &p.dv));
  *out = p;
  return Status::Ok();
}

Status check_segment_presence(const char* where, const Problem& p, const int32_t* cu_q,
                              const int32_t* cu_kv, const int32_t* offsets_q,
                              const int32_t* offsets_kv) {
  if (!cu_q || !cu_kv) return invalid_value(where, "cu_seqlens_q and cu_seqlens_kv must be given");
  if (p.has_seq_offsets && (!offsets_q || !offsets_kv)) {
    return invalid_value(where, "has_seq_offsets is set but seq_offsets_q/kv are null");
  }
  if (!p.has_seq_offsets && (offsets_q || offsets_kv)) {
    return invalid_value(where, "seq_offsets_q/kv given but has_seq_offsets is 0");
  }
  return Status::Ok();
}

Status check_host_segments(const Problem& p, const int32_t* cu_q, const int32_t* cu_kv,
                           const int32_t* offsets_q, const int32_t* offsets_kv) {
  RATTN_RETURN_IF_ERROR(check_segment_presence("segments", p, cu_q, cu_kv, offsets_q, offsets_kv));
  return check_host_segment_values(p, cu_q, cu_kv, offsets_q, offsets_kv);
}

Status check_host_segment_values(const Problem& p, const int32_t* cu_q, const int32_t* cu_kv,
                                 const int32_t* offsets_q, const int32_t* offsets_kv) {
  const char* w = "segments";
  struct Side {
    const char* name;
    const int32_t* cu;
    const int32_t* off;
    int64_t total;
    int32_t max_len;
  } sides[2] = {{"q", cu_q, offsets_q, p.total_q, p.max_seqlen_q},
                {"kv", cu_kv, offsets_kv, p.total_kv, p.max_seqlen_kv}};
  for (const Side& s : sides) {
    if (s.cu[0] != 0) {
      return invalid_value(w, "cu_seqlens_", s.name, "[0]=", s.cu[0], "; must be 0");
    }
    int64_t prev_end = 0;
    for (int b = 0; b < p.batch; ++b) {
      int64_t len = int64_t(s.cu[b + 1]) - s.cu[b];
      if (len < 0) {
        return invalid_value(w, "cu_seqlens_", s.name, " decreases at segment ", b, " (", s.cu[b],
                             " -> ", s.cu[b + 1], "); must be non-decreasing");
      }
      if (len > s.max_len) {
        return invalid_value(w, "segment ", b, " has ", s.name, " length ", len, " > max_seqlen_",
                             s.name, "=", s.max_len);
      }
      if (s.off) {
        if (s.off[b] < prev_end) {
          return invalid_value(w, "seq_offsets_", s.name, "[", b, "]=", s.off[b],
                               " overlaps the previous segment (which ends at row ", prev_end,
                               "); offsets must be increasing and segments disjoint");
        }
        prev_end = int64_t(s.off[b]) + len;
        if (prev_end > s.total) {
          return invalid_value(w, "segment ", b, " (", s.name, " rows ", s.off[b], "..", prev_end,
                               ") runs past total_", s.name, "=", s.total);
        }
      }
    }
    if (s.cu[p.batch] > s.total) {
      return invalid_value(w, "cu_seqlens_", s.name, "[", p.batch, "]=", s.cu[p.batch], " > total_",
                           s.name, "=", s.total, " rows of the tensor");
    }
  }
  return Status::Ok();
}

namespace {

bool aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}
bool aligned16(const void* p) {
  return aligned(p, 16);
}

// Tensors are read and written 16 bytes at a time; LSE (fp32 rows) one element at a time, so a
// view into a larger LSE buffer needs only fp32 alignment.
Status check_pointer(const char* where, const char* name, const void* ptr, bool needed,
                     uintptr_t alignment = 16) {
  if (!needed) return Status::Ok();
  if (!ptr) return invalid_value(where, name, " is null");
  if (!aligned(ptr, alignment)) {
    return invalid_value(where, name, "=", ptr, " is not ", alignment, "-byte aligned");
  }
  return Status::Ok();
}

Status check_segment_pointers(const char* where, const PlanData& plan, const int32_t* cu_q,
                              const int32_t* cu_kv, const int32_t* off_q, const int32_t* off_kv) {
  RATTN_RETURN_IF_ERROR(check_segment_presence(where, plan.problem, cu_q, cu_kv, off_q, off_kv));
  if (plan.path == Path::Cpu) {
    return check_host_segment_values(plan.problem, cu_q, cu_kv, off_q, off_kv);
  }
  return Status::Ok();
}

// The sink tensors: present exactly where the problem has sinks (a sink given to a problem
// without them would be silently ignored otherwise).
Status check_sink_pointer(const char* where, const PlanData& plan, const char* name,
                          const void* ptr) {
  if (plan.problem.has_sink) return check_pointer(where, name, ptr, true, sizeof(float));
  if (ptr) {
    return invalid_value(where, name,
                         " is given but the problem has no sinks (has_sink=0); set "
                         "has_sink=1 in the problem, or pass NULL");
  }
  return Status::Ok();
}

Status check_workspace(const char* where, size_t need, const void* ws, size_t bytes) {
  if (bytes < need) {
    return workspace_error(where, "workspace of ", bytes, " bytes given; the plan needs ", need);
  }
  if (need > 0 && !ws)
    return workspace_error(where, "workspace is null; the plan needs ", need, " bytes");
  if (need > 0 && !aligned16(ws)) {
    return workspace_error(where, "workspace=", ws, " is not 16-byte aligned");
  }
  return Status::Ok();
}

}  // namespace

Status check_fwd_call(const PlanData& plan, const FwdTensors& t, const void* workspace,
                      size_t workspace_bytes) {
  const char* w = "forward";
  bool rows_q = plan.problem.total_q > 0, rows_kv = plan.problem.total_kv > 0;
  RATTN_RETURN_IF_ERROR(check_pointer(w, "q", t.q, rows_q));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "k", t.k, rows_kv));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "v", t.v, rows_kv));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "o", t.o, rows_q));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "lse", t.lse, rows_q, sizeof(float)));
  RATTN_RETURN_IF_ERROR(check_sink_pointer(w, plan, "sink", t.sink));
  RATTN_RETURN_IF_ERROR(check_segment_pointers(w, plan, t.cu_seqlens_q, t.cu_seqlens_kv,
                                               t.seq_offsets_q, t.seq_offsets_kv));
  return check_workspace(w, plan.fwd_ws.total, workspace, workspace_bytes);
}

Status check_bwd_call(const PlanData& plan, const BwdTensors& t, const void* workspace,
                      size_t workspace_bytes) {
  const char* w = "backward";
  bool rows_q = plan.problem.total_q > 0, rows_kv = plan.problem.total_kv > 0;
  RATTN_RETURN_IF_ERROR(check_pointer(w, "q", t.q, rows_q));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "k", t.k, rows_kv));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "v", t.v, rows_kv));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "o", t.o, rows_q));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "d_o", t.d_o, rows_q));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "lse", t.lse, rows_q, sizeof(float)));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "dq", t.dq, rows_q));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "dk", t.dk, rows_kv));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "dv", t.dv, rows_kv));
  RATTN_RETURN_IF_ERROR(check_sink_pointer(w, plan, "sink", t.sink));
  RATTN_RETURN_IF_ERROR(check_sink_pointer(w, plan, "d_sink", t.d_sink));
  RATTN_RETURN_IF_ERROR(check_pointer(w, "d_lse", t.d_lse, t.d_lse != nullptr, sizeof(float)));
  RATTN_RETURN_IF_ERROR(check_segment_pointers(w, plan, t.cu_seqlens_q, t.cu_seqlens_kv,
                                               t.seq_offsets_q, t.seq_offsets_kv));
  return check_workspace(w, plan.bwd_ws.total, workspace, workspace_bytes);
}

}  // namespace raggedattn

/* raggedattn — fused attention over packed variable-length sequences (THD layout).
 *
 * C API. Every function returns a rattn_status; on failure rattn_last_error() returns a
 * message (thread-local) that says what was given, what is supported and where.
 *
 * Flow: fill a rattn_problem (rattn_problem_init gives the defaults), create a plan once per
 * shape, ask it for the workspace size, then call rattn_forward / rattn_backward as often as
 * needed. Forward and backward never allocate, synchronize or read device memory on the host,
 * so they can be captured in a CUDA graph.
 */
#ifndef RAGGEDATTN_RAGGEDATTN_H_
#define RAGGEDATTN_RAGGEDATTN_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define RATTN_API __declspec(dllexport)
#else
#define RATTN_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define RATTN_VERSION_MAJOR 0
#define RATTN_VERSION_MINOR 1
#define RATTN_VERSION_PATCH 0

typedef enum rattn_status {
  RATTN_SUCCESS = 0,
  RATTN_ERROR_INVALID_VALUE = 1, /* a value is out of range or inconsistent */
  RATTN_ERROR_NOT_SUPPORTED = 2, /* valid, but no path of this build supports it */
  RATTN_ERROR_WORKSPACE = 3,     /* workspace missing or smaller than the plan needs */
  RATTN_ERROR_CUDA = 4,          /* a CUDA runtime call failed */
  RATTN_ERROR_INTERNAL = 5
} rattn_status;

typedef enum rattn_dtype {
  RATTN_DTYPE_BF16 = 0,
  RATTN_DTYPE_FP16 = 1,
  RATTN_DTYPE_FP32 = 2 /* CPU backend only */
} rattn_dtype;

typedef enum rattn_mask { RATTN_MASK_NONE = 0, RATTN_MASK_CAUSAL = 1 } rattn_mask;

/* Which diagonal the causal mask and the sliding window are measured from.
 * top-left: query i sees key j <= i. bottom-right: query i sees key j <= i + (len_kv - len_q). */
typedef enum rattn_alignment {
  RATTN_ALIGN_TOP_LEFT = 0,
  RATTN_ALIGN_BOTTOM_RIGHT = 1
} rattn_alignment;

typedef enum rattn_dq_accum {
  RATTN_DQ_ACCUM_FP32 = 0, /* fp32 scratch, one slot per segment */
  RATTN_DQ_ACCUM_BF16 = 1  /* 16-bit scratch in the input's 16-bit format (bf16 or fp16): half
                              the traffic, lower precision */
} rattn_dq_accum;

typedef enum rattn_backend {
  RATTN_BACKEND_AUTO = 0, /* the fastest path present: CUDA if a device is there, else CPU */
  RATTN_BACKEND_CPU = 1,  /* reference backend; tensors in host memory */
  RATTN_BACKEND_CUDA = 2, /* the fastest CUDA path that supports the problem */
  RATTN_BACKEND_CUDA_PORTABLE = 3, /* force the sm80+ path */
  RATTN_BACKEND_CUDA_SM90 = 4      /* force the Hopper path (error where it does not apply) */
} rattn_backend;

/* Element strides of a [tokens, heads, dim] tensor; dim is contiguous.
 * A stride of 0 means "contiguous": token = heads * dim, head = dim. */
typedef struct rattn_strides {
  int64_t token;
  int64_t head;
} rattn_strides;

typedef struct rattn_problem {
  /* segments */
  int32_t batch;           /* number of segments B (>= 1); cu_seqlens have B + 1 entries */
  int64_t total_q;         /* rows of Q, O, dQ, dO (and columns of LSE) */
  int64_t total_kv;        /* rows of K, V, dK, dV */
  int32_t max_seqlen_q;    /* upper bound of every segment's query length */
  int32_t max_seqlen_kv;   /* upper bound of every segment's key length */
  int32_t has_seq_offsets; /* padded THD: seq_offsets_q/kv give each segment's first row */
  /* Rows outside every segment (padding, rows past the last segment) are never read into a
   * result: they may hold anything, NaN included. They are written only with zero_padding. */
  /* shapes */
  int32_t num_heads_q;
  int32_t num_heads_kv; /* divides num_heads_q; 1 is MQA */
  int32_t head_dim_qk;
  int32_t head_dim_v;
  rattn_dtype dtype;
  rattn_strides q, k, v, o, d_o, dq, dk, dv;
  /* math */
  float softmax_scale; /* 0: 1 / sqrt(head_dim_qk); negative or non-finite: an error */
  float softcap;       /* 0: off; else scores = softcap * tanh(scale * q.k / softcap) */
  rattn_mask mask;
  rattn_alignment alignment;
  int32_t window_left;  /* -1: unbounded; else key j >= diag(i) - window_left */
  int32_t window_right; /* -1: unbounded; else key j <= diag(i) + window_right (0 with causal) */
  /* Learnable attention sinks. 1: query head h has a logit sink[h] (fp32, in the scores' units,
   * i.e. after softmax_scale and softcap) that joins every one of its rows' softmax as one extra
   * column with no value:
   *   p_ij = exp(s_ij - m) / (exp(sink[h] - m) + sum_j exp(s_ij - m)),  o_i = sum_j p_ij v_j,
   * and LSE = log(exp(sink[h]) + sum_j exp(s_ij)), so a row that sees no key has O = 0 and
   * LSE = sink[h]. The tensors then give `sink`, and the backward writes `d_sink`. One sink per
   * query head, shared by every segment. */
  int32_t has_sink;
  /* backward */
  rattn_dq_accum dq_accum;
  int32_t deterministic; /* dQ, dK, dV bitwise identical from run to run */
  /* where it runs */
  rattn_backend backend;
  /* outputs' padding rows: 0 leaves the rows outside every segment of O, LSE (its columns), dQ,
   * dK and dV untouched; 1 writes zeros there, so that outputs may be allocated uninitialized
   * (the Python bindings' mode). Rows inside segments are the same either way. */
  int32_t zero_padding;
} rattn_problem;

typedef struct rattn_device_caps {
  int32_t cuda; /* 0: no usable CUDA device (CPU only) */
  int32_t device;
  int32_t cc_major, cc_minor;
  int32_t num_sms;
  int64_t smem_per_block_optin; /* bytes */
  int64_t l2_bytes;
} rattn_device_caps;

typedef struct rattn_fwd_tensors {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse; /* [num_heads_q, total_q], natural log; -inf for rows that see no key */
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_kv;
  const int32_t* seq_offsets_q;  /* NULL unless has_seq_offsets */
  const int32_t* seq_offsets_kv; /* NULL unless has_seq_offsets */
  const float* sink;             /* [num_heads_q] with has_sink, else NULL */
} rattn_fwd_tensors;

typedef struct rattn_bwd_tensors {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* d_o;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_kv;
  const int32_t* seq_offsets_q;
  const int32_t* seq_offsets_kv;
  const float* sink; /* [num_heads_q] with has_sink (the forward's), else NULL */
  /* [num_heads_q] with has_sink, else NULL: d loss / d sink[h], summed over every row of the head
   * in every segment; overwritten (computed in a fixed order: deterministic in every mode). */
  float* d_sink;
  /* NULL, or the LSE's cotangent, laid out as lse ([num_heads_q, total_q]; columns outside every
   * segment are not read): it flows into dQ and dK (d lse_i / d s_ij = p_ij) and into d_sink.
   * NULL is the same as zeros. */
  const float* d_lse;
} rattn_bwd_tensors;

typedef struct rattn_plan rattn_plan;

typedef enum rattn_direction { RATTN_FORWARD = 0, RATTN_BACKWARD = 1 } rattn_direction;

typedef enum rattn_path {
  RATTN_PATH_NONE = 0, /* no plan (rattn_plan_path(NULL)) */
  RATTN_PATH_CPU = 1,
  RATTN_PATH_CUDA_PORTABLE = 3,
  RATTN_PATH_CUDA_SM90 = 4
} rattn_path;

RATTN_API const char* rattn_version(void);
/* 1 where this build of the library has CUDA backends, 0 for a CPU-only build. */
RATTN_API int rattn_built_with_cuda(void);
RATTN_API const char* rattn_last_error(void);
RATTN_API const char* rattn_status_name(rattn_status);
/* "cpu", "cuda_portable", "cuda_sm90" (the names the backends are requested by), "none". */
RATTN_API const char* rattn_path_name(rattn_path);

/* Defaults: bf16, mask none, top-left, no window, no softcap, fp32 dQ accumulation, contiguous
 * strides, backend auto. Shapes and segment counts are zero and must be set. */
RATTN_API void rattn_problem_init(rattn_problem* problem);

/* Capabilities of CUDA device `device` (-1: the current one); caps->cuda == 0 where there is
 * no device or the library was built without CUDA. */
RATTN_API rattn_status rattn_query_device(int device, rattn_device_caps* caps);

/* caps == NULL: query the current device. */
RATTN_API rattn_status rattn_plan_create(const rattn_problem* problem,
                                         const rattn_device_caps* caps, rattn_plan** plan);
RATTN_API void rattn_plan_destroy(rattn_plan* plan);
RATTN_API rattn_status rattn_plan_workspace_size(const rattn_plan* plan, rattn_direction dir,
                                                 size_t* bytes);
/* The path the plan chose; RATTN_PATH_NONE for a null plan. */
RATTN_API rattn_path rattn_plan_path(const rattn_plan* plan);
/* A one-line description of the chosen path and tiles; written NUL-terminated, truncated to size.
 */
RATTN_API rattn_status rattn_plan_describe(const rattn_plan* plan, char* buffer, size_t size);

/* stream: a cudaStream_t (NULL: the default stream); ignored by the CPU backend. */
RATTN_API rattn_status rattn_forward(const rattn_plan* plan, const rattn_fwd_tensors* tensors,
                                     void* workspace, size_t workspace_bytes, void* stream);
RATTN_API rattn_status rattn_backward(const rattn_plan* plan, const rattn_bwd_tensors* tensors,
                                      void* workspace, size_t workspace_bytes, void* stream);

/* Debug check, opt-in: copies the segment arrays to the host (synchronizing `stream`) and
 * validates them against the plan (monotone, within the tensors, within max_seqlen). */
RATTN_API rattn_status rattn_check_segments(const rattn_plan* plan, const int32_t* cu_seqlens_q,
                                            const int32_t* cu_seqlens_kv,
                                            const int32_t* seq_offsets_q,
                                            const int32_t* seq_offsets_kv, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* RAGGEDATTN_RAGGEDATTN_H_ */

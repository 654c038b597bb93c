// The XLA FFI handlers of the JAX binding: raggedattn_fwd and raggedattn_bwd, each registered for
// the CPU (the reference backend) and for CUDA. raggedattn/jax.py calls them through
// jax.ffi.ffi_call with the options as attributes; the workspace is one more result buffer, sized
// at trace time from the same cached plan (plan_cache.hpp) the handler runs here.
//
// Outputs arrive uninitialized: the problem's zero_padding mode writes zeros in the rows that
// belong to no segment (padding), as with the PyTorch binding.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <memory>
#include <string>

#include "plan_cache.hpp"
#include "raggedattn/raggedattn.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace raggedattn_py {

// The attributes both directions take; raggedattn/jax.py writes them (_ffi_attributes).
struct AttnAttrs {
  int64_t max_seqlen_q;
  int64_t max_seqlen_kv;
  bool has_seq_offsets;
  bool causal;
  bool bottom_right;
  int64_t window_left;
  int64_t window_right;
  float softmax_scale;
  float softcap;
  bool dq_accum_bf16;
  bool deterministic;
  bool has_sink;   // the sink (and, in the backward, d_sink) buffers hold [num_heads_q] floats
  bool has_d_lse;  // the backward's d_lse buffer holds the LSE's cotangent
};

}  // namespace raggedattn_py

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    raggedattn_py::AttnAttrs, StructMember<int64_t>("max_seqlen_q"),
    StructMember<int64_t>("max_seqlen_kv"), StructMember<bool>("has_seq_offsets"),
    StructMember<bool>("causal"), StructMember<bool>("bottom_right"),
    StructMember<int64_t>("window_left"), StructMember<int64_t>("window_right"),
    StructMember<float>("softmax_scale"), StructMember<float>("softcap"),
    StructMember<bool>("dq_accum_bf16"), StructMember<bool>("deterministic"),
    StructMember<bool>("has_sink"), StructMember<bool>("has_d_lse"));

namespace raggedattn_py {
namespace {

// The shape checks are the Python side's (at trace time); these guard the handler against a
// call that did not come through it.
ffi::Error expect_rank(const char* name, const ffi::AnyBuffer& b, size_t rank) {
  if (b.dimensions().size() == rank) return ffi::Error::Success();
  return ffi::Error::InvalidArgument(std::string("raggedattn (XLA FFI): ") + name + " has rank " +
                                     std::to_string(b.dimensions().size()) + ", expected " +
                                     std::to_string(rank));
}

// A float32 buffer of `count` elements where the attributes say it is present.
ffi::Error expect_floats(const char* name, const ffi::AnyBuffer& b, int64_t count) {
  if (b.element_type() == ffi::DataType::F32 && int64_t(b.element_count()) == count) {
    return ffi::Error::Success();
  }
  return ffi::Error::InvalidArgument(
      std::string("raggedattn (XLA FFI): ") + name + " has " + std::to_string(b.element_count()) +
      " elements (or is not float32); expected " + std::to_string(count) + " float32");
}

ffi::Error to_ffi_error(const Status& s) {
  switch (s.code) {
    case RATTN_SUCCESS:
      return ffi::Error::Success();
    case RATTN_ERROR_INVALID_VALUE:
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, s.message);
    case RATTN_ERROR_NOT_SUPPORTED:
      return ffi::Error(ffi::ErrorCode::kUnimplemented, s.message);
    default:
      return ffi::Error(ffi::ErrorCode::kInternal, s.message);
  }
}

// The problem of one call, from the buffers' shapes and the attributes (contiguous tensors).
ffi::Error make_problem(rattn_backend backend, const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                        const ffi::AnyBuffer& v, const ffi::AnyBuffer& cu_q, const AttnAttrs& a,
                        rattn_problem* p) {
  for (auto [name, buffer] :
       {std::pair<const char*, const ffi::AnyBuffer*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    if (ffi::Error e = expect_rank(name, *buffer, 3); e.failure()) return e;
  }
  if (ffi::Error e = expect_rank("cu_seqlens_q", cu_q, 1); e.failure()) return e;
  rattn_problem_init(p);
  switch (q.element_type()) {
    case ffi::DataType::BF16:
      p->dtype = RATTN_DTYPE_BF16;
      break;
    case ffi::DataType::F16:
      p->dtype = RATTN_DTYPE_FP16;
      break;
    case ffi::DataType::F32:
      p->dtype = RATTN_DTYPE_FP32;
      break;
    default:
      return ffi::Error::InvalidArgument(
          "raggedattn (XLA FFI): q has an unsupported element type; supported: bfloat16, "
          "float16, float32 (cpu)");
  }
  p->batch = int32_t(cu_q.dimensions()[0] - 1);
  p->total_q = q.dimensions()[0];
  p->total_kv = k.dimensions()[0];
  p->num_heads_q = int32_t(q.dimensions()[1]);
  p->num_heads_kv = int32_t(k.dimensions()[1]);
  p->head_dim_qk = int32_t(q.dimensions()[2]);
  p->head_dim_v = int32_t(v.dimensions()[2]);
  p->max_seqlen_q = int32_t(a.max_seqlen_q);
  p->max_seqlen_kv = int32_t(a.max_seqlen_kv);
  p->has_seq_offsets = a.has_seq_offsets ? 1 : 0;
  p->mask = a.causal ? RATTN_MASK_CAUSAL : RATTN_MASK_NONE;
  p->alignment = a.bottom_right ? RATTN_ALIGN_BOTTOM_RIGHT : RATTN_ALIGN_TOP_LEFT;
  p->window_left = int32_t(a.window_left);
  p->window_right = int32_t(a.window_right);
  p->softmax_scale = a.softmax_scale;
  p->softcap = a.softcap;
  p->dq_accum = a.dq_accum_bf16 ? RATTN_DQ_ACCUM_BF16 : RATTN_DQ_ACCUM_FP32;
  p->deterministic = a.deterministic ? 1 : 0;
  p->has_sink = a.has_sink ? 1 : 0;
  p->backend = backend;
  p->zero_padding = 1;  // jax.py's _plan sets it too: the same cached plan
  return ffi::Error::Success();
}

template <class T>
T* data(const ffi::AnyBuffer& b) {
  return static_cast<T*>(b.untyped_data());
}

ffi::Error forward(rattn_backend backend, int device, void* stream, ffi::AnyBuffer q,
                   ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer cu_q, ffi::AnyBuffer cu_kv,
                   ffi::AnyBuffer off_q, ffi::AnyBuffer off_kv, ffi::AnyBuffer sink,
                   ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse,
                   ffi::Result<ffi::AnyBuffer> workspace, AttnAttrs attrs) {
  rattn_problem problem;
  if (ffi::Error e = make_problem(backend, q, k, v, cu_q, attrs, &problem); e.failure()) return e;
  if (attrs.has_sink) {
    if (ffi::Error e = expect_floats("sink", sink, problem.num_heads_q); e.failure()) return e;
  }
  std::shared_ptr<const Plan> plan;
  if (Status s = get_plan(problem, device, &plan); !s.ok()) return to_ffi_error(s);
  rattn_fwd_tensors t{};
  t.q = q.untyped_data();
  t.k = k.untyped_data();
  t.v = v.untyped_data();
  t.o = o->untyped_data();
  t.lse = data<float>(*lse);
  t.cu_seqlens_q = data<const int32_t>(cu_q);
  t.cu_seqlens_kv = data<const int32_t>(cu_kv);
  if (attrs.has_seq_offsets) {
    t.seq_offsets_q = data<const int32_t>(off_q);
    t.seq_offsets_kv = data<const int32_t>(off_kv);
  }
  if (attrs.has_sink) t.sink = data<const float>(sink);
  return to_ffi_error(plan->forward(t, workspace->untyped_data(), workspace->size_bytes(), stream));
}

ffi::Error backward(rattn_backend backend, int device, void* stream, ffi::AnyBuffer q,
                    ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o, ffi::AnyBuffer lse,
                    ffi::AnyBuffer d_o, ffi::AnyBuffer cu_q, ffi::AnyBuffer cu_kv,
                    ffi::AnyBuffer off_q, ffi::AnyBuffer off_kv, ffi::AnyBuffer sink,
                    ffi::AnyBuffer d_lse, ffi::Result<ffi::AnyBuffer> dq,
                    ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                    ffi::Result<ffi::AnyBuffer> d_sink, ffi::Result<ffi::AnyBuffer> workspace,
                    AttnAttrs attrs) {
  rattn_problem problem;
  if (ffi::Error e = make_problem(backend, q, k, v, cu_q, attrs, &problem); e.failure()) return e;
  if (attrs.has_sink) {
    if (ffi::Error e = expect_floats("sink", sink, problem.num_heads_q); e.failure()) return e;
    if (ffi::Error e = expect_floats("d_sink", *d_sink, problem.num_heads_q); e.failure()) {
      return e;
    }
  }
  if (attrs.has_d_lse) {
    if (ffi::Error e = expect_floats("d_lse", d_lse, problem.num_heads_q * problem.total_q);
        e.failure()) {
      return e;
    }
  }
  std::shared_ptr<const Plan> plan;
  if (Status s = get_plan(problem, device, &plan); !s.ok()) return to_ffi_error(s);
  rattn_bwd_tensors t{};
  t.q = q.untyped_data();
  t.k = k.untyped_data();
  t.v = v.untyped_data();
  t.o = o.untyped_data();
  t.d_o = d_o.untyped_data();
  t.lse = data<const float>(lse);
  t.dq = dq->untyped_data();
  t.dk = dk->untyped_data();
  t.dv = dv->untyped_data();
  t.cu_seqlens_q = data<const int32_t>(cu_q);
  t.cu_seqlens_kv = data<const int32_t>(cu_kv);
  if (attrs.has_seq_offsets) {
    t.seq_offsets_q = data<const int32_t>(off_q);
    t.seq_offsets_kv = data<const int32_t>(off_kv);
  }
  if (attrs.has_sink) {
    t.sink = data<const float>(sink);
    t.d_sink = data<float>(*d_sink);
  }
  if (attrs.has_d_lse) t.d_lse = data<const float>(d_lse);
  return to_ffi_error(
      plan->backward(t, workspace->untyped_data(), workspace->size_bytes(), stream));
}

// Argument lists.
template <class B>
auto fwd_args(B binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // q
      .template Arg<ffi::AnyBuffer>()  // k
      .template Arg<ffi::AnyBuffer>()  // v
      .template Arg<ffi::AnyBuffer>()  // cu_seqlens_q
      .template Arg<ffi::AnyBuffer>()  // cu_seqlens_kv
      .template Arg<ffi::AnyBuffer>()  // seq_offsets_q (ignored unless has_seq_offsets)
      .template Arg<ffi::AnyBuffer>()  // seq_offsets_kv
      .template Arg<ffi::AnyBuffer>()  // sink (ignored unless has_sink)
      .template Ret<ffi::AnyBuffer>()  // o
      .template Ret<ffi::AnyBuffer>()  // lse
      .template Ret<ffi::AnyBuffer>()  // workspace (uint8)
      .template Attrs<AttnAttrs>();
}

template <class B>
auto bwd_args(B binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // q
      .template Arg<ffi::AnyBuffer>()  // k
      .template Arg<ffi::AnyBuffer>()  // v
      .template Arg<ffi::AnyBuffer>()  // o
      .template Arg<ffi::AnyBuffer>()  // lse
      .template Arg<ffi::AnyBuffer>()  // d_o
      .template Arg<ffi::AnyBuffer>()  // cu_seqlens_q
      .template Arg<ffi::AnyBuffer>()  // cu_seqlens_kv
      .template Arg<ffi::AnyBuffer>()  // seq_offsets_q
      .template Arg<ffi::AnyBuffer>()  // seq_offsets_kv
      .template Arg<ffi::AnyBuffer>()  // sink (ignored unless has_sink)
      .template Arg<ffi::AnyBuffer>()  // d_lse (ignored unless has_d_lse)
      .template Ret<ffi::AnyBuffer>()  // dq
      .template Ret<ffi::AnyBuffer>()  // dk
      .template Ret<ffi::AnyBuffer>()  // dv
      .template Ret<ffi::AnyBuffer>()  // d_sink (unwritten unless has_sink)
      .template Ret<ffi::AnyBuffer>()  // workspace (uint8)
      .template Attrs<AttnAttrs>();
}

using Buf = ffi::AnyBuffer;
using Out = ffi::Result<ffi::AnyBuffer>;

XLA_FFI_DEFINE_HANDLER(
    kFwdCpu,
    [](Buf q, Buf k, Buf v, Buf cu_q, Buf cu_kv, Buf off_q, Buf off_kv, Buf sink, Out o, Out lse,
       Out ws, AttnAttrs a) {
      return forward(RATTN_BACKEND_CPU, -1, nullptr, q, k, v, cu_q, cu_kv, off_q, off_kv, sink, o,
                     lse, ws, a);
    },
    fwd_args(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER(
    kFwdCuda,
    [](void* stream, int32_t device, Buf q, Buf k, Buf v, Buf cu_q, Buf cu_kv, Buf off_q,
       Buf off_kv, Buf sink, Out o, Out lse, Out ws, AttnAttrs a) {
      return forward(RATTN_BACKEND_CUDA, device, stream, q, k, v, cu_q, cu_kv, off_q, off_kv, sink,
                     o, lse, ws, a);
    },
    fwd_args(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Ctx<ffi::DeviceOrdinal>()),
    {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER(
    kBwdCpu,
    [](Buf q, Buf k, Buf v, Buf o, Buf lse, Buf d_o, Buf cu_q, Buf cu_kv, Buf off_q, Buf off_kv,
       Buf sink, Buf d_lse, Out dq, Out dk, Out dv, Out d_sink, Out ws, AttnAttrs a) {
      return backward(RATTN_BACKEND_CPU, -1, nullptr, q, k, v, o, lse, d_o, cu_q, cu_kv, off_q,
                      off_kv, sink, d_lse, dq, dk, dv, d_sink, ws, a);
    },
    bwd_args(ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER(
    kBwdCuda,
    [](void* stream, int32_t device, Buf q, Buf k, Buf v, Buf o, Buf lse, Buf d_o, Buf cu_q,
       Buf cu_kv, Buf off_q, Buf off_kv, Buf sink, Buf d_lse, Out dq, Out dk, Out dv, Out d_sink,
       Out ws, AttnAttrs a) {
      return backward(RATTN_BACKEND_CUDA, device, stream, q, k, v, o, lse, d_o, cu_q, cu_kv, off_q,
                      off_kv, sink, d_lse, dq, dk, dv, d_sink, ws, a);
    },
    bwd_args(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>().Ctx<ffi::DeviceOrdinal>()),
    {ffi::Traits::kCmdBufferCompatible});

nb::capsule capsule(XLA_FFI_Handler* handler) {
  return nb::capsule(reinterpret_cast<void*>(handler));
}

}  // namespace

nb::dict xla_ffi_targets() {
  nb::dict fwd, bwd, targets;
  fwd["cpu"] = capsule(kFwdCpu);
  fwd["CUDA"] = capsule(kFwdCuda);
  bwd["cpu"] = capsule(kBwdCpu);
  bwd["CUDA"] = capsule(kBwdCuda);
  targets["raggedattn_fwd"] = fwd;
  targets["raggedattn_bwd"] = bwd;
  return targets;
}

}  // namespace raggedattn_py

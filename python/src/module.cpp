// raggedattn._C: the C API as the Python package sees it. Tensors cross as addresses (Python
// ints) so the extension depends on no framework: raggedattn/torch.py passes data_ptr()s and the
// current CUDA stream; the JAX binding goes through the XLA FFI handlers of xla_ffi.cpp instead.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>

#include "plan_cache.hpp"
#include "raggedattn/raggedattn.h"

namespace nb = nanobind;
using raggedattn_py::Status;

#ifdef RATTN_WITH_XLA_FFI
namespace raggedattn_py {
nb::dict xla_ffi_targets();  // xla_ffi.cpp
}
#endif

namespace {

// A handle on a cached plan.
struct PyPlan {
  std::shared_ptr<const raggedattn_py::Plan> plan;
};

template <class T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// A failed library call as the Python exception the caller sees: ValueError for a problem the
// library rejects, RuntimeError for a failure while running. Sets the error and returns the null
// object that makes nanobind raise it; no C++ exception is thrown (see plan_cache.hpp).
nb::object raise(const Status& s) {
  PyErr_SetString(s.bad_input() ? PyExc_ValueError : PyExc_RuntimeError, s.message.c_str());
  return nb::object();
}

using Strides = std::tuple<int64_t, int64_t>;

// (token, head) element strides of one tensor of the problem, as a Python property.
template <rattn_strides rattn_problem::*member>
void def_strides(nb::class_<rattn_problem>& cls, const char* name) {
  cls.def_prop_rw(
      name, [](const rattn_problem& p) { return Strides((p.*member).token, (p.*member).head); },
      [](rattn_problem& p, Strides s) {
        p.*member = rattn_strides{std::get<0>(s), std::get<1>(s)};
      });
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "raggedattn's C API for the Python package (internal; use raggedattn.torch / .jax)";

  m.attr("DTYPE_BF16") = int(RATTN_DTYPE_BF16);
  m.attr("DTYPE_FP16") = int(RATTN_DTYPE_FP16);
  m.attr("DTYPE_FP32") = int(RATTN_DTYPE_FP32);
  m.attr("MASK_NONE") = int(RATTN_MASK_NONE);
  m.attr("MASK_CAUSAL") = int(RATTN_MASK_CAUSAL);
  m.attr("ALIGN_TOP_LEFT") = int(RATTN_ALIGN_TOP_LEFT);
  m.attr("ALIGN_BOTTOM_RIGHT") = int(RATTN_ALIGN_BOTTOM_RIGHT);
  m.attr("DQ_ACCUM_FP32") = int(RATTN_DQ_ACCUM_FP32);
  m.attr("DQ_ACCUM_BF16") = int(RATTN_DQ_ACCUM_BF16);
  m.attr("BACKEND_AUTO") = int(RATTN_BACKEND_AUTO);
  m.attr("BACKEND_CPU") = int(RATTN_BACKEND_CPU);
  m.attr("BACKEND_CUDA") = int(RATTN_BACKEND_CUDA);
  m.attr("FORWARD") = int(RATTN_FORWARD);
  m.attr("BACKWARD") = int(RATTN_BACKWARD);

  nb::class_<rattn_problem> problem(m, "Problem",
                                    "rattn_problem; a new one holds rattn_problem_init's defaults");
  problem.def("__init__", [](rattn_problem* p) {
    new (p) rattn_problem();
    rattn_problem_init(p);
  });
  problem.def_rw("batch", &rattn_problem::batch)
      .def_rw("total_q", &rattn_problem::total_q)
      .def_rw("total_kv", &rattn_problem::total_kv)
      .def_rw("max_seqlen_q", &rattn_problem::max_seqlen_q)
      .def_rw("max_seqlen_kv", &rattn_problem::max_seqlen_kv)
      .def_rw("has_seq_offsets", &rattn_problem::has_seq_offsets)
      .def_rw("num_heads_q", &rattn_problem::num_heads_q)
      .def_rw("num_heads_kv", &rattn_problem::num_heads_kv)
      .def_rw("head_dim_qk", &rattn_problem::head_dim_qk)
      .def_rw("head_dim_v", &rattn_problem::head_dim_v)
      .def_rw("softmax_scale", &rattn_problem::softmax_scale)
      .def_rw("softcap", &rattn_problem::softcap)
      .def_rw("window_left", &rattn_problem::window_left)
      .def_rw("window_right", &rattn_problem::window_right)
      .def_rw("has_sink", &rattn_problem::has_sink)
      .def_rw("deterministic", &rattn_problem::deterministic)
      .def_rw("zero_padding", &rattn_problem::zero_padding);
  // Enum fields as plain ints: the values are the module's constants above.
#define RATTN_ENUM_FIELD(field, type)                              \
  problem.def_prop_rw(                                             \
      #field, [](const rattn_problem& p) { return int(p.field); }, \
      [](rattn_problem& p, int v) { p.field = static_cast<type>(v); })
  RATTN_ENUM_FIELD(dtype, rattn_dtype);
  RATTN_ENUM_FIELD(mask, rattn_mask);
  RATTN_ENUM_FIELD(alignment, rattn_alignment);
  RATTN_ENUM_FIELD(dq_accum, rattn_dq_accum);
  RATTN_ENUM_FIELD(backend, rattn_backend);
#undef RATTN_ENUM_FIELD
  def_strides<&rattn_problem::q>(problem, "q_strides");
  def_strides<&rattn_problem::k>(problem, "k_strides");
  def_strides<&rattn_problem::v>(problem, "v_strides");
  def_strides<&rattn_problem::o>(problem, "o_strides");
  def_strides<&rattn_problem::d_o>(problem, "d_o_strides");
  def_strides<&rattn_problem::dq>(problem, "dq_strides");
  def_strides<&rattn_problem::dk>(problem, "dk_strides");
  def_strides<&rattn_problem::dv>(problem, "dv_strides");

  nb::class_<PyPlan>(m, "Plan", "A cached rattn_plan")
      .def(
          "workspace_size",
          [](const PyPlan& p, int direction) {
            return p.plan->workspace_bytes(static_cast<rattn_direction>(direction));
          },
          nb::arg("direction"))
      .def_prop_ro("path", [](const PyPlan& p) { return rattn_path_name(p.plan->path()); })
      .def("describe", [](const PyPlan& p) { return p.plan->describe(); })
      .def(
          "forward",
          [](const PyPlan& p, uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse,
             uintptr_t cu_q, uintptr_t cu_kv, uintptr_t off_q, uintptr_t off_kv,
             uintptr_t workspace, size_t workspace_bytes, uintptr_t stream,
             uintptr_t sink) -> nb::object {
            rattn_fwd_tensors t{};
            t.q = ptr<const void>(q);
            t.k = ptr<const void>(k);
            t.v = ptr<const void>(v);
            t.o = ptr<void>(o);
            t.lse = ptr<float>(lse);
            t.cu_seqlens_q = ptr<const int32_t>(cu_q);
            t.cu_seqlens_kv = ptr<const int32_t>(cu_kv);
            t.seq_offsets_q = ptr<const int32_t>(off_q);
            t.seq_offsets_kv = ptr<const int32_t>(off_kv);
            t.sink = ptr<const float>(sink);
            Status s;
            {
              nb::gil_scoped_release release;  // the CPU backend may run for a while
              s = p.plan->forward(t, ptr<void>(workspace), workspace_bytes, ptr<void>(stream));
            }
            return s.ok() ? nb::none() : raise(s);
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"),
          nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_kv"), nb::arg("seq_offsets_q"),
          nb::arg("seq_offsets_kv"), nb::arg("workspace"), nb::arg("workspace_bytes"),
          nb::arg("stream"), nb::arg("sink") = 0,
          "Runs the forward on addresses (0 for an absent optional tensor)")
      .def(
          "backward",
          [](const PyPlan& p, uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t d_o,
             uintptr_t lse, uintptr_t dq, uintptr_t dk, uintptr_t dv, uintptr_t cu_q,
             uintptr_t cu_kv, uintptr_t off_q, uintptr_t off_kv, uintptr_t workspace,
             size_t workspace_bytes, uintptr_t stream, uintptr_t sink, uintptr_t d_sink,
             uintptr_t d_lse) -> nb::object {
            rattn_bwd_tensors t{};
            t.q = ptr<const void>(q);
            t.k = ptr<const void>(k);
            t.v = ptr<const void>(v);
            t.o = ptr<const void>(o);
            t.d_o = ptr<const void>(d_o);
            t.lse = ptr<const float>(lse);
            t.dq = ptr<void>(dq);
            t.dk = ptr<void>(dk);
            t.dv = ptr<void>(dv);
            t.cu_seqlens_q = ptr<const int32_t>(cu_q);
            t.cu_seqlens_kv = ptr<const int32_t>(cu_kv);
            t.seq_offsets_q = ptr<const int32_t>(off_q);
            t.seq_offsets_kv = ptr<const int32_t>(off_kv);
            t.sink = ptr<const float>(sink);
            t.d_sink = ptr<float>(d_sink);
            t.d_lse = ptr<const float>(d_lse);
            Status s;
            {
              nb::gil_scoped_release release;  // the CPU backend may run for a while
              s = p.plan->backward(t, ptr<void>(workspace), workspace_bytes, ptr<void>(stream));
            }
            return s.ok() ? nb::none() : raise(s);
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("d_o"), nb::arg("lse"),
          nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("cu_seqlens_q"),
          nb::arg("cu_seqlens_kv"), nb::arg("seq_offsets_q"), nb::arg("seq_offsets_kv"),
          nb::arg("workspace"), nb::arg("workspace_bytes"), nb::arg("stream"), nb::arg("sink") = 0,
          nb::arg("d_sink") = 0, nb::arg("d_lse") = 0,
          "Runs the backward on addresses (0 for an absent optional tensor)");

  m.def(
      "get_plan",
      [](const rattn_problem& problem, int device) -> nb::object {
        std::shared_ptr<const raggedattn_py::Plan> plan;
        Status s = raggedattn_py::get_plan(problem, device, &plan);
        return s.ok() ? nb::cast(PyPlan{std::move(plan)}) : raise(s);
      },
      nb::arg("problem"), nb::arg("device"),
      "The cached plan of `problem` on CUDA device `device` (ignored by the CPU backend); "
      "raises ValueError with the library's message where the problem is rejected");
  m.def("plan_cache_size", &raggedattn_py::plan_cache_size);
  m.def("clear_plan_cache", &raggedattn_py::clear_plan_cache);
  m.def("version", [] { return std::string(rattn_version()); });
  m.def(
      "query_device",
      [](int device) -> nb::object {
        rattn_device_caps c{};
        Status s = Status::of(rattn_query_device(device, &c));
        if (!s.ok()) return raise(s);
        nb::dict d;
        d["cuda"] = c.cuda != 0;
        d["device"] = c.device;
        d["compute_capability"] = std::make_tuple(c.cc_major, c.cc_minor);
        d["num_sms"] = c.num_sms;
        d["smem_per_block_optin"] = c.smem_per_block_optin;
        d["l2_bytes"] = c.l2_bytes;
        return d;
      },
      nb::arg("device") = -1,
      "rattn_query_device as a dict; cuda is False without a device or in a CPU-only build");

#ifdef RATTN_WITH_XLA_FFI
  m.attr("has_xla_ffi") = true;
  m.def("xla_ffi_targets", &raggedattn_py::xla_ffi_targets,
        "{name: {platform: capsule}} of the XLA FFI handlers");
#else
  m.attr("has_xla_ffi") = false;
#endif
}

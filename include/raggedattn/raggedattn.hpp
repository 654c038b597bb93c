// raggedattn — C++ API. The problem, tensor and capability descriptors are the C structs of
// raggedattn.h (one definition for both languages); this header adds Status, Plan and the calls.
#pragma once

#include <memory>
#include <string>

#include "raggedattn/raggedattn.h"

namespace raggedattn {

using Problem = rattn_problem;
using DeviceCaps = rattn_device_caps;
using FwdTensors = rattn_fwd_tensors;
using BwdTensors = rattn_bwd_tensors;

enum class Path {
  Cpu = RATTN_PATH_CPU,
  CudaPortable = RATTN_PATH_CUDA_PORTABLE,
  CudaSm90 = RATTN_PATH_CUDA_SM90
};
enum class Direction { Forward = RATTN_FORWARD, Backward = RATTN_BACKWARD };

const char* path_name(Path path);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(rattn_status code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }
  bool ok() const { return code_ == RATTN_SUCCESS; }
  rattn_status code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  rattn_status code_ = RATTN_SUCCESS;
  std::string message_;
};

// The defaults of rattn_problem_init.
Problem default_problem();

// Whether this build of the library has CUDA backends (query_device tells whether a device is
// there).
bool built_with_cuda();
// Whether this build has the kernels of `path` (cpu always; the CUDA paths where configured).
bool path_in_build(Path path);

// Capabilities of a CUDA device (-1: current). `cuda == 0` where none is usable.
DeviceCaps query_device(int device = -1);
// Capabilities of a machine without a GPU.
DeviceCaps cpu_caps();

struct PlanData;  // src/plan/plan_data.hpp

// An immutable plan: the validated problem, the chosen path, tiles and scratch layouts.
// Workspace sizing and the launches read the same PlanData; nothing is decided twice.
class Plan {
 public:
  Plan() = default;
  explicit Plan(std::shared_ptr<const PlanData> data) : data_(std::move(data)) {}
  bool valid() const { return data_ != nullptr; }
  const Problem& problem() const;  // with defaults resolved (strides, scale)
  Path path() const;
  size_t workspace_bytes(Direction dir) const;
  // The element type dQ accumulates in on this plan's path (the backward's scratch): fp32, or
  // the input's own 16-bit type.
  rattn_dtype dq_accum_dtype() const;
  std::string describe() const;
  const PlanData& data() const { return *data_; }

 private:
  std::shared_ptr<const PlanData> data_;
};

Status make_plan(const Problem& problem, const DeviceCaps& caps, Plan* plan);

// `stream` is a cudaStream_t (nullptr: default stream); the CPU path ignores it.
Status forward(const Plan& plan, const FwdTensors& tensors, void* workspace, size_t workspace_bytes,
               void* stream = nullptr);
Status backward(const Plan& plan, const BwdTensors& tensors, void* workspace,
                size_t workspace_bytes, void* stream = nullptr);

// Opt-in debug check of segment arrays in device memory (synchronizes the stream).
Status check_segments(const Plan& plan, const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_kv,
                      const int32_t* seq_offsets_q, const int32_t* seq_offsets_kv, void* stream);

}  // namespace raggedattn

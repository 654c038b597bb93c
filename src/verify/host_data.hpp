// Host-side data of a case: where the segments lie (cu_seqlens, seq_offsets), the tensors, and
// the byte patterns that expose unwritten outputs and writes into padding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "raggedattn/raggedattn.hpp"
#include "verify/case_spec.hpp"

namespace raggedattn {
namespace verify {

// Outputs are filled with this byte before a run: 0xFF.. is a NaN in bf16, fp16 and fp32, so an
// element the backend never writes shows up as a non-finite output.
constexpr uint8_t kPoisonByte = 0xFF;
// Padding rows of outputs (padded THD) hold this byte; any change is a write outside a segment.
constexpr uint8_t kPaddingByte = 0x5A;
// Padding rows of inputs hold this value: large, so a kernel that lets padding into the softmax or
// a sum fails loudly. Cases with nan_padding (the named suite's padded_thd, half of the random
// padded ones) hold NaN instead, which also catches a padding row multiplied by a zero
// probability: rows outside every segment may hold anything, and no kernel may read one into a
// result.
constexpr float kInputPaddingValue = 1000.f;

// A host allocation that failed, with its size and what it was for. It is a std::bad_alloc, so
// code that catches that still catches it; the command prints its message and exits with 2.
class HostAllocError : public std::bad_alloc {
 public:
  HostAllocError(double bytes, const std::string& what);
  // "cannot allocate 1.5 GiB (1610612736 bytes) of host memory for <what>"
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// A byte count for people: "95.4 GiB", "512 B". A double: sums of tensor sizes can pass 2^64.
std::string size_str(double bytes);

// Host memory, 64-byte aligned (the API asks for 16). Throws HostAllocError where it cannot be had.
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes);
  void* data() { return ptr_.get(); }
  const void* data() const { return ptr_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> ptr_;
  size_t bytes_ = 0;
};

// A read-only view of a [rows, heads, dim] tensor (last dim contiguous) in host memory: elements
// of `dtype`, or doubles when `f64` is set (the dense brute force's results).
struct TensorView {
  const void* data = nullptr;
  rattn_dtype dtype = RATTN_DTYPE_FP32;
  bool f64 = false;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  int32_t heads = 0;
  int32_t dim = 0;
  int64_t offset(int64_t row, int32_t head) const {
    return row * token_stride + head * head_stride;
  }
  double at(int64_t row, int32_t head, int32_t d) const;
};

// An owned tensor. Token-major [rows, heads, dim] unless made by lse_tensor().
struct HostTensor {
  rattn_dtype dtype = RATTN_DTYPE_FP32;
  int64_t rows = 0;
  int32_t heads = 0;
  int32_t dim = 0;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  HostBuffer buffer;

  HostTensor() = default;
  HostTensor(rattn_dtype t, int64_t rows, int32_t heads, int32_t dim);
  int64_t elements() const { return rows * heads * dim; }
  size_t bytes() const;
  void* data() { return buffer.data(); }
  const void* data() const { return buffer.data(); }
  TensorView view() const;
  // Every element of the rows where row_mask[row] != 0 (all rows when the mask is empty).
  void fill_bytes(uint8_t byte, const std::vector<uint8_t>& row_mask = {});
  void set(int64_t row, int32_t head, int32_t d, float value);
};

// LSE: fp32 [heads, rows]. Viewed as a [rows, heads, 1] tensor with token stride 1.
HostTensor lse_tensor(int64_t rows, int32_t heads);

// The same values in another dtype (rounded to nearest even when narrowing).
HostTensor convert(const TensorView& from, int64_t rows, rattn_dtype to);

struct SegmentRows {
  int64_t q_row0 = 0;
  int64_t kv_row0 = 0;
  int32_t len_q = 0;
  int32_t len_kv = 0;
};

// Where the segments of a case lie in the tensors.
struct PackLayout {
  std::vector<int32_t> cu_q, cu_kv;    // B + 1 entries
  std::vector<int32_t> off_q, off_kv;  // padded THD: B + 1 entries (the last is the row count)
  int64_t total_q = 0, total_kv = 0;   // tensor rows, padding included
  int32_t max_q = 0, max_kv = 0;
  std::vector<SegmentRows> segments;
  std::vector<uint8_t> q_padding, kv_padding;  // 1 for rows that belong to no segment

  bool padded() const { return !off_q.empty(); }
};

// The most rows of padding make_layout puts before a segment (or after the last) in padded THD.
constexpr int32_t kMaxPaddingGap = 6;

// Packed (rows back to back) or, for spec.padded, padded with 1..kMaxPaddingGap rows of padding
// before every segment and after the last one (gap sizes drawn from `seed`).
PackLayout make_layout(const CaseSpec& spec, uint64_t seed);

// The library's problem description of a case on a layout (contiguous strides).
Problem make_problem(const CaseSpec& spec, const PackLayout& layout);

// One fp32 value per query head (sinks, d_sink): rows = heads, one head of dim 1 each.
HostTensor head_values(int32_t heads);

// The sinks' logits are drawn uniformly from [kSinkLow, kSinkHigh], the range of the row maxima
// of N(0, 1) data's scores at scale 1/sqrt(d): the sink's share of a row's weight then goes from
// a fraction of a percent (a long row, a low sink) to most of it (a short row, a high sink), so an
// error in either direction shows.
constexpr double kSinkLow = -1.0, kSinkHigh = 3.0;

struct HostInputs {
  HostTensor q, k, v, d_o;
  HostTensor sink;   // head_values(hq) with spec.sink; empty otherwise
  HostTensor d_lse;  // lse_tensor's layout, N(0, 1), with spec.lse_grad; empty otherwise
};

// Fresh N(0, 1) inputs in the case's dtype (so every path sees the same representable values);
// padding rows (d_lse's padding columns too) hold kInputPaddingValue (NaN for spec.nan_padding).
// Sinks and d_lse come from streams of their own: a seed draws the same Q, K, V, dO either way.
HostInputs make_inputs(const CaseSpec& spec, const PackLayout& layout, uint64_t seed);

struct HostOutputs {
  HostTensor o, lse, dq, dk, dv;
  HostTensor d_sink;  // head_values(hq) with spec.sink; empty otherwise
};

// Output tensors of a case: poisoned, with padding rows holding kPaddingByte (d_sink, which has
// no padding, poisoned whole).
HostOutputs make_outputs(const CaseSpec& spec, const PackLayout& layout, rattn_dtype dtype);
// Re-applies the poison and padding patterns of make_outputs to existing tensors.
void poison_outputs(const PackLayout& layout, HostOutputs* out);

// Elements of padding rows holding any byte other than `expected` (kPaddingByte: the sentinel
// poison_outputs wrote; 0: the zero_padding mode's zeros).
int64_t changed_padding(const HostTensor& t, const std::vector<uint8_t>& padding_rows,
                        uint8_t expected = kPaddingByte);

}  // namespace verify
}  // namespace raggedattn

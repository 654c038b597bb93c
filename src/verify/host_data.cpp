#include "verify/host_data.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <new>

#include "common/half.hpp"
#include "verify/rng.hpp"

namespace raggedattn {
namespace verify {
namespace {

constexpr size_t kHostAlign = 64;

int elem_bytes(rattn_dtype t) {
  return t == RATTN_DTYPE_FP32 ? 4 : 2;
}

}  // namespace

HostAllocError::HostAllocError(double bytes, const std::string& what) {
  char exact[64];
  std::snprintf(exact, sizeof(exact), "%.0f", bytes);
  message_ =
      "cannot allocate " + size_str(bytes) + " (" + exact + " bytes) of host memory for " + what;
}

std::string size_str(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t unit = 0;
  while (bytes >= 1024 && unit + 1 < std::size(kUnits)) {
    bytes /= 1024;
    ++unit;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), unit ? "%.1f %s" : "%.0f %s", bytes, kUnits[unit]);
  return buf;
}

HostBuffer::HostBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + kHostAlign - 1) / kHostAlign * kHostAlign;
  ptr_.reset(std::aligned_alloc(kHostAlign, rounded));
  if (!ptr_) throw HostAllocError(double(bytes), "a buffer");
}

double TensorView::at(int64_t row, int32_t head, int32_t d) const {
  if (f64) return static_cast<const double*>(data)[offset(row, head) + d];
  return load_elem(data, offset(row, head) + d, dtype);
}

HostTensor::HostTensor(rattn_dtype t, int64_t r, int32_t h, int32_t d)
    : dtype(t), rows(r), heads(h), dim(d), token_stride(int64_t(h) * d), head_stride(d) {
  try {
    buffer = HostBuffer(bytes());
  } catch (const HostAllocError&) {
    // The tensor's shape tells which part of the problem is too large.
    throw HostAllocError(double(bytes()), "a [" + std::to_string(r) + " x " + std::to_string(h) +
                                              " x " + std::to_string(d) + "] " + dtype_str(t) +
                                              " tensor");
  }
}

size_t HostTensor::bytes() const {
  return size_t(elements()) * elem_bytes(dtype);
}

TensorView HostTensor::view() const {
  TensorView v;
  v.data = data();
  v.dtype = dtype;
  v.token_stride = token_stride;
  v.head_stride = head_stride;
  v.heads = heads;
  v.dim = dim;
  return v;
}

void HostTensor::fill_bytes(uint8_t byte, const std::vector<uint8_t>& row_mask) {
  if (row_mask.empty()) {
    if (bytes()) std::memset(data(), byte, bytes());
    return;
  }
  const int eb = elem_bytes(dtype);
  auto* base = static_cast<uint8_t*>(data());
  for (int64_t r = 0; r < rows; ++r) {
    if (!row_mask[size_t(r)]) continue;
    for (int32_t h = 0; h < heads; ++h) {
      std::memset(base + (r * token_stride + h * head_stride) * eb, byte, size_t(dim) * eb);
    }
  }
}

void HostTensor::set(int64_t row, int32_t head, int32_t d, float value) {
  store_elem(data(), row * token_stride + head * head_stride + d, dtype, value);
}

HostTensor lse_tensor(int64_t rows, int32_t heads) {
  HostTensor t(RATTN_DTYPE_FP32, rows, heads, 1);
  t.token_stride = 1;
  t.head_stride = rows;
  return t;
}

HostTensor head_values(int32_t heads) {
  return HostTensor(RATTN_DTYPE_FP32, heads, 1, 1);
}

HostTensor convert(const TensorView& from, int64_t rows, rattn_dtype to) {
  HostTensor t(to, rows, from.heads, from.dim);
  t.token_stride = from.token_stride;
  t.head_stride = from.head_stride;
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t h = 0; h < from.heads; ++h) {
      for (int32_t d = 0; d < from.dim; ++d) t.set(r, h, d, float(from.at(r, h, d)));
    }
  }
  return t;
}

PackLayout make_layout(const CaseSpec& spec, uint64_t seed) {
  PackLayout l;
  const int32_t batch = spec.batch();
  Rng gaps(mix_seed(seed, 0x676170ull));
  l.cu_q.assign(size_t(batch) + 1, 0);
  l.cu_kv.assign(size_t(batch) + 1, 0);
  if (spec.padded) {
    l.off_q.assign(size_t(batch) + 1, 0);
    l.off_kv.assign(size_t(batch) + 1, 0);
  }
  int64_t row_q = 0, row_kv = 0;
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t lq = spec.seqlens_q[size_t(b)], lk = spec.kv_lens()[size_t(b)];
    if (spec.padded) {
      row_q += gaps.range(1, kMaxPaddingGap);
      row_kv += gaps.range(1, kMaxPaddingGap);
      l.off_q[size_t(b)] = int32_t(row_q);
      l.off_kv[size_t(b)] = int32_t(row_kv);
    }
    SegmentRows s;
    s.q_row0 = row_q;
    s.kv_row0 = row_kv;
    s.len_q = lq;
    s.len_kv = lk;
    l.segments.push_back(s);
    l.cu_q[size_t(b) + 1] = l.cu_q[size_t(b)] + lq;
    l.cu_kv[size_t(b) + 1] = l.cu_kv[size_t(b)] + lk;
    row_q += lq;
    row_kv += lk;
    l.max_q = std::max(l.max_q, lq);
    l.max_kv = std::max(l.max_kv, lk);
  }
  if (spec.padded) {
    row_q += gaps.range(1, kMaxPaddingGap);
    row_kv += gaps.range(1, kMaxPaddingGap);
    l.off_q[size_t(batch)] = int32_t(row_q);
    l.off_kv[size_t(batch)] = int32_t(row_kv);
  }
  row_q += spec.trailing_rows;
  row_kv += spec.trailing_rows;
  l.total_q = row_q;
  l.total_kv = row_kv;
  l.q_padding.assign(size_t(l.total_q), 1);
  l.kv_padding.assign(size_t(l.total_kv), 1);
  for (const SegmentRows& s : l.segments) {
    std::fill_n(l.q_padding.begin() + s.q_row0, s.len_q, uint8_t(0));
    std::fill_n(l.kv_padding.begin() + s.kv_row0, s.len_kv, uint8_t(0));
  }
  return l;
}

Problem make_problem(const CaseSpec& spec, const PackLayout& l) {
  Problem p = default_problem();
  p.batch = spec.batch();
  p.total_q = l.total_q;
  p.total_kv = l.total_kv;
  p.max_seqlen_q = l.max_q;
  p.max_seqlen_kv = l.max_kv;
  p.has_seq_offsets = l.padded() ? 1 : 0;
  p.num_heads_q = spec.hq;
  p.num_heads_kv = spec.hkv;
  p.head_dim_qk = spec.dqk;
  p.head_dim_v = spec.dv;
  p.dtype = spec.dtype;
  p.softcap = spec.softcap;
  p.mask = spec.mask;
  p.alignment = spec.alignment;
  p.window_left = spec.window_left;
  p.window_right = spec.window_right;
  p.dq_accum = spec.dq_accum;
  p.deterministic = spec.deterministic ? 1 : 0;
  p.backend = spec.backend;
  p.zero_padding = spec.zero_padding ? 1 : 0;
  p.has_sink = spec.sink ? 1 : 0;
  return p;
}

HostInputs make_inputs(const CaseSpec& spec, const PackLayout& l, uint64_t seed) {
  HostInputs in;
  in.q = HostTensor(spec.dtype, l.total_q, spec.hq, spec.dqk);
  in.k = HostTensor(spec.dtype, l.total_kv, spec.hkv, spec.dqk);
  in.v = HostTensor(spec.dtype, l.total_kv, spec.hkv, spec.dv);
  in.d_o = HostTensor(spec.dtype, l.total_q, spec.hq, spec.dv);
  struct Fill {
    HostTensor* t;
    const std::vector<uint8_t>* padding;
  } fills[] = {{&in.q, &l.q_padding},
               {&in.k, &l.kv_padding},
               {&in.v, &l.kv_padding},
               {&in.d_o, &l.q_padding}};
  const float pad_value =
      spec.nan_padding ? std::numeric_limits<float>::quiet_NaN() : kInputPaddingValue;
  uint64_t stream = 0;
  for (const Fill& f : fills) {
    Rng r(mix_seed(seed, ++stream));
    for (int64_t row = 0; row < f.t->rows; ++row) {
      const bool pad = (*f.padding)[size_t(row)] != 0;
      for (int32_t h = 0; h < f.t->heads; ++h) {
        for (int32_t d = 0; d < f.t->dim; ++d) {
          f.t->set(row, h, d, pad ? pad_value : float(r.normal()));
        }
      }
    }
  }
  if (spec.sink) {
    in.sink = head_values(spec.hq);
    Rng r(mix_seed(seed, 0x73696e6bull));
    for (int32_t h = 0; h < spec.hq; ++h) {
      in.sink.set(h, 0, 0, float(kSinkLow + (kSinkHigh - kSinkLow) * r.uniform()));
    }
  }
  if (spec.lse_grad) {
    in.d_lse = lse_tensor(l.total_q, spec.hq);
    Rng r(mix_seed(seed, 0x646c7365ull));
    for (int32_t h = 0; h < spec.hq; ++h) {
      for (int64_t row = 0; row < l.total_q; ++row) {
        in.d_lse.set(row, h, 0, l.q_padding[size_t(row)] ? pad_value : float(r.normal()));
      }
    }
  }
  return in;
}

HostOutputs make_outputs(const CaseSpec& spec, const PackLayout& l, rattn_dtype dtype) {
  HostOutputs out;
  out.o = HostTensor(dtype, l.total_q, spec.hq, spec.dv);
  out.lse = lse_tensor(l.total_q, spec.hq);
  out.dq = HostTensor(dtype, l.total_q, spec.hq, spec.dqk);
  out.dk = HostTensor(dtype, l.total_kv, spec.hkv, spec.dqk);
  out.dv = HostTensor(dtype, l.total_kv, spec.hkv, spec.dv);
  if (spec.sink) out.d_sink = head_values(spec.hq);
  poison_outputs(l, &out);
  return out;
}

void poison_outputs(const PackLayout& l, HostOutputs* out) {
  for (HostTensor* t : {&out->o, &out->lse, &out->dq}) {
    t->fill_bytes(kPoisonByte);
    t->fill_bytes(kPaddingByte, l.q_padding);
  }
  for (HostTensor* t : {&out->dk, &out->dv}) {
    t->fill_bytes(kPoisonByte);
    t->fill_bytes(kPaddingByte, l.kv_padding);
  }
  out->d_sink.fill_bytes(kPoisonByte);
}

int64_t changed_padding(const HostTensor& t, const std::vector<uint8_t>& padding_rows,
                        uint8_t expected) {
  const int eb = elem_bytes(t.dtype);
  const auto* base = static_cast<const uint8_t*>(t.data());
  int64_t changed = 0;
  for (int64_t r = 0; r < t.rows; ++r) {
    if (!padding_rows[size_t(r)]) continue;
    for (int32_t h = 0; h < t.heads; ++h) {
      const uint8_t* e = base + (r * t.token_stride + h * t.head_stride) * eb;
      for (int32_t d = 0; d < t.dim; ++d, e += eb) {
        for (int k = 0; k < eb; ++k) {
          if (e[k] != expected) {
            ++changed;
            break;
          }
        }
      }
    }
  }
  return changed;
}

}  // namespace verify
}  // namespace raggedattn

// Plans a small packed problem with the installed library and runs it on the CPU backend,
// through the C++ API; prints the plan and the output's first value. Exit 0 on success.
#include <cstdio>
#include <vector>

#include <raggedattn/raggedattn.hpp>

namespace ra = raggedattn;

int main() {
  ra::Problem p = ra::default_problem();
  p.batch = 2;  // segments of 5 and 3 tokens
  p.total_q = p.total_kv = 8;
  p.max_seqlen_q = p.max_seqlen_kv = 5;
  p.num_heads_q = 2;
  p.num_heads_kv = 1;
  p.head_dim_qk = p.head_dim_v = 64;
  p.dtype = RATTN_DTYPE_FP32;
  p.mask = RATTN_MASK_CAUSAL;
  p.backend = RATTN_BACKEND_CPU;

  ra::Plan plan;
  ra::Status s = ra::make_plan(p, ra::cpu_caps(), &plan);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  std::vector<float> q(8 * 2 * 64, 0.5f), k(8 * 64, 0.25f), v(8 * 64, 1.0f), o(8 * 2 * 64);
  std::vector<float> lse(2 * 8);
  const int32_t cu[3] = {0, 5, 8};
  ra::FwdTensors f{q.data(), k.data(), v.data(), o.data(), lse.data(), cu, cu, nullptr, nullptr};
  s = ra::forward(plan, f, nullptr, 0, nullptr);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 1;
  }
  std::printf("%s: o[0] = %g (expect 1)\n", plan.describe().c_str(), double(o[0]));
  return o[0] > 0.999f && o[0] < 1.001f ? 0 : 1;
}

// raggedattn::verify — the verification library behind `raggedattn check/run/bench` and the tests.
//
//   case_spec.hpp  CaseSpec (a named problem: segments, heads, dims, dtype, mask, window, softcap,
//                  sinks, an LSE cotangent, padded THD, dq accumulation, determinism, backend),
//                  named_suite(), random_case(), FLOP counts.
//   host_data.hpp  PackLayout (cu_seqlens, seq_offsets with random padding gaps), fresh N(0, 1)
//                  inputs (and sinks, d_lse), output buffers poisoned with NaN bytes and padding
//                  sentinels.
//   dense.hpp      the dense float64 brute force: a [total_q x total_kv] score matrix per head with
//                  an explicit mask re-derived from raggedattn.h; forward and backward (d_sink).
//   metrics.hpp    cosine / relative error / max abs error per segment and tensor, the pass rule,
//                  and the checker that works on any host arrays.
//   runner.hpp     run_case(): plan through the public API, run forward and backward where the plan
//                  says (host or device memory), compare against the CPU reference (CUDA paths) or
//                  the brute force (the cpu path).
//   report.hpp     tables and verdicts.
//
// The library compiles with and without CUDA; device memory is used only under RATTN_WITH_CUDA.
#pragma once

#include "verify/case_spec.hpp"
#include "verify/dense.hpp"
#include "verify/host_data.hpp"
#include "verify/metrics.hpp"
#include "verify/report.hpp"
#include "verify/runner.hpp"

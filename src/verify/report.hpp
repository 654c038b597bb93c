// Printing case reports: a table per case (a row per segment; cos / rel / max abs for O, LSE, dQ,
// dK, dV, failures marked), a summary line per case with the path used, and a final PASS / FAIL.
#pragma once

#include <ostream>
#include <vector>

#include "verify/runner.hpp"

namespace raggedattn {
namespace verify {

// The per-segment table, the failure details and the summary line of one case.
void print_case(std::ostream& os, const CaseReport& r);
// The summary line alone, e.g. "gqa_causal_256  PASS  cuda_portable bf16 ...  fwd 0.11 ms ...".
void print_summary(std::ostream& os, const CaseReport& r);
// The last line: "PASS (N cases)" or "FAIL (k of N cases: names)". Returns whether all passed.
bool print_verdict(std::ostream& os, const std::vector<CaseReport>& reports);

// The largest rel / bound over the case's segments and tensors (< 1 passes that part of the rule).
double worst_ratio(const CaseReport& r, int* segment, Tensor* tensor);

}  // namespace verify
}  // namespace raggedattn

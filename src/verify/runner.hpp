// Runs one case end to end and judges it.
//
// run_case: make a plan through the public C++ API; put fresh inputs where the chosen path reads
// them (host for cpu, device memory for CUDA paths), outputs and workspace poisoned and padding
// rows holding a sentinel; forward, then backward fed by that forward's O and LSE (and, as the case
// asks, sinks and an LSE cotangent); copy back; and compare every segment of O, LSE, dQ, dK, dV,
// and with sinks d_sink and the rows that see no key:
//  - a CUDA path against the exact CPU reference (fp32 data of the same values), bounded by the
//    error of the reference's low-precision emulation (DESIGN.md "Verification"), in the data's
//    dtype (dQ: in its 16-bit scratch's format where the plan's differs from the data's);
//  - the cpu path (the reference itself) against the dense float64 brute force, bounded by the
//    reference's fp32 arithmetic plus the rounding of its outputs to the storage dtype.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "raggedattn/raggedattn.hpp"
#include "verify/case_spec.hpp"
#include "verify/gpu_sensors.hpp"
#include "verify/metrics.hpp"

namespace raggedattn {
namespace verify {

// The cpu path's arithmetic (fp32 products, fp64 sums, fp32 exp arguments rounded from fp64) is
// checked to this relative error against float64; measured values are ~1e-7, and an error in
// the math (a wrong mask edge, a missing softcap derivative) is orders of magnitude larger.
constexpr double kReferenceMathTol = 1e-6;

struct RunOptions {
  uint64_t seed = 1;          // the run's seed; every case derives its own data streams from it
  bool check = true;          // false: run (and time) only, no reference (bench)
  int timing_runs = 0;        // > 0: after the checked run, a warm-up and this many timed runs
  int reference_threads = 0;  // threads of the CPU reference (0: all cores)
  // Idle milliseconds before each direction's warm-up: lets the GPU's clock and power settle, so
  // a direction's time does not depend on what ran just before it (docs/PERFORMANCE.md item 58).
  int pause_ms = 0;
  // The timing regime of triton.testing.do_bench, which the anchor scripts use: warm-up calls
  // until they have run warmup_ms in all (at least one), then timed calls until there are
  // timing_runs of them and they have run min_timed_ms in all. 0, 0: one warm-up call and
  // timing_runs timed calls.
  int warmup_ms = 0, min_timed_ms = 0;
  // > 0: before each warm-up and timed call, this many bytes of a buffer of their own are zeroed
  // (not timed), so no call finds its inputs in L2 from the call before: do_bench zeroes 256 MiB.
  size_t l2_flush_bytes = 0;
  const DeviceCaps* caps = nullptr;  // nullptr: query_device()
  // > 0: the deadline, in seconds, on each of a case's spans of device work (the checked calls
  // with their downloads, each direction's timed calls). Past it the process exits with status
  // kExitHang, naming the case (watchdog.hpp): a kernel that never ends would otherwise stall the
  // run without a word. The largest named or random case takes well under a second.
  double hang_seconds = 300;
  // Where set, told what run_case is doing, for progress reports of long runs: each phase as it
  // starts (done = total = 0), and within the float64 brute force the rows done of how many.
  // Calls come from several threads but never two at once.
  std::function<void(const std::string& phase, int64_t done, int64_t total)> progress;
};

enum class CheckMode {
  None,       // not checked
  Reference,  // against the CPU reference, bounded by its low-precision emulation
  Dense,      // against the float64 brute force
};

struct CaseReport {
  CaseSpec spec;
  uint64_t seed = 0;  // the case's data seed (derived from the run seed and the case name)
  std::string path;   // plan.describe()
  // A library or CUDA error. `stage` says where: "make_plan" (the problem is rejected: a usage
  // error), "forward", "backward" or "memory" (the run failed).
  rattn_status status = RATTN_SUCCESS;
  std::string stage;
  std::string error;

  CheckMode mode = CheckMode::None;
  std::vector<SegmentCheck> segments;
  std::array<int64_t, kNumTensors> padding_changed{};  // padding elements written, per tensor
  int64_t nondeterministic = -1;  // deterministic backward: differing bytes of two runs (-1: n/a)
  // With sinks: d_sink, one value per query head summed over every segment, against the
  // reference's as one vector (rows = heads) under the LSE's tolerance; without, empty (passes).
  Metrics d_sink;
  // With sinks: the (row, head) pairs of rows that see no key, and those whose O is not exactly 0
  // or whose LSE is not the sink's logit (-1: the case has no sinks).
  int64_t keyless_rows = 0;
  int64_t keyless_wrong = -1;

  double fwd_ms = 0, bwd_ms = 0;  // median of timing_runs, else the checked run's time
  int timed_runs = 0;
  // The GPU's SM clock and power, sampled about every millisecond while each direction's timed
  // calls ran (gpu_sensors.hpp's SensorSampler; empty where they cannot be read).
  std::vector<GpuReading> fwd_readings, bwd_readings;
  // Each timed call's time, in order (more calls than timed_runs where min_timed_ms asked).
  std::vector<double> fwd_call_ms, bwd_call_ms;
  double check_ms = 0;  // time spent computing the reference
  bool pass = false;

  bool plan_error() const { return status != RATTN_SUCCESS && stage == "make_plan"; }
};

CaseReport run_case(const CaseSpec& spec, const RunOptions& options);

// A part of the host memory run_case holds at once: what holds it, and its bytes (a double: sums
// of tensor sizes can pass 2^64).
struct HostNeed {
  std::string what;
  double bytes = 0;
};
// The host memory run_case needs for a case on the cpu path or a CUDA one, checked or not, in
// parts. A lower bound (padding rows, layouts, workspaces and the CPU reference's own buffers are
// left out): a case it puts above the machine's memory cannot run there, and is refused before
// anything is allocated rather than killed or aborted half-way.
std::vector<HostNeed> host_needs(const CaseSpec& spec, bool cpu_path, bool check);

// Tolerances per tensor of each mode.
Tolerances reference_tolerances();
Tolerances dense_tolerances(rattn_dtype storage);

}  // namespace verify
}  // namespace raggedattn

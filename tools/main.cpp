// The `raggedattn` command: check, run, bench, info. Parsing and printing only; the work is in
// src/verify.
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "args.hpp"
#include "core/dq_accum_layout.hpp"
#include "core/portable_shapes.hpp"
#include "core/sm90_shapes.hpp"
#include "progress.hpp"
#include "raggedattn/raggedattn.hpp"
#include "verify/memory.hpp"
#include "verify/rng.hpp"
#include "verify/verify.hpp"

namespace raggedattn {
namespace cli {
namespace {

using verify::CaseReport;
using verify::CaseSpec;

constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;

const char* const kUsage = R"(usage: raggedattn <command> [options]

commands:
  check   run the named verification suite (or one config, or random cases) and compare every
          segment of O, LSE, dQ, dK, dV (and d_sink) with the reference; last line PASS or FAIL
            --backend auto|cpu|cuda|cuda_portable|cuda_sm90   (default auto: CUDA if present)
            --dtype bf16|fp16|fp32  --dq-accum fp32|bf16  --deterministic  --sink  --lse-grad
            --config NAME  --heads HQ/HKV  --random N  --seed S  --list  --progress
          With the cpu backend the reference itself is checked against a float64 brute force.
          --sink, --lse-grad: every case with attention sinks, with an LSE cotangent (the
          sink_* and lse_grad configurations have them anyway; random cases draw them).
          --progress: each case's phase, and the rows of the float64 brute force, on stderr
          as plain lines; on a terminal they show anyway, as one line rewritten in place.
  run     run one problem, check it and time it
            --segments 100,80,76 [--kv-segments ...] [--heads 32/8] [--dim 128] [--dim-v 128]
            [--causal | --causal-bottom-right] [--window L,R [--align top-left|bottom-right]]
            [--softcap C] [--sink] [--lse-grad] [--dtype ..] [--dq-accum ..] [--deterministic]
            [--padded] [--backend ..] [--seed S] [--repeat N] [--no-check] [--progress]
            --sink: a learnable sink logit per query head (drawn at random; d_sink checked).
            --lse-grad: the backward is given a random cotangent of the LSE (d_lse).
            --progress: the phase (forward, backward, the check's reference or float64 brute
            force and its rows) on stderr as plain lines; shown anyway on a terminal, in place.
  bench   time one problem (run's problem options: raggedattn run --help), no checking
            [--repeat N] [--pause-ms MS] [--warmup-ms W --min-ms R] [--l2-flush-mb MB]
            [--json FILE] [--progress]
            --pause-ms: idle time before each direction's warm-up (the GPU's clock settles).
            --warmup-ms, --min-ms: triton's do_bench regime (the anchors'): warm-up calls for
            W ms, then timed calls until N of them have run R ms.
            --l2-flush-mb: MB MiB zeroed before each call, untimed (do_bench: 256).
            Where NVML is present, the SM clock, the power and the reasons the clock is held
            below its maximum, sampled every millisecond while the timed calls run, are printed
            and written to the JSON (medians, the board's energy per FLOP, and the samples),
            with each call's time.
            FLOPs count visible (query, key) pairs only: 2*(Dqk+Dv)*Hq per pair forward,
            2.5x that backward.
  info    the build, the device and the plan of a problem (run's problem options)

exit status: 0 pass, 1 a check failed, 2 bad arguments, a problem the library rejects, or one
too large for this machine's memory, 3 a kernel still running past the deadline, the case named
on stderr (check, run and bench: --deadline-s S on each span of a case's device work, default
300, 0 for none)
)";

// What the command line asked for, before defaults that depend on the machine are filled in.
struct Options {
  CaseSpec spec;
  bool have_segments = false, have_heads = false, have_dtype = false;
  bool causal = false, causal_br = false;
  std::vector<int32_t> kv_segments;
  bool have_dim_v = false;
  std::string config;
  int32_t random = 0;
  bool have_seed = false;
  uint64_t seed = 0;
  int32_t repeat = -1;
  int32_t pause_ms = 0, warmup_ms = 0, min_ms = 0, l2_flush_mb = 0;
  bool no_check = false;
  bool list = false;
  bool progress = false;
  double deadline_s = -1;  // < 0: RunOptions' default
  std::string json;
};

// Where the backend will run: decides the machine-dependent defaults (heads, dtype, repeats).
bool runs_on_cpu(rattn_backend b) {
  if (b == RATTN_BACKEND_CPU) return true;
  if (b != RATTN_BACKEND_AUTO) return false;
  return !built_with_cuda() || !query_device().cuda;
}

enum class Command { Check, Run, Bench, Info };
// The commands by name, in kUsage's order: the dispatch, the errors and the help read this list.
constexpr std::pair<const char*, Command> kCommands[] = {{"check", Command::Check},
                                                         {"run", Command::Run},
                                                         {"bench", Command::Bench},
                                                         {"info", Command::Info}};
const char* command_name(Command c) {
  for (const auto& [name, command] : kCommands) {
    if (command == c) return name;
  }
  return "";
}
// The command named `name`, or nullptr.
const Command* find_command(const std::string& name) {
  for (const auto& entry : kCommands) {
    if (name == entry.first) return &entry.second;
  }
  return nullptr;
}

// Padded THD's seq_offsets are int32 too: the tokens and the padding rows before every segment
// and after the last must fit.
void check_padded_rows(const CaseSpec& spec) {
  if (!spec.padded) return;
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  for (const std::vector<int32_t>* lens : {&spec.seqlens_q, &spec.kv_lens()}) {
    int64_t rows = int64_t(verify::kMaxPaddingGap) * int64_t(lens->size() + 1);
    for (int32_t len : *lens) rows += len;
    if (rows > kMax) {
      throw UsageError("--padded: the tokens and up to " + std::to_string(verify::kMaxPaddingGap) +
                       " padding rows before each segment and after the last come to " +
                       std::to_string(rows) + " rows, beyond the int32 range of seq_offsets (" +
                       std::to_string(kMax) + ")");
    }
  }
}

Options parse(Command cmd, Args& args) {
  Options o;
  o.spec.name = cmd == Command::Bench ? "bench" : "run";
  while (!args.done()) {
    const std::string opt = args.next_option();
    const bool problem_cmd = cmd != Command::Check;
    auto flag = [&] { args.no_value(opt); };
    if (opt == "--backend") {
      const std::string v = args.value(opt);
      if (!verify::parse_backend(v, &o.spec.backend)) {
        throw UsageError(opt + ": got '" + v +
                         "'; expected one of auto, cpu, cuda, cuda_portable, cuda_sm90");
      }
    } else if (opt == "--dtype") {
      const std::string v = args.value(opt);
      if (!verify::parse_dtype(v, &o.spec.dtype)) {
        throw UsageError(opt + ": got '" + v + "'; expected one of bf16, fp16, fp32 (cpu only)");
      }
      o.have_dtype = true;
    } else if (opt == "--dq-accum") {
      const std::string v = args.value(opt);
      if (!verify::parse_dq_accum(v, &o.spec.dq_accum)) {
        throw UsageError(opt + ": got '" + v + "'; expected fp32 or bf16");
      }
    } else if (opt == "--deterministic") {
      flag();
      o.spec.deterministic = true;
    } else if (opt == "--sink") {
      flag();
      o.spec.sink = true;
    } else if (opt == "--lse-grad") {
      flag();
      o.spec.lse_grad = true;
    } else if (opt == "--heads") {
      parse_heads(opt, args.value(opt), &o.spec.hq, &o.spec.hkv);
      o.have_heads = true;
    } else if (opt == "--seed") {
      o.seed = parse_u64(opt, args.value(opt));
      o.have_seed = true;
    } else if (cmd == Command::Check && opt == "--config") {
      o.config = args.value(opt);
    } else if (cmd == Command::Check && opt == "--random") {
      o.random = parse_int(opt, args.value(opt), 1, 1000000);
    } else if (cmd == Command::Check && opt == "--list") {
      flag();
      o.list = true;
    } else if (cmd != Command::Info && opt == "--progress") {
      flag();
      o.progress = true;
    } else if (cmd != Command::Info && opt == "--deadline-s") {
      o.deadline_s = parse_float(opt, args.value(opt), 0.0);
    } else if (problem_cmd && opt == "--segments") {
      o.spec.seqlens_q = parse_lengths(opt, args.value(opt));
      o.have_segments = true;
    } else if (problem_cmd && opt == "--kv-segments") {
      o.kv_segments = parse_lengths(opt, args.value(opt));
    } else if (problem_cmd && opt == "--dim") {
      o.spec.dqk = parse_int(opt, args.value(opt), 1, 65536);
    } else if (problem_cmd && opt == "--dim-v") {
      o.spec.dv = parse_int(opt, args.value(opt), 1, 65536);
      o.have_dim_v = true;
    } else if (problem_cmd && opt == "--causal") {
      flag();
      o.causal = true;
    } else if (problem_cmd && opt == "--causal-bottom-right") {
      flag();
      o.causal_br = true;
    } else if (problem_cmd && opt == "--align") {
      // The diagonal a window is measured from, for windows without --causal-bottom-right.
      const std::string v = args.value(opt);
      if (v == "top-left") {
        o.spec.alignment = RATTN_ALIGN_TOP_LEFT;
      } else if (v == "bottom-right") {
        o.spec.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
      } else {
        throw UsageError(opt + ": got '" + v + "'; expected top-left or bottom-right");
      }
    } else if (problem_cmd && opt == "--window") {
      parse_window(opt, args.value(opt), &o.spec.window_left, &o.spec.window_right);
    } else if (problem_cmd && opt == "--softcap") {
      o.spec.softcap = parse_float(opt, args.value(opt), 0.0);
    } else if (problem_cmd && opt == "--padded") {
      flag();
      o.spec.padded = true;
    } else if ((cmd == Command::Run || cmd == Command::Bench) && opt == "--repeat") {
      o.repeat = parse_int(opt, args.value(opt), 1, 100000);
    } else if (cmd == Command::Run && opt == "--no-check") {
      flag();
      o.no_check = true;
    } else if (cmd == Command::Bench && opt == "--pause-ms") {
      o.pause_ms = parse_int(opt, args.value(opt), 0, 600000);
    } else if (cmd == Command::Bench && opt == "--warmup-ms") {
      o.warmup_ms = parse_int(opt, args.value(opt), 0, 600000);
    } else if (cmd == Command::Bench && opt == "--min-ms") {
      o.min_ms = parse_int(opt, args.value(opt), 0, 600000);
    } else if (cmd == Command::Bench && opt == "--l2-flush-mb") {
      o.l2_flush_mb = parse_int(opt, args.value(opt), 0, 4096);
    } else if (cmd == Command::Bench && opt == "--json") {
      o.json = args.value(opt);
      if (o.json.empty()) throw UsageError(opt + ": expected a file name");
    } else {
      throw UsageError("unknown option '" + opt + "' for this command (see raggedattn " +
                       command_name(cmd) + " --help)");
    }
  }

  if (o.causal && o.causal_br) {
    throw UsageError("--causal and --causal-bottom-right: give one of them");
  }
  if (o.causal || o.causal_br) o.spec.mask = RATTN_MASK_CAUSAL;
  if (o.causal_br) o.spec.alignment = RATTN_ALIGN_BOTTOM_RIGHT;
  if (!o.have_dim_v) o.spec.dv = o.spec.dqk;

  const bool cpu = runs_on_cpu(o.spec.backend);
  if (!o.have_heads) {
    // The cpu path is checked against an O(total^2) float64 brute force: fewer heads keep the
    // suite to seconds. A GPU gets the llama3-8B shape.
    o.spec.hq = cpu ? 8 : 32;
    o.spec.hkv = cpu ? 2 : 8;
  }
  if (!o.have_dtype) o.spec.dtype = cpu ? RATTN_DTYPE_FP32 : RATTN_DTYPE_BF16;
  if (!o.have_seed) o.seed = std::random_device{}() | (uint64_t(std::random_device{}()) << 32);

  if (cmd != Command::Check) {
    if (!o.have_segments) {
      if (cmd != Command::Info)
        throw UsageError("--segments is required, e.g. --segments 100,80,76");
      o.spec.seqlens_q = {100, 80, 76};
    }
    if (!o.kv_segments.empty()) {
      if (o.kv_segments.size() != o.spec.seqlens_q.size()) {
        throw UsageError("--kv-segments: got " + std::to_string(o.kv_segments.size()) +
                         " lengths; expected one per --segments entry (" +
                         std::to_string(o.spec.seqlens_q.size()) + ")");
      }
      o.spec.seqlens_kv = o.kv_segments;
    }
    check_padded_rows(o.spec);
  }
  return o;
}

// Prints a library error as the library wrote it, with one "raggedattn: " prefix.
void print_library_error(const std::string& context, const Status& s) {
  std::string msg = s.message();
  const std::string prefix = "raggedattn: ";
  if (msg.compare(0, prefix.size(), prefix) == 0) msg.erase(0, prefix.size());
  std::fprintf(stderr, "raggedattn: %s%s\n", context.c_str(), msg.c_str());
}

// The machine's physical memory in bytes; 0 where it cannot be read.
double physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
}

// Refuses (exit 2) a case that needs more host memory than the machine has, before anything is
// allocated: its run would end in std::bad_alloc or, where the allocation is granted, be killed
// part-way. Prints the parts (verify::host_needs, a lower bound) and `hint`.
bool fits_in_memory(const std::vector<CaseSpec>& cases, Command cmd, bool check, bool name_cases,
                    const char* hint) {
  const double have = physical_memory();
  for (const CaseSpec& c : cases) {
    const std::vector<verify::HostNeed> needs =
        verify::host_needs(c, runs_on_cpu(c.backend), check);
    double total = 0;
    for (const verify::HostNeed& n : needs) total += n.bytes;
    if (have <= 0 || total <= have) continue;
    const std::string config = name_cases ? "config " + c.name + ": " : "";
    std::fprintf(stderr,
                 "raggedattn %s: %sthe problem needs at least %s (%.0f bytes) of host memory; "
                 "this machine has %s\n",
                 command_name(cmd), config.c_str(), verify::size_str(total).c_str(), total,
                 verify::size_str(have).c_str());
    for (const verify::HostNeed& n : needs) {
      std::fprintf(stderr, "  %10s  %s\n", verify::size_str(n.bytes).c_str(), n.what.c_str());
    }
    std::fprintf(stderr, "  %s\n", hint);
    return false;
  }
  return true;
}

// Plans every case before running any: a problem the library rejects is a usage error (exit 2),
// reported with the library's own message before minutes are spent on the others. `paths` gets
// each case's path.
bool plans_ok(const std::vector<CaseSpec>& cases, bool name_cases, std::vector<Path>* paths) {
  for (const CaseSpec& c : cases) {
    const verify::PackLayout l = verify::make_layout(c, 0);
    Plan plan;
    const Status s = make_plan(verify::make_problem(c, l), query_device(), &plan);
    if (!s.ok()) {
      print_library_error(name_cases ? "config " + c.name + ": " : "", s);
      return false;
    }
    paths->push_back(plan.path());
  }
  return true;
}

// "device 0, NVIDIA H200, sm_90".
std::string device_str(const DeviceCaps& caps) {
  const std::string name = verify::device_name(caps.device);
  return "device " + std::to_string(caps.device) + (name.empty() ? "" : ", " + name) + ", sm_" +
         std::to_string(caps.cc_major) + std::to_string(caps.cc_minor);
}

// Why the cases run where they do: the backend was named, or what auto (or cuda, the best CUDA
// path) found.
std::string backend_reason(rattn_backend requested) {
  if (requested != RATTN_BACKEND_AUTO && requested != RATTN_BACKEND_CUDA) return "requested";
  if (!built_with_cuda()) return "auto: this build has no CUDA backends";
  const DeviceCaps caps = query_device();
  if (!caps.cuda) return "auto: no CUDA device found";
  return (requested == RATTN_BACKEND_AUTO ? "auto: " : "cuda: the best CUDA path for ") +
         device_str(caps);
}

// "backend: cpu (auto: no CUDA device found)": the paths the plans chose, with each one's count of
// cases where they differ (a path may lack some cases' head dims), and why.
std::string backend_line(rattn_backend requested, const std::vector<Path>& paths) {
  std::vector<std::pair<Path, int>> counts;
  for (Path p : paths) {
    auto it =
        std::find_if(counts.begin(), counts.end(), [p](const auto& c) { return c.first == p; });
    if (it == counts.end()) {
      counts.emplace_back(p, 1);
    } else {
      ++it->second;
    }
  }
  std::string line;
  for (const auto& [path, n] : counts) {
    line += (line.empty() ? "" : ", ") + std::string(path_name(path));
    if (counts.size() > 1) line += " for " + std::to_string(n) + (n == 1 ? " case" : " cases");
  }
  return "backend: " + (line.empty() ? "none" : line) + " (" + backend_reason(requested) + ")";
}

// The header: the version line (scripts read its seed) and the backend line.
void print_header(const Options& o, const std::vector<Path>& paths) {
  std::printf("raggedattn %s (%s build), seed %" PRIu64 "\n", rattn_version(),
              built_with_cuda() ? "CUDA" : "CPU-only", o.seed);
  std::printf("%s\n", backend_line(o.spec.backend, paths).c_str());
}

// What every command that runs cases takes from its command line: the seed and the deadline.
verify::RunOptions run_options(const Options& o) {
  verify::RunOptions run;
  run.seed = o.seed;
  if (o.deadline_s >= 0) run.hang_seconds = o.deadline_s;
  return run;
}

// run_case's progress reports, to `progress` where it reports at all.
void report_to(Progress& progress, verify::RunOptions* run) {
  if (!progress.on()) return;
  run->progress = [&progress](const std::string& phase, int64_t done, int64_t total) {
    progress.update(phase, done, total);
  };
}

int cmd_check(const Options& o) {
  std::vector<CaseSpec> suite = verify::named_suite(o.spec.hq, o.spec.hkv);
  if (o.list) {
    for (const CaseSpec& c : suite) {
      std::printf("%-24s %s Hq=%d Hkv=%d D=%d/%d, %s%s\n", c.name.c_str(),
                  verify::segments_str(c).c_str(), c.hq, c.hkv, c.dqk, c.dv,
                  verify::mask_str(c).c_str(), c.padded ? ", padded THD" : "");
    }
    return 0;
  }
  std::vector<CaseSpec> cases;
  if (!o.config.empty()) {
    for (const CaseSpec& c : suite) {
      if (c.name == o.config) cases.push_back(c);
    }
    if (cases.empty()) {
      std::string names;
      for (const CaseSpec& c : suite) names += (names.empty() ? "" : ", ") + c.name;
      throw UsageError("--config: no configuration named '" + o.config + "'; known: " + names);
    }
  } else if (o.random == 0) {
    cases = suite;
  }
  const bool cpu = runs_on_cpu(o.spec.backend);
  for (int32_t i = 0; i < o.random; ++i) {
    verify::RandomLimits lim;
    lim.heads_q = o.spec.hq;
    lim.max_total = cpu ? 384 : 1024;
    lim.dtype = o.spec.dtype;
    lim.backend = o.spec.backend;
    if (o.spec.backend == RATTN_BACKEND_CUDA_SM90) {  // the Hopper path's head dims only
      lim.takes_dims = [](int dqk, int dv) { return sm90::path_supports(dqk, dv); };
    }
    cases.push_back(verify::random_case(verify::mix_seed(o.seed, uint64_t(i)), lim));
  }
  for (CaseSpec& c : cases) {
    // The options of the command line apply to every case; shapes stay the suite's.
    c.dtype = o.spec.dtype;
    c.dq_accum = o.spec.dq_accum;
    c.deterministic = o.spec.deterministic;
    c.backend = o.spec.backend;
    // Added to what the case has: its own sinks stay where the flags are not given.
    c.sink = c.sink || o.spec.sink;
    c.lse_grad = c.lse_grad || o.spec.lse_grad;
  }
  // The whole suite on a path that takes only some shapes (cuda_sm90: the head dims it has a
  // kernel for in either direction): the configurations whose head dims it lacks are listed as
  // skipped, with the library's reason, and the rest run.
  // One named config, or a path that takes every shape, still fails on a rejection.
  std::vector<std::string> skipped;
  if (o.config.empty() && o.random == 0 && o.spec.backend == RATTN_BACKEND_CUDA_SM90) {
    std::vector<CaseSpec> taken;
    for (const CaseSpec& c : cases) {
      Plan plan;
      const Status s =
          make_plan(verify::make_problem(c, verify::make_layout(c, 0)), query_device(), &plan);
      const bool hopper_dims = sm90::path_supports(c.dqk, c.dv);
      if (s.code() == RATTN_ERROR_NOT_SUPPORTED && !hopper_dims) {
        skipped.push_back(c.name + ": " + s.message());
      } else {
        taken.push_back(c);
      }
    }
    cases.swap(taken);
  }
  if (!fits_in_memory(cases, Command::Check, /*check=*/true, /*name_cases=*/true,
                      "use fewer heads (--heads)")) {
    return kExitUsage;
  }
  std::vector<Path> paths;
  if (!plans_ok(cases, /*name_cases=*/true, &paths)) return kExitUsage;

  print_header(o, paths);
  for (const std::string& why : skipped) std::printf("skipped %s\n", why.c_str());
  std::fflush(stdout);  // the header before the progress on stderr, where both go to one log
  verify::RunOptions run = run_options(o);
  Progress progress(o.progress);
  report_to(progress, &run);
  std::vector<CaseReport> reports;
  for (size_t i = 0; i < cases.size(); ++i) {
    const CaseSpec& c = cases[i];
    progress.set_task("case " + std::to_string(i + 1) + "/" + std::to_string(cases.size()) + " " +
                      c.name);
    reports.push_back(verify::run_case(c, run));
    progress.clear();
    verify::print_case(std::cout, reports.back());
    std::cout << "\n";
    std::cout.flush();
  }
  std::cout << "summary:\n";
  for (const CaseReport& r : reports) verify::print_summary(std::cout, r);
  if (verify::print_verdict(std::cout, reports)) return 0;
  // Every case's data derives from the run's seed: the same command with it draws them again.
  std::printf("the same data again: this command with --seed %" PRIu64 "\n", o.seed);
  return kExitFail;
}

using verify::Sensed;
using verify::sensed;

std::string sensed_str(const Sensed& s) {
  char buf[200];
  std::snprintf(buf, sizeof(buf),
                "%d MHz (%d-%d), %.0f W%s (%.2f pJ/FLOP), held down in %.0f%% of samples%s%s%s",
                s.mhz, s.mhz_min, s.mhz_max, s.watts, s.instant_watts ? "" : " (1 s average)",
                s.pj_per_flop, 100 * s.throttled, s.reasons ? " (" : "",
                verify::slowdown_names(s.reasons).c_str(), s.reasons ? ")" : "");
  return buf;
}

void print_times(const CaseSpec& spec, const CaseReport& r) {
  const double ff = verify::forward_flops(spec), bf = verify::backward_flops(spec);
  auto tflops = [](double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; };
  std::printf("forward  %10.4f ms  %8.2f TFLOP/s\n", r.fwd_ms, tflops(ff, r.fwd_ms));
  std::printf("backward %10.4f ms  %8.2f TFLOP/s\n", r.bwd_ms, tflops(bf, r.bwd_ms));
  const std::string how =
      !r.timed_runs ? std::string("one run, wall clock")
      : r.fwd_call_ms.size() == r.bwd_call_ms.size()
          ? "median of " + std::to_string(r.fwd_call_ms.size()) + " runs after warm-up"
          : "median of " + std::to_string(r.fwd_call_ms.size()) + " forward and " +
                std::to_string(r.bwd_call_ms.size()) + " backward runs after warm-up";
  std::printf("(%s; %" PRId64 " visible pairs, %.4g fwd FLOP, %.4g bwd FLOP)\n", how.c_str(),
              verify::visible_pairs(spec), ff, bf);
  if (!r.fwd_readings.empty() || !r.bwd_readings.empty()) {
    std::printf("GPU while timed (median, min-max):\n  forward  %s\n  backward %s\n",
                sensed_str(sensed(r.fwd_readings, ff, r.fwd_ms)).c_str(),
                sensed_str(sensed(r.bwd_readings, bf, r.bwd_ms)).c_str());
  }
}

int cmd_run(const Options& o, bool bench) {
  const bool cpu = runs_on_cpu(o.spec.backend);
  verify::RunOptions run = run_options(o);
  run.check = !bench && !o.no_check;
  if (!fits_in_memory({o.spec}, bench ? Command::Bench : Command::Run, run.check,
                      /*name_cases=*/false,
                      run.check ? "use fewer tokens or heads, or --no-check to skip the check"
                                : "use fewer tokens or heads")) {
    return kExitUsage;
  }
  std::vector<Path> paths;
  if (!plans_ok({o.spec}, /*name_cases=*/false, &paths)) return kExitUsage;
  // CUDA: cudaEvent medians after a warm-up. CPU: the reference is slow; one wall-clock run
  // unless repeats are asked for.
  run.timing_runs = o.repeat > 0 ? o.repeat : (cpu ? (bench ? 3 : 0) : (bench ? 20 : 10));
  run.pause_ms = o.pause_ms;
  run.warmup_ms = o.warmup_ms;
  run.min_timed_ms = o.min_ms;
  run.l2_flush_bytes = size_t(o.l2_flush_mb) << 20;
  print_header(o, paths);
  std::fflush(stdout);  // the header before the progress on stderr, where both go to one log
  Progress progress(o.progress);
  report_to(progress, &run);
  const CaseReport r = verify::run_case(o.spec, run);
  progress.clear();
  if (run.check) {
    verify::print_case(std::cout, r);
  } else {
    verify::print_summary(std::cout, r);
  }
  if (r.status != RATTN_SUCCESS) {
    std::printf("FAIL\n");
    return kExitFail;
  }
  print_times(o.spec, r);
  if (bench && !o.json.empty()) {
    std::ofstream f(o.json);
    const double ff = verify::forward_flops(o.spec), bf = verify::backward_flops(o.spec);
    f << "{\n  \"path\": \"" << r.path << "\",\n  \"segments\": \"" << verify::segments_str(o.spec)
      << "\",\n  \"heads_q\": " << o.spec.hq << ",\n  \"heads_kv\": " << o.spec.hkv
      << ",\n  \"dim_qk\": " << o.spec.dqk << ",\n  \"dim_v\": " << o.spec.dv
      << ",\n  \"dtype\": \"" << verify::dtype_str(o.spec.dtype) << "\",\n  \"mask\": \""
      << verify::mask_str(o.spec) << "\",\n  \"sink\": " << (o.spec.sink ? "true" : "false")
      << ",\n  \"lse_grad\": " << (o.spec.lse_grad ? "true" : "false")
      << ",\n  \"repeat\": " << r.timed_runs << ",\n  \"fwd_ms\": " << r.fwd_ms
      << ",\n  \"bwd_ms\": " << r.bwd_ms << ",\n  \"fwd_flops\": " << ff
      << ",\n  \"bwd_flops\": " << bf
      << ",\n  \"fwd_tflops\": " << (r.fwd_ms > 0 ? ff / r.fwd_ms * 1e-9 : 0.0)
      << ",\n  \"bwd_tflops\": " << (r.bwd_ms > 0 ? bf / r.bwd_ms * 1e-9 : 0.0)
      << ",\n  \"pause_ms\": " << o.pause_ms << ",\n  \"warmup_ms\": " << o.warmup_ms
      << ",\n  \"min_ms\": " << o.min_ms << ",\n  \"l2_flush_mb\": " << o.l2_flush_mb
      << ",\n  \"fwd_calls\": " << r.fwd_call_ms.size()
      << ",\n  \"bwd_calls\": " << r.bwd_call_ms.size();
    // A JSON list of n values, value(i) each.
    auto list = [&f](const std::string& key, size_t n, const auto& value) {
      f << ",\n  \"" << key << "\": [";
      for (size_t i = 0; i < n; ++i) f << (i ? ", " : "") << value(i);
      f << "]";
    };
    struct Direction {
      const char* name;
      const std::vector<double>* call_ms;
      const std::vector<verify::GpuReading>* readings;
      double flops, ms;
    };
    for (const Direction& d : {Direction{"fwd", &r.fwd_call_ms, &r.fwd_readings, ff, r.fwd_ms},
                               Direction{"bwd", &r.bwd_call_ms, &r.bwd_readings, bf, r.bwd_ms}}) {
      const std::string dir = d.name;
      list(dir + "_call_ms", d.call_ms->size(), [&](size_t i) { return (*d.call_ms)[i]; });
      // The GPU's SM clock and power sampled while the timed calls ran, where NVML could read
      // them.
      const std::vector<verify::GpuReading>& rs = *d.readings;
      if (rs.empty()) continue;
      const Sensed s = sensed(rs, d.flops, d.ms);
      f << ",\n  \"" << dir << "_sm_mhz\": " << s.mhz << ",\n  \"" << dir << "_watts\": " << s.watts
        << ",\n  \"" << dir << "_pj_per_flop\": " << s.pj_per_flop << ",\n  \"" << dir
        << "_watts_instant\": " << (s.instant_watts ? "true" : "false") << ",\n  \"" << dir
        << "_throttled\": " << s.throttled << ",\n  \"" << dir << "_throttle_reasons\": \""
        << verify::slowdown_names(s.reasons) << "\"";
      list(dir + "_sm_mhz_samples", rs.size(), [&](size_t i) { return rs[i].sm_mhz; });
      list(dir + "_watts_samples", rs.size(), [&](size_t i) { return rs[i].watts; });
      list(dir + "_slowdown_samples", rs.size(), [&](size_t i) { return rs[i].slowdown; });
    }
    f << "\n}\n";
    if (!f) {
      std::fprintf(stderr, "raggedattn: --json: cannot write '%s'\n", o.json.c_str());
      return kExitUsage;
    }
    std::printf("wrote %s\n", o.json.c_str());
  }
  if (!run.check) return 0;
  std::printf("%s\n", r.pass ? "PASS" : "FAIL");
  return r.pass ? 0 : kExitFail;
}

int cmd_info(const Options& o) {
  std::printf("raggedattn %s\nbuild: %s\n", rattn_version(),
              !built_with_cuda()              ? "CPU-only (cpu)"
              : path_in_build(Path::CudaSm90) ? "CUDA backends (cuda_sm90, cuda_portable) and cpu"
                                              : "CUDA backends (cuda_portable) and cpu");
  const DeviceCaps caps = query_device();
  if (caps.cuda) {
    std::printf("device %d: compute capability %d.%d, %d SMs, %" PRId64
                " bytes shared memory per block (opt-in), %" PRId64 " bytes L2\n",
                caps.device, caps.cc_major, caps.cc_minor, caps.num_sms, caps.smem_per_block_optin,
                caps.l2_bytes);
  } else {
    std::printf("device: none usable%s\n", built_with_cuda() ? "" : " (no CUDA in this build)");
  }
  const CaseSpec& s = o.spec;
  std::printf("problem: %s Hq=%d Hkv=%d D=%d/%d %s, %s%s, backend %s\n",
              verify::segments_str(s).c_str(), s.hq, s.hkv, s.dqk, s.dv, verify::dtype_str(s.dtype),
              verify::mask_str(s).c_str(), s.padded ? ", padded" : "",
              verify::backend_str(s.backend));
  Plan plan;
  const Status st = make_plan(verify::make_problem(s, verify::make_layout(s, 0)), caps, &plan);
  if (!st.ok()) {
    print_library_error("", st);
    return kExitUsage;
  }
  std::printf("plan: %s\nworkspace: forward %zu bytes, backward %zu bytes\n",
              plan.describe().c_str(), plan.workspace_bytes(Direction::Forward),
              plan.workspace_bytes(Direction::Backward));
  // The dQ scratch of each slot scheme for this problem (fp32 elements), beside the plan's own.
  const Problem& pr = plan.problem();
  for (DqSlotScheme scheme : {DqSlotScheme::Compact, DqSlotScheme::PaddedBatch}) {
    const DqAccumLayout l =
        make_dq_accum_layout(scheme, AccumType::F32, 1, pr.batch, pr.num_heads_q, pr.head_dim_qk,
                             pr.total_q, pr.max_seqlen_q, portable::kDqAccumAlign);
    std::printf("dQ scratch, %s slots: %" PRId64 " rows per head, %" PRId64 " bytes (fp32)\n",
                scheme == DqSlotScheme::Compact ? "compact" : "padded-batch",
                l.rows * (scheme == DqSlotScheme::PaddedBatch ? pr.batch : 1), l.bytes());
  }
  return 0;
}

// One command's part of kUsage (its line and the option lines under it), for `COMMAND --help`;
// empty for a name that is not a command.
std::string command_help(const std::string& cmd) {
  const std::string text = kUsage, head = "\n  " + cmd + " ";
  const size_t begin = text.find(head);
  if (!find_command(cmd) || begin == std::string::npos) return "";
  size_t end = begin + 1;
  // The block ends at the next command's line ("  name ...") or the blank line after the last.
  while (true) {
    end = text.find('\n', end);
    if (end == std::string::npos || end + 1 >= text.size() || text[end + 1] == '\n' ||
        (text.compare(end + 1, 2, "  ") == 0 && text[end + 3] != ' ')) {
      break;
    }
    ++end;
  }
  return "usage: raggedattn " + cmd + " [options]\n\n" + text.substr(begin + 1, end - begin) +
         "\n" + text.substr(text.find("exit status:"));
}

int main_impl(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kExitUsage;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::string help = command_help(cmd);
  for (int i = 2; i < argc && !help.empty(); ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::fputs(help.c_str(), stdout);
      return 0;
    }
  }
  try {
    Args args(argc, argv, 2);
    const Command* command = find_command(cmd);
    if (!command) {
      std::string known;
      for (const auto& entry : kCommands) {
        known += (known.empty() ? "" : ", ") + std::string(entry.first);
      }
      throw UsageError("unknown command '" + cmd + "'; expected one of " + known);
    }
    switch (*command) {
      case Command::Check:
        return cmd_check(parse(*command, args));
      case Command::Run:
        return cmd_run(parse(*command, args), /*bench=*/false);
      case Command::Bench:
        return cmd_run(parse(*command, args), /*bench=*/true);
      case Command::Info:
        return cmd_info(parse(*command, args));
    }
    return kExitUsage;  // every Command is a case above
  } catch (const UsageError& e) {
    std::fprintf(stderr, "raggedattn: %s\n", e.what());
    return kExitUsage;
  } catch (const verify::HostAllocError& e) {
    // What fits_in_memory's estimate leaves out (or a limit below the machine's memory, ulimit -v)
    // still ends as an error, not an abort.
    std::fprintf(stderr, "raggedattn %s: %s; use fewer tokens or heads\n", cmd.c_str(), e.what());
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "raggedattn %s: out of host memory (std::bad_alloc); use fewer tokens or heads\n",
                 cmd.c_str());
    return kExitUsage;
  }
}

}  // namespace
}  // namespace cli
}  // namespace raggedattn

int main(int argc, char** argv) {
  return raggedattn::cli::main_impl(argc, argv);
}

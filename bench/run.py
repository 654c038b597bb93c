#!/usr/bin/env python3
"""Side-by-side benchmark: raggedattn and the anchors on the standard workloads, in one run.

    python3 bench/run.py --cli build/tools/raggedattn --anchors DIR --out bench/results

DIR holds the anchor scripts (anchors_torch.py, anchors_jax.py: PyTorch FA2 varlen, FlexAttention,
dense SDPA; cuDNN through JAX on the packed layout; anchors_fa3_jax.py: FlashAttention-3 varlen
through the flash-attn3-jax wheel, where it is importable). Every number of one report comes from the same
run on the same GPU. Writes latest.json ({workload: {implementation: {fwd_tflops, bwd_tflops}}}),
latest.md (a table) and latest.png (a chart) under --out.

Our processes time in the torch anchors' regime by default, triton.testing.do_bench's (the JAX
anchors time 30 calls after 3 warm-up calls, wall clock): warm-up calls for 50 ms, then timed
calls for at least 200 ms, each after 256 MiB are zeroed (untimed), the median reported. The GPU's
clock falls under sustained load, so a shorter regime (--warmup-ms 0 --min-ms 0 --l2-flush-mb 0:
one warm-up call and --repeat timed calls, the tables before 2026-12-01) measures a faster GPU
than the anchors had: up to 13% on one_doc_16k's forward (docs/PERFORMANCE.md item 60).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from workloads import D, HKV, HQ, WORKLOADS, bwd_flops, fwd_flops  # noqa: E402

# Anchor names in the anchor scripts' JSON -> names in our report.
ANCHOR_KEYS = {
    "fa2_varlen": "torch_fa2_varlen",
    "flex": "torch_flex",
    "sdpa_flash": "torch_sdpa_flash",
    "sdpa_cudnn": "torch_sdpa_cudnn",
    "sdpa_efficient": "torch_sdpa_efficient",
    "cudnn_thd": "jax_cudnn_thd",
    "jaxnn_cudnn_dense": "jax_cudnn_dense",
    "fa3_varlen": "jax_fa3_varlen",
}


# What `raggedattn bench --json` reports of the GPU while each direction's timed calls ran, sampled
# in-process through NVML about every millisecond (absent where NVML is not there): the median SM
# clock and power per direction. They tell a slower GPU from a slower kernel (the same kernels measure
# up to 9% apart from one process to the next, and a backward right after a slower forward ran
# 7-9% faster: PERFORMANCE.md item 58).
# fwd/bwd_throttled: the share of samples whose clock was held down by power or temperature;
# fwd/bwd_pj_per_flop: the board's energy per FLOP (median power x median call time / FLOPs).
GPU_KEYS = ("fwd_sm_mhz", "bwd_sm_mhz", "fwd_watts", "bwd_watts", "fwd_throttled",
            "bwd_throttled", "fwd_pj_per_flop", "bwd_pj_per_flop")


def bench_command(cli, lens, causal, variant_args, repeat, json_path, pause_ms=0, warmup_ms=0,
                  min_ms=0, l2_flush_mb=0, dims=(D, D)):
    """The `raggedattn bench` command of one process (run_ours's arguments; dims: (Dqk, Dv))."""
    dqk, dv = dims
    cmd = [cli, "bench", "--segments", ",".join(map(str, lens)), "--heads", f"{HQ}/{HKV}",
           "--dim", str(dqk), "--dtype", "bf16", "--repeat", str(repeat), "--json", json_path]
    cmd += ["--dim-v", str(dv)] if dv != dqk else []
    cmd += ["--causal"] if causal else []
    cmd += ["--pause-ms", str(pause_ms)] if pause_ms else []
    cmd += ["--warmup-ms", str(warmup_ms)] if warmup_ms else []
    cmd += ["--min-ms", str(min_ms)] if min_ms else []
    cmd += ["--l2-flush-mb", str(l2_flush_mb)] if l2_flush_mb else []
    return cmd + list(variant_args)


def run_ours(cli, lens, causal, variant_args, repeat, env=None, pause_ms=0, warmup_ms=0,
             min_ms=0, l2_flush_mb=0, dims=(D, D)):
    """One process of `raggedattn bench`: its times and rates, and the GPU's clock and power while
    each direction ran (GPU_KEYS). pause_ms: idle time before each direction's warm-up;
    warmup_ms, min_ms, l2_flush_mb: do_bench's regime (warm-up calls for warmup_ms, timed calls
    for min_ms, l2_flush_mb MiB zeroed before each call); dims: (Dqk, Dv), the workloads' D by
    default."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = bench_command(cli, lens, causal, variant_args, repeat, out, pause_ms, warmup_ms,
                            min_ms, l2_flush_mb, dims)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            return {"error": (proc.stdout + proc.stderr)[-400:]}
        with open(out) as f:
            res = json.load(f)
    return result_from_bench(res, lens, causal, dims)


def result_from_bench(res, lens, causal, dims=(D, D)):
    """A variant's result from one `raggedattn bench --json` report. FLOPs as the command counts
    them: 2 (Dqk + Dv) Hq per visible pair forward, i.e. workloads.py's 4 d Hq with d their mean."""
    fwd_ms, bwd_ms = float(res["fwd_ms"]), float(res["bwd_ms"])
    d = (dims[0] + dims[1]) / 2
    r = {"fwd_ms": fwd_ms, "bwd_ms": bwd_ms,
         "fwd_tflops": fwd_flops(lens, causal, HQ, d) / fwd_ms / 1e9,
         "bwd_tflops": bwd_flops(lens, causal, HQ, d) / bwd_ms / 1e9,
         "path": res.get("path", "")}
    r.update({k: res[k] for k in GPU_KEYS + ("fwd_calls", "bwd_calls") if k in res})
    return r


def lib_builds(ap, cli, specs):
    """This build, then each --lib TAG=DIR build, as (tag, env, command) triples: the command loads
    libraggedattn.so from LD_LIBRARY_PATH first. DIR may be a whole staged build
    (scripts/stage_build.sh without --lib-only), which keeps the library under src/; where it also
    holds tools/raggedattn, that build's own command runs it (a command and a library of
    different commits need not agree on the layout of the structs they share)."""
    builds = [("", None, cli)]
    for spec in specs:
        tag, _, path = spec.partition("=")
        own_cli = os.path.join(path, "tools", "raggedattn")
        if not os.path.isfile(os.path.join(path, "libraggedattn.so")) and os.path.isfile(
                os.path.join(path, "src", "libraggedattn.so")):
            path = os.path.join(path, "src")
        if not os.path.isfile(os.path.join(path, "libraggedattn.so")):
            # Without the library there, the loader would fall back to this build's copy and the
            # comparison would silently measure the same library twice.
            ap.error(f"--lib {spec}: {path} holds no libraggedattn.so")
        builds.append((tag, dict(os.environ, LD_LIBRARY_PATH=os.path.abspath(path)),
                       own_cli if os.path.isfile(own_cli) else cli))
    return builds


def combine_runs(runs):
    """One result from several processes' runs of the same variant: the median of each direction's
    time (a process's own median of --repeat calls each). The first error wins; the per-process
    times stay in the result (fwd_ms_runs, bwd_ms_runs)."""
    for r in runs:
        if "error" in r:
            return r
    if len(runs) == 1:
        return runs[0]

    def median(xs):
        xs = sorted(xs)
        mid = len(xs) // 2
        return xs[mid] if len(xs) % 2 else 0.5 * (xs[mid - 1] + xs[mid])

    out = dict(runs[0])
    for k in GPU_KEYS:  # each process's median clock and power, where every process read them
        if all(k in r for r in runs):
            out[f"{k}_runs"] = [r[k] for r in runs]
    for d in ("fwd", "bwd"):
        times = [r[f"{d}_ms"] for r in runs]
        out[f"{d}_ms"] = median(times)
        out[f"{d}_ms_runs"] = times
        # TFLOP/s scale as 1 / time: the same FLOPs over the combined time.
        out[f"{d}_tflops"] = runs[0][f"{d}_tflops"] * runs[0][f"{d}_ms"] / out[f"{d}_ms"]
    return out


def run_anchor(script, timeout):
    with tempfile.TemporaryDirectory() as tmp:
        # The anchors import workloads.py from their own folder; this folder's copy goes on the
        # path after it, so anchor scripts copied alone (to a GPU machine) still find it.
        path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), HERE) if p)
        env = dict(os.environ, OUT=tmp, PYTHONUNBUFFERED="1", PYTHONPATH=path)
        r = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                           timeout=timeout)
        outs = [f for f in os.listdir(tmp) if f.endswith(".json")]
        if not outs:
            print(f"anchor {script} wrote nothing:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
            return {}
        with open(os.path.join(tmp, outs[0])) as f:
            return json.load(f)


def add_timing_args(ap):
    """The options of how our processes time (run.py and sweep.py): by default the PyTorch anchors'
    regime, triton.testing.do_bench's (module docstring)."""
    ap.add_argument("--repeat", type=int, default=10,
                    help="timed calls per direction at least (more where --min-ms asks)")
    ap.add_argument("--pause-ms", type=int, default=0,
                    help="idle milliseconds before each direction's warm-up in our processes "
                         "(raggedattn bench --pause-ms), so a direction's time does not depend on "
                         "what ran just before it")
    ap.add_argument("--warmup-ms", type=int, default=50,
                    help="warm-up calls for this long before the timed ones (the defaults of "
                         "this and the next two are triton.testing.do_bench's, the anchors' "
                         "regime; 0 0 0: one warm-up call and --repeat timed calls)")
    ap.add_argument("--min-ms", type=int, default=200,
                    help="timed calls until they have run this long")
    ap.add_argument("--l2-flush-mb", type=int, default=256,
                    help="MiB zeroed before each call, untimed, so no call finds the previous "
                         "one's data in L2")


def timing_kwargs(args):
    """run_ours's keyword arguments from add_timing_args's options."""
    return dict(pause_ms=args.pause_ms, warmup_ms=args.warmup_ms, min_ms=args.min_ms,
                l2_flush_mb=args.l2_flush_mb)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cli", default="build/tools/raggedattn")
    ap.add_argument("--anchors", help="folder with anchors_torch.py and anchors_jax.py")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--processes", type=int, default=1,
                    help="run each of our variants in this many processes (every build and "
                         "variant once per round, rounds one after the other) and report the "
                         "median time: one process's number can sit in one of two modes")
    add_timing_args(ap)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--no-anchors", action="store_true")
    ap.add_argument("--variants", help="comma-separated subset of our variants (default: all but "
                    "raggedattn_sink, raggedattn_sink_lse_grad and raggedattn_det, which run "
                    "only where named)")
    ap.add_argument("--lib", action="append", default=[], metavar="TAG=DIR",
                    help="also measure the variants with the library in DIR or DIR/src (another "
                         "build of libraggedattn.so, e.g. a branch's), named <variant>_<TAG>; "
                         "repeatable")
    args = ap.parse_args()
    if args.processes < 1 or args.repeat < 1:
        ap.error(f"--processes and --repeat take a count >= 1; given {args.processes} and "
                 f"{args.repeat}")
    os.makedirs(args.out, exist_ok=True)

    names = args.workloads.split(",")
    builds = lib_builds(ap, args.cli, args.lib)
    # The library's default (the best CUDA path: the Hopper path where it takes the problem), its
    # 16-bit dQ scratch, and the portable path forced, so both paths are measured each run.
    # The Hopper path forced as well, so it is measured also where auto takes the portable one.
    variants = {"raggedattn": [], "raggedattn_dq_bf16": ["--dq-accum", "bf16"],
                "raggedattn_portable": ["--backend", "cuda_portable"],
                "raggedattn_sm90": ["--backend", "cuda_sm90"]}
    # Measured only where --variants names them: the cost of sinks (and of an LSE cotangent), or
    # of the deterministic backward, is read against the default variant in the same run.
    optional = {"raggedattn_sink": ["--sink"], "raggedattn_sink_lse_grad": ["--sink", "--lse-grad"],
                "raggedattn_det": ["--deterministic"]}
    if args.variants:
        chosen = args.variants.split(",")
        variants = {k: v for k, v in {**variants, **optional}.items() if k in chosen}
    report = {"date": datetime.date.today().isoformat(), "workloads": {},
              "meta": {"regime": regime_str(args)}}
    try:  # the GPU's name, also when no anchor runs (they report it too)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        report["meta"]["gpu"] = smi.stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        pass
    for name in names:
        lens, causal = WORKLOADS[name]
        runs = {}
        for _ in range(args.processes):
            for tag, env, cli in builds:
                for impl, extra in variants.items():
                    key = impl + (f"_{tag}" if tag else "")
                    r = run_ours(cli, lens, causal, extra, args.repeat, env,
                                 **timing_kwargs(args))
                    runs.setdefault(key, []).append(r)
                    print(name, key, json.dumps(r), flush=True)
        report["workloads"][name] = {key: combine_runs(rs) for key, rs in runs.items()}

    if not args.no_anchors and args.anchors:
        # FlashAttention-3 runs where its wheel (flash-attn3-jax) is importable: the anchors
        # folder's README says how to bring it to a GPU machine.
        for script in ("anchors_torch.py", "anchors_jax.py", "anchors_fa3_jax.py"):
            if not os.path.exists(os.path.join(args.anchors, script)):
                print(f"anchor {script}: not in {args.anchors}, skipped")
                continue
            data = run_anchor(os.path.join(args.anchors, script), timeout=900)
            for k in ("torch", "cudnn", "jax", "gpu", "matmul_tflops", "copy_TBps"):
                if k in data:
                    report["meta"][k] = data[k]
            for name, res in data.get("workloads", {}).items():
                if name not in report["workloads"]:
                    continue
                for key, val in res.items():
                    if key in ANCHOR_KEYS and isinstance(val, dict):
                        report["workloads"][name][ANCHOR_KEYS[key]] = val

    with open(os.path.join(args.out, "latest.json"), "w") as f:
        json.dump(report, f, indent=1)
    md = table(report)
    with open(os.path.join(args.out, "latest.md"), "w") as f:
        f.write(md)
    print(md)
    try:
        chart(report, os.path.join(args.out, "latest.png"))
    except Exception as e:  # matplotlib missing: the table and JSON are the results
        print("chart skipped:", e)


def regime_str(args):
    """How our processes timed, for the report: do_bench's regime or the short one."""
    s = (f"warm-up {args.warmup_ms} ms, timed >= {args.min_ms} ms and >= {args.repeat} calls"
         if args.warmup_ms or args.min_ms else f"1 warm-up call, {args.repeat} timed calls")
    s += f", {args.l2_flush_mb} MiB zeroed before each call" if args.l2_flush_mb else ""
    s += f", {args.pause_ms} ms idle before each direction" if args.pause_ms else ""
    return s


def timed(r, d):
    """Whether direction d of result r holds a time: an anchor that derives its backward's time as
    a difference of wall-clock times (the JAX anchors: (forward + backward) - forward) can report a
    time <= 0 on tiny workloads, whose rate is no measurement."""
    ms = r.get(f"{d}_ms")
    return f"{d}_tflops" in r and (ms is None or ms > 0)


def rate_cell(r, d):
    """A direction's TFLOP/s for the table: the median, and where several processes ran the
    variant (--processes), their range after it, so a table shows the spread between processes
    that one process's median cannot; "n/a" where the result holds no time (timed)."""
    if not timed(r, d):
        return "n/a"
    cell = f"{r[f'{d}_tflops']:.0f}"
    runs = r.get(f"{d}_ms_runs")
    if runs and len(runs) > 1:
        rate_ms = r[f"{d}_tflops"] * r[f"{d}_ms"]  # TFLOP/s times ms: the same for every run
        cell += f" ({rate_ms / max(runs):.0f}–{rate_ms / min(runs):.0f})"
    return cell


def table(report):
    impls = []
    for row in report["workloads"].values():
        for impl in row:
            if impl not in impls:
                impls.append(impl)
    meta = report.get("meta", {})
    lines = [f"Date {report['date']}, GPU {meta.get('gpu', '?')}, torch {meta.get('torch', '?')}, "
             f"jax {meta.get('jax', '?')}; bf16, Hq={HQ}, Hkv={HKV}, D={D}; TFLOP/s fwd / bwd.",
             f"raggedattn timed: {meta.get('regime', '?')}. Torch anchors: do_bench (warm-up 50 ms, "
             "timed 200 ms, 256 MiB zeroed before each call); JAX anchors: 3 warm-up and 30 timed "
             "calls, wall clock.", "",
             "| workload | " + " | ".join(impls) + " |", "|---" * (len(impls) + 1) + "|"]
    untimed = False  # a cell shows n/a (rate_cell)
    for name, row in report["workloads"].items():
        cells = []
        for impl in impls:
            r = row.get(impl)
            if not r:
                cells.append("")
            elif "error" in r:
                cells.append("error")
            else:
                cells.append(f"{rate_cell(r, 'fwd')} / {rate_cell(r, 'bwd')}")
                untimed = untimed or not (timed(r, "fwd") and timed(r, "bwd"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if untimed:
        lines += ["", "n/a: the implementation reported a time <= 0 for that direction (the JAX "
                  "anchors take the backward's as a difference of wall-clock times)."]
    return "\n".join(lines) + "\n"


def chart(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(report["workloads"])
    impls = sorted({i for r in report["workloads"].values() for i, v in r.items() if "fwd_tflops" in v})
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    width = 0.8 / max(1, len(impls))
    for ax, key, title in ((axes[0], "fwd_tflops", "forward"), (axes[1], "bwd_tflops", "backward")):
        for n, impl in enumerate(impls):
            d = key.split("_")[0]
            vals = [r[key] if timed(r, d) else 0
                    for r in (report["workloads"][w].get(impl, {}) for w in names)]
            ax.bar([x + n * width for x in range(len(names))], vals, width, label=impl)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))])
        ax.set_xticklabels(names, rotation=20, fontsize=8)
        ax.set_ylabel("TFLOP/s")
        ax.set_title(title)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"raggedattn vs anchors, {report.get('meta', {}).get('gpu', '')}, {report['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What a PyTorch user's call costs: raggedattn through its torch binding on the standard workloads.

    python3 bench/binding.py --out DIR

Times, in the torch anchors' regime (triton.testing.do_bench, warm-up 50 ms, 200 ms of calls, the
median), per workload:
  - binding:        torch.ops.raggedattn.fwd and .bwd as raggedattn.torch calls them (outputs
                    allocated uninitialized; the library's zero_padding mode writes their padding);
  - binding_zeroed: the same calls preceded by torch.zeros of every output's shape, the cost the
                    binding paid when it zero-filled its outputs before each call;
  - torch_fa2_varlen: aten's FlashAttention-2 varlen in the same process, as the anchor script
                    calls it, so that the run's GPU speed is on the page.
FLOPs as in workloads.py. Writes binding.json and binding.md under --out. A timing, never a test.
"""
import argparse
import json
import os
import sys

import torch
from triton.testing import do_bench

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from workloads import D, HKV, HQ, WORKLOADS, bwd_flops, fwd_flops  # noqa: E402

import raggedattn.torch  # noqa: E402,F401  (registers torch.ops.raggedattn)


def ms(fn):
    return do_bench(fn, warmup=50, rep=200, return_mode="median")


def options(causal):
    # _fwd/_bwd's trailing arguments: causal, bottom_right, window_left, window_right, scale,
    # softcap, dq_accum_bf16, deterministic (raggedattn/torch.py, _options_from).
    return (causal, False, -1, -1, D ** -0.5, 0.0, False, False)


def measure(name, lens, causal):
    dev, dt = "cuda", torch.bfloat16
    total, mx = sum(lens), max(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), device=dev,
                      dtype=torch.int32)
    q = torch.randn(total, HQ, D, device=dev, dtype=dt)
    k = torch.randn(total, HKV, D, device=dev, dtype=dt)
    v = torch.randn(total, HKV, D, device=dev, dtype=dt)
    d_o = torch.randn(total, HQ, D, device=dev, dtype=dt)
    opts = options(causal)
    fwd = lambda: torch.ops.raggedattn.fwd(q, k, v, cu, cu, None, None, mx, mx, *opts)  # noqa
    o, lse = fwd()
    bwd = lambda: torch.ops.raggedattn.bwd(d_o, q, k, v, o, lse, cu, cu, None, None, mx, mx,  # noqa
                                           *opts)

    def fwd_zeroed():
        torch.zeros_like(o)
        torch.zeros_like(lse)
        return fwd()

    def bwd_zeroed():
        torch.zeros_like(q)
        torch.zeros_like(k)
        torch.zeros_like(v)
        return bwd()

    F, B = fwd_flops(lens, causal), bwd_flops(lens, causal)
    r = {}
    for impl, f, b in (("binding", fwd, bwd), ("binding_zeroed", fwd_zeroed, bwd_zeroed)):
        tf, tb = ms(f), ms(b)
        r[impl] = {"fwd_ms": tf, "bwd_ms": tb, "fwd_tflops": F / tf / 1e9,
                   "bwd_tflops": B / tb / 1e9}
    fa_f = lambda: torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, mx, mx, 0.0,  # noqa
                                                           causal, False)
    fo, flse, rng, unused, _ = fa_f()
    fa_b = lambda: torch.ops.aten._flash_attention_backward(d_o, q, k, v, fo, flse, cu, cu,  # noqa
                                                            mx, mx, 0.0, causal, rng, unused)
    tf, tb = ms(fa_f), ms(fa_b)
    r["torch_fa2_varlen"] = {"fwd_ms": tf, "bwd_ms": tb, "fwd_tflops": F / tf / 1e9,
                             "bwd_tflops": B / tb / 1e9}
    print(name, json.dumps(r), flush=True)
    return r


def table(report):
    impls = ("binding", "binding_zeroed", "torch_fa2_varlen")
    lines = [f"GPU: {report['gpu']}; torch {report['torch']}; fwd / bwd TFLOP/s (ms)", "",
             "| workload | " + " | ".join(impls) + " | zero-fill's cost fwd / bwd |",
             "|---|" + "---|" * (len(impls) + 1)]
    for name, r in report["workloads"].items():
        cells = [f"{r[i]['fwd_tflops']:.0f} / {r[i]['bwd_tflops']:.0f} "
                 f"({r[i]['fwd_ms']:.3f} / {r[i]['bwd_ms']:.3f})" for i in impls]
        a, z = r["binding"], r["binding_zeroed"]
        cost = (f"{100 * (z['fwd_ms'] / a['fwd_ms'] - 1):+.1f}% / "
                f"{100 * (z['bwd_ms'] / a['bwd_ms'] - 1):+.1f}%")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {cost} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--workloads", nargs="*", default=[w for w in WORKLOADS if w != "seed_cases"])
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "workloads": {}}
    for name in args.workloads:
        lens, causal = WORKLOADS[name]
        report["workloads"][name] = measure(name, lens, causal)
    with open(os.path.join(args.out, "binding.json"), "w") as f:
        json.dump(report, f, indent=1)
    md = table(report)
    with open(os.path.join(args.out, "binding.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()

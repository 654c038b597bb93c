#!/usr/bin/env python3
"""Trains a small llama-style decoder on packed documents, with raggedattn and with a reference
attention, from the same initialization and the same data order, and compares the loss curves.

    python3 examples/train_packed/train.py --device cuda --steps 400 --out results/
    python3 examples/train_packed/train.py --device cpu --steps 3 --batch-tokens 512   # smoke test

    python3 examples/train_packed/train.py --hf --device cuda             # transformers' Llama
    python3 examples/train_packed/train.py --sinks --runs reference,raggedattn   # with sinks

Runs (--runs): `reference` (SDPA per document), `raggedattn` (fp32 dQ scratch),
`raggedattn_dq_bf16` (16-bit dQ scratch) and, on request, `raggedattn_deterministic` (the same
kernel with ordered dQ additions: the noise floor of the comparison) and `raggedattn_dq_corrupt`
(the experiment of a broken dQ layout: every document past the first gets the first one's dQ).
With --hf: `hf_reference` (a transformers Llama of the same size through its sdpa attention, the
documents read from position_ids) and `hf_raggedattn` (the same model and batches through
attn_implementation="raggedattn", fed DataCollatorWithFlattening's keyword arguments).
`--sinks` gives every attention layer learnable per-head sinks (gpt-oss's): raggedattn's `sink`
argument in the raggedattn runs, a plain PyTorch softmax over the scores and the sink per document
in `reference`.
`--replot DIR` redraws DIR's table and chart from its results.json. Reports, per raggedattn run, the largest and the mean
absolute gap between its training loss and the reference's over all steps, and every run's loss
on held-out documents. Writes results.json, summary.md and curves.png under --out.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import VOCAB, fixed_batches, load_documents  # noqa: E402
from model import Decoder  # noqa: E402

RUNS = {
    "reference": dict(impl="reference", dq_accum="fp32"),
    "raggedattn": dict(impl="raggedattn", dq_accum="fp32"),
    "raggedattn_dq_bf16": dict(impl="raggedattn", dq_accum="bf16"),
    # Two correct kernels that differ only in the order of dQ's additions: the gap between this
    # run and `raggedattn` is the noise floor of the comparison (bf16 training amplifies rounding).
    "raggedattn_deterministic": dict(impl="raggedattn", dq_accum="fp32", deterministic=True),
    # The experiment of the historical bug: dQ of every document past the first replaced by the
    # first document's rows, as a scratch read with segment stride 0 would return.
    "raggedattn_dq_corrupt": dict(impl="raggedattn", dq_accum="fp32", corrupt_dq=True),
    # --hf: a transformers Llama of the same size, the packed batch as DataCollatorWithFlattening
    # gives it, through transformers' sdpa (the reference) or attn_implementation="raggedattn".
    "hf_reference": dict(hf="sdpa"),
    "hf_raggedattn": dict(hf="raggedattn"),
}
DEFAULT_RUNS = ["reference", "raggedattn", "raggedattn_dq_bf16"]
HF_RUNS = ["hf_reference", "hf_raggedattn"]


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def loss_of(model, batch, device, autocast):
    toks, tgts, cu, max_len, pos = batch
    toks, tgts, cu, pos = toks.to(device), tgts.to(device), cu.to(device), pos.to(device)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(toks, pos, cu, max_len)
    return F.cross_entropy(logits.float(), tgts, ignore_index=-100)


def train_one(name, args, train_batches, eval_batches, device):
    torch.manual_seed(args.seed)  # the same initialization for every run
    attn_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if "hf" in RUNS[name]:
        from hf_model import HFDecoder

        model = HFDecoder(VOCAB, dim=args.dim, layers=args.layers, n_heads=args.heads,
                          n_kv_heads=args.kv_heads, attention=RUNS[name]["hf"]).to(device)
    else:
        model = Decoder(VOCAB, dim=args.dim, layers=args.layers, n_heads=args.heads,
                        n_kv_heads=args.kv_heads, attn_dtype=attn_dtype, sinks=args.sinks,
                        **RUNS[name]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    autocast = device.type == "cuda"
    losses, t0 = [], time.time()
    for step, batch in enumerate(train_batches):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, len(train_batches), args.lr, args.warmup)
        loss = loss_of(model, batch, device, autocast)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % args.log_every == 0 or step == len(train_batches) - 1:
            print(f"{name:20s} step {step:5d} loss {losses[-1]:.4f} ({time.time() - t0:.0f} s)", flush=True)
    model.eval()
    with torch.no_grad():
        eval_loss = sum(loss_of(model, b, device, autocast).item() for b in eval_batches) / len(eval_batches)
    return {"train_loss": losses, "eval_loss": eval_loss, "seconds": time.time() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--runs", default=None,
                    help=f"comma-separated, of: {', '.join(RUNS)} (default: "
                         f"{','.join(DEFAULT_RUNS)}; with --hf: {','.join(HF_RUNS)})")
    ap.add_argument("--hf", action="store_true",
                    help="a transformers Llama through attn_implementation='raggedattn' against "
                         "transformers' sdpa on the same packed batches")
    ap.add_argument("--sinks", action="store_true",
                    help="learnable per-head attention sinks in every layer (the reference "
                         "computes them in plain PyTorch)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--out", default="train_packed_results")
    ap.add_argument("--replot", metavar="DIR", help="redraw DIR's summary and chart from its results.json")
    args = ap.parse_args()
    if args.replot:
        with open(os.path.join(args.replot, "results.json")) as f:
            report(json.load(f), args.replot)
        return
    device = torch.device(args.device)
    runs = (args.runs or ",".join(HF_RUNS if args.hf else DEFAULT_RUNS)).split(",")
    for r in runs:
        if r not in RUNS:
            ap.error(f"--runs: unknown run '{r}'; known: {', '.join(RUNS)}")
        if args.sinks and "hf" in RUNS[r]:
            ap.error(f"--sinks: the run '{r}' is a transformers Llama, which has no sinks; "
                     "--sinks applies to the other runs")

    train_docs, heldout_docs = load_documents()
    print(f"corpus: {len(train_docs)} training documents ({sum(map(len, train_docs))} bytes), "
          f"{len(heldout_docs)} held out ({sum(map(len, heldout_docs))} bytes)")
    train_batches = fixed_batches(train_docs, args.batch_tokens, args.steps, seed=args.seed)
    eval_batches = fixed_batches(heldout_docs, args.batch_tokens, args.eval_batches, seed=args.seed + 1)
    segs = [len(b[2]) - 1 for b in train_batches]
    print(f"{args.steps} batches of {args.batch_tokens} tokens, {min(segs)}..{max(segs)} documents each")

    results = {"args": vars(args), "runs": {}}
    for name in runs:
        results["runs"][name] = train_one(name, args, train_batches, eval_batches, device)
    report(results, args.out)


def smooth(xs, alpha=0.05):
    out, m = [], xs[0]
    for x in xs:
        m = (1 - alpha) * m + alpha * x
        out.append(m)
    return out


def report(results, out):
    """Gaps against the reference run, summary.md, results.json and curves.png under `out`."""
    ref = results["runs"].get("reference") or results["runs"].get("hf_reference")
    lines = ["| run | final train loss | mean of last 50 | held-out loss | max gap vs reference | "
             "mean gap | time |", "|---|---|---|---|---|---|---|"]
    for name, r in results["runs"].items():
        gap_max = gap_mean = float("nan")
        if ref is not None and r is not ref:
            gaps = [abs(a - b) for a, b in zip(r["train_loss"], ref["train_loss"])]
            gap_max, gap_mean = max(gaps), sum(gaps) / len(gaps)
            r["max_gap"], r["mean_gap"] = gap_max, gap_mean
        tail = r["train_loss"][-50:]
        lines.append(f"| {name} | {r['train_loss'][-1]:.4f} | {sum(tail) / len(tail):.4f} | "
                     f"{r['eval_loss']:.4f} | {gap_max:.4f} | {gap_mean:.4f} | {r['seconds']:.0f} s |")
    summary = "\n".join(lines) + "\n"
    print(summary)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(summary)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no curves.png")
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    for i, (name, r) in enumerate(results["runs"].items()):
        top.plot(smooth(r["train_loss"]), label=f"{name} (held-out {r['eval_loss']:.3f})", lw=1.2,
                 color=f"C{i}")
        if ref is not None and r is not ref:
            diff = [a - b for a, b in zip(r["train_loss"], ref["train_loss"])]
            bottom.plot(smooth(diff), label=name, lw=1.2, color=f"C{i}")
    top.set_ylabel("training loss, smoothed (nats/byte)")
    top.legend()
    bottom.axhline(0.0, color="gray", lw=0.8)
    bottom.set_ylabel("loss - reference's, smoothed")
    bottom.set_xlabel("step")
    if ref is not None:
        bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "curves.png"), dpi=110)


if __name__ == "__main__":
    main()

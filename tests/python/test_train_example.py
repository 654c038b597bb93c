"""The packed-training example runs, and on the CPU backend its loss curve with raggedattn equals
the reference attention's (fp32 math on both sides): the example is wired correctly end to end."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_packed")
sys.path.insert(0, os.path.abspath(EXAMPLE))


def run_example(tmp_path, *extra):
    """train.py's main on a tiny CPU configuration; its results.json's runs."""
    import json

    import train  # noqa: E402  (examples/train_packed/train.py)

    argv = ["train.py", "--device", "cpu", "--steps", "4", "--batch-tokens", "768",
            "--eval-batches", "1", "--dim", "128", "--layers", "1", "--heads", "2",
            "--kv-heads", "1", "--out", str(tmp_path), *extra]
    old = sys.argv
    sys.argv = argv
    try:
        train.main()
    finally:
        sys.argv = old
    return json.load(open(tmp_path / "results.json"))["runs"]


def test_cpu_training_matches_reference(tmp_path):
    res = run_example(tmp_path, "--runs", "reference,raggedattn")
    ref, rag = res["reference"], res["raggedattn"]
    assert len(rag["train_loss"]) == 4
    assert rag["train_loss"][-1] < rag["train_loss"][0] + 0.5  # it trains, no blow-up
    assert rag["max_gap"] < 1e-4, rag["max_gap"]
    assert abs(rag["eval_loss"] - ref["eval_loss"]) < 1e-4


def test_cpu_training_with_sinks_matches_reference(tmp_path):
    """--sinks: raggedattn's sinks follow the plain PyTorch sink attention step by step."""
    res = run_example(tmp_path, "--runs", "reference,raggedattn", "--sinks")
    ref, rag = res["reference"], res["raggedattn"]
    assert len(rag["train_loss"]) == 4
    assert rag["max_gap"] < 1e-4, rag["max_gap"]
    assert abs(rag["eval_loss"] - ref["eval_loss"]) < 1e-4


def test_sink_gradients_match_reference_model():
    """The example's decoder with sinks: every parameter's gradient, the sinks' included, through
    raggedattn and through the plain sink attention, on one packed batch (fp32, CPU)."""
    from data import VOCAB, Packer, load_documents
    from model import Decoder
    import torch.nn.functional as F

    toks, tgts, cu, max_len, pos = next(Packer(load_documents()[0], 512, seed=0))
    grads = {}
    for impl in ("raggedattn", "reference"):
        torch.manual_seed(0)
        model = Decoder(VOCAB, dim=128, layers=2, n_heads=2, n_kv_heads=1, impl=impl, sinks=True)
        with torch.no_grad():  # sinks away from their initial 0, different per head and layer
            for i, block in enumerate(model.blocks):
                block.attn.sinks.copy_(torch.tensor([1.0, -0.5]) * (i + 1))
        loss = F.cross_entropy(model(toks, pos, cu, max_len).float(), tgts, ignore_index=-100)
        loss.backward()
        grads[impl] = {n: p.grad for n, p in model.named_parameters()}
    sinks = [n for n in grads["reference"] if n.endswith("sinks")]
    assert len(sinks) == 2 and all(grads["reference"][n].abs().max() > 0 for n in sinks)
    for n, want in grads["reference"].items():
        torch.testing.assert_close(grads["raggedattn"][n], want, rtol=1e-4, atol=1e-6, msg=n)


def test_sink_attention_reference_is_softmax_with_an_extra_column():
    """The example's plain sink attention: a sink of -inf is SDPA; a finite one takes its share."""
    from model import reference_attention, reference_sink_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(9, h, 16, generator=g) for h in (4, 2, 2))
    cu = torch.tensor([0, 4, 9])
    plain = reference_attention(q, k, v, cu)
    none = reference_sink_attention(q, k, v, cu, torch.full((4,), float("-inf")))
    torch.testing.assert_close(none, plain, rtol=1e-5, atol=1e-6)
    # The first row of a document sees only itself: its output is v scaled by 1 / (1 + e^(s - m)).
    sinks = torch.tensor([0.0, 1.0, -1.0, 2.0])
    got = reference_sink_attention(q, k, v, cu, sinks)
    s0 = (q[0] * k[0].repeat_interleave(2, 0)).sum(-1) / 4.0
    share = torch.sigmoid(s0 - sinks)[:, None]
    torch.testing.assert_close(got[0], share * v[0].repeat_interleave(2, 0), rtol=1e-5, atol=1e-6)


def test_packing_keeps_documents_apart():
    from data import Packer, load_documents

    train_docs, heldout = load_documents()
    assert len(train_docs) > 50 and len(heldout) > 3
    toks, tgts, cu, max_len, pos = next(Packer(train_docs, 4096, seed=0))
    assert toks.shape == (4096,) and int(cu[-1]) == 4096 and int(cu[0]) == 0
    cu = cu.tolist()
    for a, b in zip(cu[:-1], cu[1:]):
        assert pos[a] == 0 and int(pos[b - 1]) == b - a - 1  # positions restart per document
        assert int(tgts[b - 1]) == -100  # no target across a document boundary
    assert max_len == max(b - a for a, b in zip(cu[:-1], cu[1:]))


def test_corrupt_dq_switch_breaks_only_later_documents():
    """The corruption experiment's switch leaves dQ of the first document alone and replaces every
    later document's dQ by the first document's rows (what a stride-0 scratch read returns)."""
    from model import _CorruptDq

    cu = torch.tensor([0, 3, 8, 9])
    q = torch.randn(9, 2, 4, requires_grad=True)
    g = torch.randn(9, 2, 4)
    _CorruptDq.apply(q, cu).backward(g)
    assert torch.equal(q.grad[:3], g[:3])
    assert torch.equal(q.grad[3:8], g[[0, 1, 2, 0, 1]])
    assert torch.equal(q.grad[8:], g[:1])
    assert not torch.equal(q.grad, g)


def test_hf_mode_matches_sdpa_on_cpu(tmp_path):
    """--hf: a transformers Llama trained through attn_implementation="raggedattn" follows the
    same model through transformers' sdpa, step by step (fp32 on the CPU backend)."""
    pytest.importorskip("transformers")
    res = run_example(tmp_path, "--hf")
    ref, rag = res["hf_reference"], res["hf_raggedattn"]
    assert len(rag["train_loss"]) == 4
    assert rag["max_gap"] < 1e-4, rag["max_gap"]
    assert abs(rag["eval_loss"] - ref["eval_loss"]) < 1e-4
